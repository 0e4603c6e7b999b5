"""The worker agent: one process per (simulated) host, running that host's tasks.

``xce-resize worker --state-dir DIR --host NAME`` (the live controller starts one per
host itself unless ``manage_workers = false``). It is a small Starlette application
served by uvicorn on an ephemeral loopback port, authenticated with the secret in
``DIR/workers/secret`` (created by the controller, mode 0600).

Why a separate process in its own session: task processes must outlive a controller
crash (docs/live-controller.md), so their supervisor cannot be the controller; a SIGKILL of the
controller's process group does not reach the agent or its tasks.

What it does, all idempotent per ``(job, task)`` because a restarted controller
resends what it is not sure about (docs/failover.md):

- ``launch``: start the task's command in a new session (``start_new_session``), its
  output appended to the job's log files; report ``started`` (or ``start_failed``).
  A task it knows already is never started again: its state is reported again.
- ``stop``: SIGTERM to the task's processes, SIGKILL at ``since + grace``; report
  ``exited`` only once none is left, so that the controller frees the slot only after
  the processes are gone. A task that is gone is reported again.
- ``notify``: run a resize notification command with ``/bin/sh -c`` and a timeout; its
  output goes to the job's log directory and into the ``notify_done`` event.
- ``forget``: drop what it remembers of an ended job's tasks.

A task whose process exits on its own is reported ``exited`` with its status; the rest
of its processes are stopped first.

**Who runs them**: every launch and notification names the account to run as (the
controller decided it at submission). The agent starts the process as that user, with
its groups, when it is root; it runs it as itself when the account is its own, and
refuses anything else (a start failure, a failed notification). As another user, the
working directory is entered by that user's shell (Popen would enter it as root, before
it changes user), and the logs written for the job are given to that user.

**A task's processes** are its process group and every descendant of a process known
to be the task's, including one that left the group or the session (``setsid``). The
agent is the child subreaper of its tasks (:func:`~.proc.become_subreaper`): a process
whose parent exits becomes the agent's child instead of init's, and is the task's when
the environment it was started with names the task (``XCE_JOB_ID``, ``XCE_TASK_ID``)
and it runs as the task's user. A tracker thread (:meth:`WorkerAgent.track`, every
:data:`TRACK_INTERVAL` seconds and when a task ends) remembers every task's processes,
so that one that later leaves the tree or clears its environment is still known; kills
the orphans it adopted that belong to no live task (a notification command's leftover,
a task's that cleared its environment in the instant before its parent exited); and
reaps the adopted ones that exited.

**A cgroup per task** where the agent can make them (:mod:`.cgroups`, ``[worker]
containment``): each task and notification command is placed in a cgroup of its own
before it runs anything (:data:`BARRIER`), stopped with ``cgroup.kill`` at the end of
its grace, and gone when its cgroup is empty; the ``/proc`` tracking above is then
only a record, and the way of an agent without cgroups.

The controller reads events with a long poll (``GET /v1/events?after=SEQ``) and takes a
consistent snapshot of the tasks with ``GET /v1/snapshot`` when it (re)connects.
Every call carries the controller's epoch; a call with an older epoch than one already
seen is refused (409 ``fenced``), so a controller that was replaced cannot start or
stop anything any more.

Files, under ``DIR/workers/HOST/``: ``lock`` (an exclusive ``flock`` held while the
agent runs: the controller's liveness test), ``worker.json`` (pid, port, instance id),
``tasks.json`` (live tasks with pid and start time). A new agent for the same host first
kills the tasks its dead predecessor left behind (``tasks.json``), before it accepts
any command: those tasks were already reported lost, and must not run alongside
their replacements. A batch's launches are written there as *intents* (job and task,
no pid yet) before any of them starts, so an agent killed between starting a process
and recording its pid leaves a trace: its successor finds such a task's processes by
the marks in their environment and kills them too. On a full filesystem the file
cannot be written: that is logged and the agent goes on (``_save``), so a successor
may then miss what the failed writes would have recorded.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from attrs import define, field

from xce_resize_plugin.controllers.live import cgroups, fd_limits
from xce_resize_plugin.controllers.live.cgroups import Containment, TaskCgroup
from xce_resize_plugin.controllers.live.proc import (
    OWN_JOB_DIR,
    SHARED_JOB_DIR,
    Account,
    ProcessTable,
    ProcInfo,
    environ_marks,
    exit_status,
    open_log,
    parse_account,
    run_as_options,
    signal_verified,
    start_ticks,
)
from xce_resize_plugin.controllers.runners import (
    NotificationRequest,
    NotificationResult,
    SubprocessNotificationRunner,
)

log = logging.getLogger(__name__)

#: Seconds a task's leftover processes get after its main process exited on its own.
CLEANUP_GRACE = 2.0
#: Events kept for a controller that reads late; older ones force it to resynchronise.
MAX_EVENTS = 10000
#: Characters of each stream of a notification's output that the agent reports (and
#: keeps, to report again): the log file, ``notify-N.log``, has up to ``max_output``.
#: A report travels in the agent's events (up to MAX_EVENTS kept) and into the job's
#: record, which the controller writes whole at each change: at 64 KiB a stream, a
#: job whose notification command writes much, resized often, made both hundreds of
#: megabytes (docs/live-controller.md, "Notification commands").
NOTIFY_OUTPUT_REPORTED = 4096
#: A job's most recent notification results the agent keeps to answer a command sent
#: again (a controller's failover re-sends only its latest change's).
NOTIFY_RESULTS_KEPT = 8
#: Longest a long poll may wait (seconds).
MAX_POLL = 10.0
#: Seconds between two passes of the process tracker (:meth:`WorkerAgent.track`).
TRACK_INTERVAL = 0.5
#: How often a task that is ending is checked for processes left (seconds).
EXIT_POLL = 0.01
#: The environment variables that tie an adopted orphan to its task, and the host the
#: task was launched for: every agent of a machine sees all its processes, and a task
#: of the same job and id may run under another host's agent (a requeued job).
MARKS = ("XCE_JOB_ID", "XCE_TASK_ID", "XCE_HOSTNAME")
#: What starts a task that runs as another user: change to its working directory as
#: that user, then become its command (status 126 when the directory cannot be entered).
SHELL = "/bin/sh"
CD_EXEC = 'cd -- "$1" || exit 126; shift; exec "$@"'
#: What starts every process of a job when the agent raised its own limit of open
#: files (:func:`~.fd_limits.raise_nofile`): the soft limit it had before, set in the
#: child before it becomes the command, never in the agent (which needs the raised one).
LIMITS_EXEC = 'ulimit -Sn "$1" || exit 126; shift; exec "$@"'
#: What holds a process that goes into a cgroup until the agent has placed it there:
#: Popen changes user before it could run anything of ours, so the child blocks on its
#: standard input, a pipe, until the agent writes a line to it (then becomes its
#: command, with ``/dev/null`` as its input); an agent that dies first closes the pipe,
#: and the child exits with 126 before it ran anything (docs/live-controller.md,
#: "Process containment").
BARRIER = "read -r _ || exit 126"
#: What a thread that cannot start raises: no thread left to the process (its pids
#: budget, which its tasks share), or no memory for its stack.
NO_THREAD = (RuntimeError, MemoryError)


def worker_dir(state_dir: Path, host: str) -> Path:
    return state_dir / "workers" / host


def secret_path(state_dir: Path) -> Path:
    return state_dir / "workers" / "secret"


class Fenced(Exception):
    """A call carried an older epoch than one already seen."""


@define
class TaskProc:
    """One task as the agent knows it. ``state``: running, stopping, exited, failed."""

    job: str
    task: int
    state: str
    pid: int | None = None
    ticks: int | None = None
    popen: subprocess.Popen[bytes] | None = None
    status: int | None = None
    reason: str = ""
    kill_at: float | None = None
    killed: bool = False
    timer: threading.Timer | None = None
    #: Every process known to be the task's: pid -> start ticks (the leader included).
    members: dict[int, int] = field(factory=dict)
    #: The user its processes run as (an adopted orphan of another user is not its).
    uid: int | None = None
    #: The run of the job it belongs to, as its launch named it (``None``: not named).
    run: str | None = None
    #: ``time.monotonic()`` once its process was started: a scan of ``/proc`` begun
    #: before (:attr:`~.proc.ProcessTable.taken`) does not show it.
    launched: float = 0.0
    #: Its cgroup (``None``: contained by the ``/proc`` tracking alone).
    cgroup: TaskCgroup | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "job": self.job,
            "task": self.task,
            "state": self.state,
            "pid": self.pid,
            "status": self.status,
            "reason": self.reason,
            # The controller tells an earlier run's task from its own (agents.py).
            "run": self.run,
        }


#: The states of a task whose process is gone (for good: a task id is launched once a run).
ENDED = ("exited", "failed")


def same_run(ours: object, theirs: object) -> bool:
    """Whether two launches of a task id are of one run of the job (``run`` of a launch
    command, or of a task the agent reports): unless both name a run and the runs
    differ. One that names none (an older agent or controller) counts as the same, as
    before runs were named. The agent's launch and the controller's reconciliation
    (``agents.py``) judge by this rule alike."""
    return ours is None or theirs is None or str(ours) == str(theirs)


def make_job_dir(path: Path, owner: Account | None) -> None:
    """The directory of a job's logs, made if missing (with ``jobs/`` above it) with
    the controller's modes (:data:`SHARED_JOB_DIR` when the job runs as another user:
    ``owner``; :data:`OWN_JOB_DIR` otherwise), not the umask's ``0755``. One that
    exists is the controller's, left as it is."""
    own = OWN_JOB_DIR if owner is None else SHARED_JOB_DIR
    for directory, mode in ((path.parent, SHARED_JOB_DIR), (path, own)):
        if directory.is_dir():
            continue
        directory.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileExistsError):
            directory.mkdir(mode=mode)
            os.chmod(directory, mode)  # the umask took bits of it


def _subdirs(path: Path) -> list[Path]:
    """The directories in ``path`` (none when it is gone)."""
    try:
        return sorted(p for p in path.iterdir() if p.is_dir())
    except OSError:
        return []


def _reported(text: str) -> str:
    """A notification's output stream as reported (:data:`NOTIFY_OUTPUT_REPORTED`)."""
    if len(text) <= NOTIFY_OUTPUT_REPORTED:
        return text
    return text[:NOTIFY_OUTPUT_REPORTED] + "\n[output truncated: notify-N.log has more]\n"


class WorkerAgent:
    """The agent's state and actions; the HTTP layer calls these
    (:func:`~.worker_server.make_app`)."""

    def __init__(
        self,
        host: str,
        state_dir: Path,
        max_output: int = 65536,
        containment: Containment | None = None,
    ) -> None:
        self.host = host
        #: The host's cgroup subtree: each task and notification in a cgroup of its own
        #: (``None``: the ``/proc`` tracking alone, docs/live-controller.md).
        self.cgroups = containment
        self.state_dir = state_dir
        self.dir = worker_dir(state_dir, host)
        self.instance = uuid.uuid4().hex
        #: The tasks, notifications and the tracker's records. Never held during a scan of
        #: ``/proc`` (which any user can make last seconds: docs/performance.md, "The
        #: worker agent and many processes"), and never needed by the controller's long
        #: poll or snapshot, which take only ``_cond``.
        self._lock = threading.Lock()
        #: The events, the epoch and the published snapshot (taken inside ``_lock`` when
        #: both are held, never the other way round).
        self._cond = threading.Condition(threading.Lock())
        #: The tasks as of the last change, for :meth:`snapshot` (see :meth:`_publish`).
        self._published: dict[str, Any] = {"seq": 0, "tasks": []}
        #: The newest scan of ``/proc`` (:meth:`_scan`), shared by whoever needs one.
        self._scan_lock = threading.Lock()
        self._last_scan: ProcessTable | None = None
        self.tasks: dict[tuple[str, int], TaskProc] = {}
        self.notifications: dict[tuple[str, int], dict[str, Any] | None] = {}
        #: The notification commands running, by (job, attempt): a job's end stops them.
        self._notifying: dict[tuple[str, int], subprocess.Popen[bytes]] = {}
        self.events: list[dict[str, Any]] = []
        self.seq = 0
        self.max_epoch = 0
        self.closing = False
        self.max_output = max_output
        #: Whether this process adopts its tasks' orphans (set by
        #: :func:`~.worker_server.serve`); only then does the tracker kill and reap the
        #: children it did not start.
        self.subreaper = False
        #: The children this agent started (tasks, notification commands), until reaped:
        #: taken under ``spawn_lock``, which the tracker holds while it judges adopted
        #: children, so that a child just started is never mistaken for an orphan.
        self.spawn_lock = threading.Lock()
        self._spawned: dict[int, subprocess.Popen[bytes]] = {}
        #: (pid, start ticks) -> the (job, task) its environment names, or None.
        self._marks: dict[tuple[int, int], tuple[str, str] | None] = {}
        #: The cgroups of the notification commands running, by (job, attempt).
        self._notify_cgroups: dict[tuple[str, int], TaskCgroup] = {}
        #: Ended cgroups that could not be removed yet (a process stuck in the kernel).
        self._stale_cgroups: list[TaskCgroup] = []

    # -- lifecycle ---------------------------------------------------------------------

    def kill_orphans(self) -> int:
        """Kill the live tasks a dead predecessor left (see the module docstring): each
        task's process group, its descendants, and the processes recorded as its; first,
        every cgroup it left (:meth:`_kill_cgroup_orphans`)."""
        self._kill_cgroup_orphans()
        try:
            entries = json.loads((self.dir / "tasks.json").read_text())
        except (OSError, ValueError):
            return 0
        table = ProcessTable()
        leaders: list[int] = []
        groups: list[int] = []
        roots: list[int] = []
        entries = [e for e in entries if isinstance(e, dict)] if isinstance(entries, list) else []
        intents = {(str(e.get("job")), str(e.get("task"))) for e in entries if e.get("pid") is None}
        if intents:
            roots += [
                p.pid
                for p in table.procs.values()
                if not p.zombie and self._task_of(p.pid, p.ticks) in intents
            ]
            leaders += roots
        for entry in entries:
            pid, ticks = entry.get("pid"), entry.get("ticks")
            ticks = ticks if isinstance(ticks, int) else None
            if isinstance(pid, int) and pid > 1:
                leaders.append(pid)
                if ticks is not None and table.alive(pid, ticks):
                    # Its live leader holds the group's id: the group is the task's.
                    roots += [pid, *table.group(pid)]
                    groups.append(pid)
                else:
                    # The leader is gone (its new parent reaped it): its pid, the
                    # group's id, may be another process's now, leading a group of its
                    # own. Only members that the task's marks name are the task's.
                    task = (str(entry.get("job")), str(entry.get("task")))
                    roots += [
                        m
                        for m in table.group(pid)
                        if self._task_of(m, table.procs[m].ticks) == task
                    ]
            for member in entry.get("members", []):
                if isinstance(member, list) and len(member) == 2 and table.alive(*member):
                    roots.append(member[0])
        victims = table.tree(roots)
        for pid, ticks in victims.items():
            signal_verified(pid, ticks, signal.SIGKILL)
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline:
            table = ProcessTable()
            if not any(table.alive(pid, ticks) for pid, ticks in victims.items()) and not any(
                table.group(pid) for pid in groups
            ):
                break
            time.sleep(0.01)
        self._save()
        if leaders:
            log.warning(
                "killed %d task(s) left by a previous agent for %s", len(leaders), self.host
            )
        return len(leaders)

    def _kill_cgroup_orphans(self) -> None:
        """Kill and remove the cgroups a dead predecessor left (of its tasks and its
        notification commands): in this agent's subtree, and in the subtrees the
        predecessor recorded (it may have run in another cgroup: another service).
        ``cgroup.kill`` takes every process of a cgroup at once, comets included. Then
        this agent's subtrees are recorded for its own successor."""
        record = self.dir / cgroups.RECORD
        ours = self.cgroups.trees() if self.cgroups is not None else []
        theirs = cgroups.recorded(record, cgroups.cgroup_mounts())
        found: set[str] = set()  # by name: a cgroup may be in a v1 pids tree too
        left: list[Path] = []
        for tree in dict.fromkeys([*ours, *theirs]):  # each v2 tree before its v1 one
            children = _subdirs(tree)
            found |= {child.name for child in children}
            for child in children:
                left += cgroups.remove_tree(child)
            if tree not in ours:
                left += cgroups.remove_tree(tree)
                with contextlib.suppress(OSError):
                    os.rmdir(tree.parent)
        if found:
            log.warning("killed what %d cgroup(s) of a previous agent held", len(found))
        if left:
            log.error("cannot remove the cgroups %s: processes survive cgroup.kill", left)
        if self.cgroups is not None:
            self.cgroups.record(record)
        elif not left:
            record.unlink(missing_ok=True)

    def shutdown(self, grace: float = 2.0) -> None:
        """A clean stop of the agent: its tasks are stopped (SIGTERM, ``grace``, SIGKILL),
        and its cgroups removed."""
        with self._cond:
            self.closing = True
            self._cond.notify_all()
        table = None if self.cgroups is not None else self._scan(time.monotonic())
        with self._lock:
            live = [t for t in self.tasks.values() if t.state in ("running", "stopping")]
            for t in live:
                self._signal_task(t, signal.SIGTERM, table)
        deadline = time.monotonic() + grace
        for t in live:
            while self._task_alive(t) and time.monotonic() < deadline:
                time.sleep(0.02)
            if t.cgroup is not None:
                t.cgroup.kill()
                continue
            table = self._scan(time.monotonic())
            with self._lock:
                self._signal_task(t, signal.SIGKILL, table)
        if self.cgroups is not None:
            # Whatever is left in them (notification commands too) is killed first.
            self.cgroups.close()

    # -- processes ---------------------------------------------------------------------

    def spawn(
        self, argv: list[str], cgroup: TaskCgroup | None = None, **options: Any
    ) -> subprocess.Popen[bytes]:
        """Start a child (a task, a notification command) and remember it until it is
        reaped: the tracker never takes the agent's own children for adopted orphans.

        With ``cgroup``, the child is placed there before it runs anything of its own
        (:data:`BARRIER`; its input is ``/dev/null``); one that cannot be placed is
        killed, and an ``OSError`` names the cgroup: nothing runs uncontained."""
        soft = fd_limits.nofile_before_raise()
        if cgroup is None:
            if soft is not None:
                argv = [SHELL, "-c", LIMITS_EXEC, "xce-limits", str(soft), *argv]
            return self._popen(argv, options)
        limits = "" if soft is None else 'ulimit -Sn "$1" || exit 126; shift; '
        script = f'{BARRIER}; {limits}exec "$@" </dev/null'
        argv = [SHELL, "-c", script, "xce-start", *([] if soft is None else [str(soft)]), *argv]
        held, release = os.pipe()
        try:
            proc = self._popen(argv, {**options, "stdin": held})
        except BaseException:
            os.close(release)
            raise
        finally:
            os.close(held)
        try:
            cgroup.place(proc.pid)
        except OSError as exc:
            os.close(release)
            proc.kill()
            proc.wait()
            raise OSError(f"cannot place it in its cgroup {cgroup.path}: {exc}") from exc
        with contextlib.suppress(OSError):
            os.write(release, b"\n")
        os.close(release)
        return proc

    def _popen(self, argv: list[str], options: dict[str, Any]) -> subprocess.Popen[bytes]:
        with self.spawn_lock:
            proc = subprocess.Popen(argv, **options)
            self._spawned[proc.pid] = proc
        return proc

    def _task_of(self, pid: int, ticks: int) -> tuple[str, str] | None:
        """The (job, task) a process's environment names, when it was launched for this
        agent's host (read once per process). Another host's task of the same job and
        id is not ours: an agent restarted after a crash killed it by its intent."""
        key = (pid, ticks)
        if key not in self._marks:
            marks = environ_marks(pid, MARKS)
            named = (marks.get(MARKS[0], ""), marks.get(MARKS[1], ""))
            ours = marks.get(MARKS[2]) == self.host
            self._marks[key] = named if all(named) and ours else None
        return self._marks[key]

    def _scan(self, after: float) -> ProcessTable:
        """A scan of ``/proc`` begun at ``after`` (``time.monotonic()``) or later, shared:
        callers that ask while one is being taken wait for it, or for the next one, and
        take that, so tasks ending together cost a scan or two, not one each. Never
        called with ``_lock`` held (see ``__init__``)."""
        with self._scan_lock:
            table = self._last_scan
            if table is None or table.taken < after:
                table = self._last_scan = ProcessTable()
            return table

    def _adopted(self, table: ProcessTable) -> dict[tuple[str, str], list[ProcInfo]]:
        """The live children of this agent it did not necessarily start (as subreaper,
        its tasks' orphans) by the (job, task) their environment names: one walk of
        the agent's children, not of every process, shared by all tasks."""
        out: dict[tuple[str, str], list[ProcInfo]] = {}
        for pid in table.children.get(os.getpid(), ()):
            p = table.procs[pid]
            task = None if p.zombie else self._task_of(p.pid, p.ticks)
            if task is not None:
                out.setdefault(task, []).append(p)
        return out

    def _members(
        self,
        t: TaskProc,
        table: ProcessTable,
        adopted: dict[tuple[str, str], list[ProcInfo]] | None = None,
    ) -> dict[int, int]:
        """The live processes of task ``t`` (see the module docstring), in what the
        task has, through the table's indexes (``adopted``: :meth:`_adopted`)."""
        roots = [pid for pid, ticks in t.members.items() if table.alive(pid, ticks)]
        if t.pid is not None:
            if table.alive(t.pid, t.ticks):
                roots.append(t.pid)
            roots += table.group(t.pid)
        adopted = self._adopted(table) if adopted is None else adopted
        for p in adopted.get((t.job, str(t.task)), ()):
            if t.uid is None or p.uid == t.uid:
                roots.append(p.pid)
        return table.tree(roots)

    def _signal_task(self, t: TaskProc, sig: int, table: ProcessTable | None) -> bool:
        """Send ``sig`` to every process of the task: those in its cgroup, or else
        those that ``table`` shows (taken before ``_lock``: a process is signalled only
        while its start time is the one seen, :func:`~.proc.signal_verified`); whether
        there was any."""
        if t.cgroup is not None:
            return t.cgroup.signal(sig)
        assert table is not None, "a task without a cgroup is found in a scan"
        if t.launched >= table.taken:
            return self._signal_new(t, sig)
        t.members = self._members(t, table)
        sent = False
        for pid, ticks in t.members.items():
            sent = signal_verified(pid, ticks, sig) or sent
        return sent

    def _signal_new(self, t: TaskProc, sig: int) -> bool:
        """Signal a task started after the scan at hand (launched earlier in the same
        batch, ``_lock`` held since): its process group, by its leader's pid. The leader
        is this agent's child and nothing reaps it meanwhile (its supervisor waits for
        ``_lock``), so that pid is still the group's. What left the group in those
        microseconds is the tracker's, at its next pass."""
        if t.pid is None or t.popen is None or t.popen.returncode is not None:
            return False
        try:
            os.killpg(t.pid, sig)
        except (ProcessLookupError, PermissionError):
            return False
        return True

    def _contained(self, pid: int) -> bool:
        """Whether process ``pid`` is in one of this agent's cgroups."""
        if self.cgroups is None:
            return False
        try:
            return self.cgroups.holds(Path(f"/proc/{pid}/cgroup").read_text())
        except OSError:
            return False

    def _task_alive(self, t: TaskProc) -> bool:
        if t.cgroup is not None:
            return t.cgroup.populated()
        table = self._scan(time.monotonic())
        with self._lock:
            t.members = self._members(t, table)
            return bool(t.members)

    def start_tracker(self) -> None:
        """Run :meth:`track` every :data:`TRACK_INTERVAL` seconds until the agent closes."""

        def loop() -> None:
            while True:
                with self._cond:
                    if self._cond.wait_for(lambda: self.closing, TRACK_INTERVAL):
                        return
                try:
                    self.track()
                except Exception:  # pragma: no cover - logged, the tracker goes on
                    log.exception("process tracker")

        threading.Thread(target=loop, name="tracker", daemon=True).start()

    def track(self) -> None:
        """Remember every live task's processes, and (as a subreaper) kill the adopted
        orphans that belong to no live task and reap those that exited.

        The scan is taken before the locks and judged under them: a process started
        after it is not in it (a task launched since is judged at the next pass), one
        the agent started during it is in ``_spawned`` by the time ``spawn_lock`` is
        held, and every pid is signalled only if its start time is the one seen."""
        table = self._scan(time.monotonic())
        adopted = self._adopted(table)  # reads new orphans' environments, outside the locks
        with self._lock, self.spawn_lock:
            claimed: set[int] = set()
            changed = False
            for t in self.tasks.values():
                if t.state not in ("running", "stopping"):
                    continue
                if t.cgroup is not None:
                    # Its cgroup holds them; recorded for a successor all the same.
                    members = {
                        p: table.procs[p].ticks for p in t.cgroup.pids_in() if table.alive(p)
                    }
                    changed = changed or members.keys() != t.members.keys()
                    t.members = members
                elif t.launched >= table.taken:
                    claimed |= t.members.keys()
                elif t.pid is not None:
                    members = self._members(t, table, adopted)
                    changed = changed or members.keys() != t.members.keys()
                    t.members = members
                    claimed |= members.keys()
            if changed:
                self._save()
            self._marks = {k: v for k, v in self._marks.items() if table.alive(*k)}
            if self.subreaper:
                self._collect(table, claimed)
            self._stale_cgroups = [c for c in self._stale_cgroups if not c.remove()]

    def _collect(self, table: ProcessTable, claimed: set[int]) -> None:
        """Adopted children (``spawn_lock`` held): reap the exited, kill the unclaimed."""
        self._spawned = {pid: p for pid, p in self._spawned.items() if p.returncode is None}
        for pid in table.children.get(os.getpid(), ()):
            p = table.procs[pid]
            if p.pid in self._spawned or p.pid in claimed:
                continue
            if p.zombie:
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(p.pid, os.WNOHANG)
                continue
            if self._contained(p.pid):
                continue  # its cgroup's task or notification stops it
            victims = {k: v for k, v in table.tree([p.pid]).items() if k not in claimed}
            for pid, ticks in victims.items():
                signal_verified(pid, ticks, signal.SIGKILL)
            log.warning("killed %s: adopted, of no live task", sorted(victims))

    # -- calls -------------------------------------------------------------------------

    def _check_epoch(self, epoch: int) -> None:
        if epoch < self.max_epoch:
            raise Fenced(f"epoch {epoch} is older than {self.max_epoch}")
        self.max_epoch = epoch

    def snapshot(self, epoch: int) -> dict[str, Any]:
        """The tasks and the sequence number of the last event they reflect, as of the
        last change (:meth:`_publish`): without ``_lock``, so never behind a batch."""
        with self._cond:
            self._check_epoch(epoch)
            return {"host": self.host, "instance": self.instance, "pid": os.getpid()} | (
                self._published
            )

    def _publish(self) -> None:
        """Make the tasks as they are now (``_lock`` held) what :meth:`snapshot`
        answers, with the events' sequence number: a controller that takes it and then
        reads the events after it misses nothing and sees no change twice."""
        tasks = [t.to_json() for t in self.tasks.values()]
        with self._cond:
            self._published = {"seq": self.seq, "tasks": tasks}

    def wait_events(self, after: int, timeout: float, epoch: int) -> dict[str, Any]:
        with self._cond:
            self._check_epoch(epoch)
            self._cond.wait_for(lambda: self.seq > after or self.closing, min(timeout, MAX_POLL))
            first = self.events[0]["seq"] if self.events else self.seq + 1
            if after + 1 < first:
                # Events the caller has not seen were dropped: it must take a snapshot.
                return {"instance": self.instance, "resync": True, "events": [], "seq": self.seq}
            events = [e for e in self.events if e["seq"] > after]
            return {"instance": self.instance, "events": events, "seq": self.seq}

    def execute(self, epoch: int, instance: str, commands: list[Mapping[str, Any]]) -> None:
        # One scan for the batch's stops, before the lock (see ``__init__``); none when
        # every task is in a cgroup.
        stops = any(cmd.get("op") == "stop" for cmd in commands)
        table = self._scan(time.monotonic()) if stops and self.cgroups is None else None
        with self._lock:
            with self._cond:
                self._check_epoch(epoch)
            if instance != self.instance:
                raise LookupError(f"commands for agent {instance}, this is {self.instance}")
            intents = [
                (str(cmd["job"]), int(cmd["task"]))
                for cmd in commands
                if cmd.get("op") == "launch"
                and (str(cmd["job"]), int(cmd["task"])) not in self.tasks
            ]
            if intents:
                self._save(intents)  # before any process exists: see the module docstring
            for cmd in commands:
                op = cmd.get("op")
                if op == "launch":
                    self._launch(cmd)
                elif op == "stop":
                    self._stop(cmd, table)
                elif op == "notify":
                    self._notify(cmd)
                elif op == "forget" and cmd.get("tasks") is not None:
                    self._forget_tasks(str(cmd["job"]), cmd["tasks"])
                elif op == "forget":
                    self._forget(str(cmd["job"]))
                else:
                    raise ValueError(f"unknown command {op!r}")
            self._save()
            self._publish()

    # -- under the lock ------------------------------------------------------------------

    def _emit(self, kind: str, **fields: Any) -> None:
        with self._cond:
            self.seq += 1
            self.events.append({"seq": self.seq, "kind": kind, **fields})
            if len(self.events) > MAX_EVENTS:
                del self.events[: len(self.events) - MAX_EVENTS]
            self._cond.notify_all()

    def _report(self, t: TaskProc) -> None:
        """Report a known task's state again (a repeated launch or stop)."""
        if t.state == "failed":
            self._emit("start_failed", job=t.job, task=t.task, reason=t.reason)
            return
        self._emit("started", job=t.job, task=t.task, pid=t.pid)
        if t.state == "exited":
            self._emit("exited", job=t.job, task=t.task, status=t.status, reason=t.reason)

    def _launch(self, cmd: Mapping[str, Any]) -> None:
        key = (str(cmd["job"]), int(cmd["task"]))
        known = self.tasks.get(key)
        run = None if cmd.get("run") is None else str(cmd["run"])
        if known is not None and same_run(known.run, run):
            self._report(known)  # the same launch sent again
            return
        if known is not None and known.state not in ENDED:
            # The job ran here before it was requeued, and that run's task still runs:
            # the new one must not run beside it (the controller stops the old run's
            # tasks before the requeue, so this is a process that outlived its stop).
            self._emit(
                "start_failed",
                job=key[0],
                task=key[1],
                reason="a task of the job's earlier run still runs here",
            )
            return
        # Unknown, or ended in an earlier run of the job: a new task (a requeued job
        # starts again from task 0; the forget that followed the requeue may have been
        # lost with the host, and the old task would be reported instead of started).
        t = TaskProc(key[0], key[1], "running", run=run)
        try:
            account = parse_account(cmd.get("user"))
            run_as = run_as_options(account)
            owner = account if run_as else None
            argv, cwd = [str(a) for a in cmd["argv"]], str(cmd["cwd"])
            if run_as:
                # Popen changes directory before it changes user: as root, it would give
                # the task a directory its owner may not enter. The owner's shell does it.
                argv, cwd = [SHELL, "-c", CD_EXEC, "xce-task", cwd, *argv], "/"
            make_job_dir(Path(cmd["stdout"]).parent, owner)
            if self.cgroups is not None:
                t.cgroup = self.cgroups.create(cgroups.leaf_name(t.job, f"task{t.task}"))
            with open_log(cmd["stdout"], owner) as out, open_log(cmd["stderr"], owner) as err:
                t.popen = self.spawn(
                    argv,
                    cgroup=t.cgroup,
                    cwd=cwd,
                    env={str(k): str(v) for k, v in cmd["env"].items()},
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=err,
                    close_fds=True,
                    start_new_session=True,
                    **run_as,
                )
            t.uid = account.uid
        except (OSError, ValueError, subprocess.SubprocessError) as exc:
            t.state, t.reason = "failed", f"cannot start: {exc}"
            if t.cgroup is not None:
                t.cgroup.remove()  # empty: its process, if any, was killed
                t.cgroup = None
            self.tasks[key] = t
            self._emit("start_failed", job=t.job, task=t.task, reason=t.reason)
            return
        t.pid, t.launched = t.popen.pid, time.monotonic()
        t.ticks = start_ticks(t.pid)
        if t.ticks is not None:
            t.members = {t.pid: t.ticks}
        self.tasks[key] = t
        try:
            threading.Thread(
                target=self._supervise, args=(t,), name=f"task-{t.job}.{t.task}", daemon=True
            ).start()
        except NO_THREAD as exc:
            self._unsupervised(t, exc)
            return
        self._emit("started", job=t.job, task=t.task, pid=t.pid)

    def _unsupervised(self, t: TaskProc, exc: BaseException) -> None:
        """A task whose supervisor thread cannot start: nothing would report its end, so
        it does not run (its group killed: the leader is this agent's unreaped child),
        and its launch fails; the rest of the batch goes on."""
        assert t.popen is not None and t.pid is not None
        if t.cgroup is not None:
            t.cgroup.kill()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(t.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            t.popen.wait(timeout=5.0)
        if t.cgroup is not None and cgroups.wait_empty(t.cgroup.path, cgroups.KILL_WAIT):
            t.cgroup.remove()
        t.state, t.reason, t.popen, t.members = "failed", f"cannot start: {exc}", None, {}
        self._emit("start_failed", job=t.job, task=t.task, reason=t.reason)

    def _stop(self, cmd: Mapping[str, Any], table: ProcessTable | None) -> None:
        key = (str(cmd["job"]), int(cmd["task"]))
        t = self.tasks.get(key)
        if t is None:
            # Never launched here (or forgotten): nothing runs under this id.
            self._emit("exited", job=key[0], task=key[1], status=None, reason="no such task")
            return
        if t.state in ENDED:
            self._report(t)
            return
        if t.state == "stopping":
            return  # its exit will be reported
        grace = max(0.0, float(cmd.get("grace", 0.0)))
        since = cmd.get("since")
        start = float(since) if isinstance(since, int | float) else time.time()
        t.state = "stopping"
        t.kill_at = start + grace
        self._signal_task(t, signal.SIGTERM, table)
        delay = t.kill_at - time.time()
        if delay <= 0:
            self._kill(t, table)
        else:
            t.timer = threading.Timer(delay, self._kill_locked, (t,))
            t.timer.daemon = True
            try:
                t.timer.start()
            except NO_THREAD as exc:
                # Nothing would end its grace: it is killed now rather than never.
                log.warning("task %s.%s: no timer for its grace (%s): killed", t.job, t.task, exc)
                t.timer = None
                self._kill(t, table)

    def _kill_locked(self, t: TaskProc) -> None:
        table = None if t.cgroup is not None else self._scan(time.monotonic())
        with self._lock:
            if t.state == "stopping":
                self._kill(t, table)

    def _kill(self, t: TaskProc, table: ProcessTable | None) -> None:
        if t.cgroup is not None:
            t.cgroup.kill()  # all at once, whatever they fork meanwhile
            t.killed = True
        elif self._signal_task(t, signal.SIGKILL, table):
            t.killed = True

    def _supervise(self, t: TaskProc) -> None:
        """Wait for the task's main process, then for the rest of its processes."""
        assert t.popen is not None and t.pid is not None
        # The leader's exit, without reaping it: until it is reaped below, its zombie
        # keeps its pid, the id of the task's process group. Reaped now, that pid could
        # go to a new process (another job's task) whose group :meth:`_members` would
        # take for this task's while the task's leftovers are being stopped.
        with contextlib.suppress(ChildProcessError):
            os.waitid(os.P_PID, t.pid, os.WEXITED | os.WNOWAIT)
        if t.cgroup is not None:
            self._drain(t, t.cgroup)
        else:
            self._wait_members(t)
        if self.subreaper:
            # Orphans that belong to no live task go now, not at the next pass; whatever
            # that raises, the task's end is still reported (its job would never end).
            try:
                self.track()
            except Exception:
                log.exception("process tracker, after task %s.%s ended", t.job, t.task)
        returncode = t.popen.wait()
        if t.cgroup is not None:
            self._remove_cgroup(t.cgroup)
        with self._lock:
            if t.timer is not None:
                t.timer.cancel()
            status, reason = exit_status(returncode)
            if t.killed and returncode == -signal.SIGKILL:
                reason = "SIGKILL after grace"
            t.state, t.status, t.reason = "exited", status, reason
            t.popen = None
            self._emit("exited", job=t.job, task=t.task, status=status, reason=reason)
            self._save()
            self._publish()

    def _drain(self, t: TaskProc, cgroup: TaskCgroup) -> None:
        """Wait until the task's cgroup holds no process (``cgroup.events``): after
        SIGTERM, and ``cgroup.kill`` at the end of its grace (:data:`CLEANUP_GRACE`
        when its main process exited on its own). No scan of ``/proc``: what its
        processes fork, however fast, is in the cgroup too."""
        with self._lock:
            if t.state == "running":
                t.kill_at = time.time() + CLEANUP_GRACE
                cgroup.signal(signal.SIGTERM)
        while cgroup.populated():
            with self._lock:
                if t.kill_at is not None and time.time() >= t.kill_at and not t.killed:
                    self._kill(t, None)
            end = time.time() + 0.5 if t.kill_at is None else t.kill_at
            if t.killed:
                end += cgroups.KILL_WAIT
                if time.time() > end:
                    log.error(
                        "task %s.%s: processes survive cgroup.kill in %s; reporting it gone",
                        t.job,
                        t.task,
                        cgroup.path,
                    )
                    return
            # Woken by the cgroup's emptying; at least every 0.5 s for a stop's news.
            cgroups.wait_empty(cgroup.path, min(0.5, max(EXIT_POLL, end - time.time())))

    def _remove_cgroup(self, cgroup: TaskCgroup) -> None:
        """Remove an ended task's or notification's cgroup; one that still holds a
        process (stuck in the kernel) is tried again by the tracker."""
        if not cgroup.remove():
            with self._lock:
                self._stale_cgroups.append(cgroup)

    def _wait_members(self, t: TaskProc) -> None:
        """Wait until the ``/proc`` tracking finds none of the task's processes left:
        after SIGTERM, and SIGKILL at the end of its grace."""
        table = self._scan(time.monotonic())
        with self._lock:
            if t.state == "running":
                # Exited on its own: give its leftovers a short grace.
                t.kill_at = time.time() + CLEANUP_GRACE
                self._signal_task(t, signal.SIGTERM, table)
        while True:
            table = self._scan(time.monotonic())
            with self._lock:
                t.members = self._members(t, table)
                if not t.members:
                    break
                if t.kill_at is not None and time.time() >= t.kill_at and not t.killed:
                    self._kill(t, table)
            if t.killed and t.kill_at is not None and time.time() > t.kill_at + 5.0:
                log.error("task %s.%s: processes survive SIGKILL; reporting it gone", t.job, t.task)
                break
            # No more often than a scan lasts: at least half of a core stays free for
            # the rest of the agent when the host runs thousands of processes.
            time.sleep(max(EXIT_POLL, table.took))

    def _notify(self, cmd: Mapping[str, Any]) -> None:
        key = (str(cmd["job"]), int(cmd["attempt"]))
        if key in self.notifications:
            done = self.notifications[key]
            if done is not None:
                self._emit("notify_done", **done)
            return  # running: its result will be reported
        self.notifications[key] = None
        request = NotificationRequest(
            key[0],
            key[1],
            self.host,
            str(cmd["command"]),
            {str(k): str(v) for k, v in cmd["env"].items()},
            float(cmd["timeout"]),
            Path(cmd["cwd"]),
        )
        log_path = Path(cmd["log"])
        user = cmd.get("user")
        with contextlib.suppress(OSError, ValueError):
            # Before the command's runner makes its working directory (often the job's
            # directory) with the umask's mode.
            account = parse_account(user)
            make_job_dir(log_path.parent, account if account.uid != os.geteuid() else None)

        def run() -> None:
            try:
                account = parse_account(user)
                run_as = run_as_options(account)
            except (ValueError, PermissionError) as exc:
                self._notified(key, log_path, None, NotificationResult(None, f"cannot run: {exc}"))
                return
            owner = account if run_as else None

            def started(argv: list[str], **options: Any) -> subprocess.Popen[bytes]:
                return self._notify_spawn(key, argv, **run_as, **options)

            def finished(result: NotificationResult) -> None:
                self._sweep_notification(key)  # what it left behind, before its result
                self._notified(key, log_path, owner, result)

            runner = SubprocessNotificationRunner(self.max_output, popen=started)
            runner.run(request, finished)

        try:
            threading.Thread(target=run, name=f"notify-{key[0]}.{key[1]}", daemon=True).start()
        except NO_THREAD as exc:
            # Reported, not left running for ever: the job's change waits for its result.
            result = NotificationResult(None, f"cannot run: {exc}")
            self._record_notified(key, self._notify_result(key, log_path, None, result))

    def _notify_spawn(
        self, key: tuple[str, int], argv: list[str], **options: Any
    ) -> subprocess.Popen[bytes]:
        """Start a notification command, in a cgroup of its own when the agent has them."""
        cgroup = None
        if self.cgroups is not None:
            cgroup = self.cgroups.create(cgroups.leaf_name(key[0], f"notify{key[1]}"))
            with self._lock:
                self._notify_cgroups[key] = cgroup
        proc = self.spawn(argv, cgroup=cgroup, **options)
        with self._lock:
            self._notifying[key] = proc
        return proc

    def _sweep_notification(self, key: tuple[str, int]) -> None:
        """Kill what an ended notification command left in its cgroup, and remove it."""
        with self._lock:
            cgroup = self._notify_cgroups.pop(key, None)
        if cgroup is None:
            return
        cgroup.kill()
        if not cgroups.wait_empty(cgroup.path, cgroups.KILL_WAIT):
            log.error("notification %s.%s: processes survive cgroup.kill in %s", *key, cgroup.path)
        self._remove_cgroup(cgroup)

    def _notified(
        self,
        key: tuple[str, int],
        log_path: Path,
        owner: Account | None,
        result: NotificationResult,
    ) -> None:
        done = self._notify_result(key, log_path, owner, result)
        with self._lock:
            self._record_notified(key, done)

    def _notify_result(
        self,
        key: tuple[str, int],
        log_path: Path,
        owner: Account | None,
        result: NotificationResult,
    ) -> dict[str, Any]:
        """Write a notification's log (``notify-N.log``); its ``notify_done`` event."""
        text = (
            f"# attempt {key[1]} on {self.host}: {result.reason} after {result.elapsed:.3f}s\n"
            f"# stdout\n{result.stdout}# stderr\n{result.stderr}"
        )
        with contextlib.suppress(OSError):
            make_job_dir(log_path.parent, owner)
            with open_log(log_path, owner, append=False) as fh:
                fh.write(text.encode())
        return {
            "job": key[0],
            "attempt": key[1],
            "status": result.status,
            "reason": result.reason,
            "stdout": _reported(result.stdout),
            "stderr": _reported(result.stderr),
            "elapsed": result.elapsed,
        }

    def _record_notified(self, key: tuple[str, int], done: dict[str, Any]) -> None:
        """Keep and report a notification's result (``_lock`` held)."""
        self._notifying.pop(key, None)
        self.notifications[key] = done
        done_before = sorted(
            k for k, v in self.notifications.items() if k[0] == key[0] and v is not None
        )
        for old in done_before[:-NOTIFY_RESULTS_KEPT]:
            del self.notifications[old]
        self._emit("notify_done", **done)

    def _forget_tasks(self, job: str, task_ids: list[Any]) -> None:
        """Forget these ended tasks of a running job (the controller dropped their
        records): an elastic job resized for days would otherwise keep an entry here
        for every task it ever started. A task still live is kept."""
        for tid in task_ids:
            key = (job, int(tid))
            task = self.tasks.get(key)
            if task is not None and task.state in ENDED:
                del self.tasks[key]

    def _forget(self, job: str) -> None:
        self._forget_tasks(job, [task for j, task in self.tasks if j == job])
        # The job is over: a notification command of it still running (a kill while it
        # ran) is stopped with its whole session, as the job's tasks were. It ran as the
        # job's owner with the job's token and scratch, which are gone.
        for nkey, proc in list(self._notifying.items()):
            # returncode set: reaped, and its pid may be another process's by now.
            if nkey[0] == job and proc.returncode is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)
            if nkey[0] == job and nkey in self._notify_cgroups:
                self._notify_cgroups[nkey].kill()
        for nkey in [k for k, v in self.notifications.items() if k[0] == job and v is not None]:
            del self.notifications[nkey]

    def _save(self, intents: list[tuple[str, int]] | None = None) -> None:
        """Live tasks with pid and start time, and the launches about to be made
        (``intents``: no pid yet), for a successor's orphan cleanup. Not fsynced: it
        only matters when this process dies and the machine does not. A write that
        fails is logged, never raised (see below)."""
        live = [
            {
                "job": t.job,
                "task": t.task,
                "pid": t.pid,
                "ticks": t.ticks,
                "members": [[pid, ticks] for pid, ticks in t.members.items()],
            }
            for t in self.tasks.values()
            if t.state in ("running", "stopping") and t.pid is not None
        ]
        live += [{"job": job, "task": task, "pid": None} for job, task in intents or ()]
        path = self.dir / "tasks.json"
        tmp = path.with_suffix(".tmp")
        try:
            tmp.write_text(json.dumps(live))
            os.replace(tmp, path)
        except OSError as exc:
            # A full filesystem: the state directory's, where every job's scratch and
            # output are too, so any job can fill it. The record is only for a
            # successor; raised, it would end the thread that reports a task's end (of
            # any job), and that task would hold its slots for good.
            log.warning("cannot record the live tasks in %s: %s", path, exc)
            with contextlib.suppress(OSError):
                tmp.unlink()
