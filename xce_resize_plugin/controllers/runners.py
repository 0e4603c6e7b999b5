"""The clock and the two runners the controller delegates to.

They are small interfaces so that a live mode (wall clock, tasks as real processes of
worker agents, notifications run asynchronously) can replace the simulated ones
without touching the controller:

- :class:`Clock` / :class:`SimClock`: the controller's notion of now.
- :class:`TaskRunner` / :class:`SimTaskRunner`: starts and stops task processes and
  reports what happened through a :class:`TaskReporter` (the controller). The
  simulated runner has no processes; its :class:`TaskFaults` inject start failures and
  slow exits.
- :class:`NotificationRunner` / :class:`SubprocessNotificationRunner`: runs a resize
  notification command for real with ``/bin/sh -c`` and reports its result through a
  callback. :class:`ScriptedNotificationRunner` answers from a function instead (for
  fast trace simulation and for tests).
- :class:`InRunner`: whether a call to the task runner is under way (a report made
  inside one answers it).

The controller does the bookkeeping (task states, idempotency, queuing of plugin
events); runners only do the work and report.
"""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Protocol, cast

from attrs import define, field, frozen

from xce_resize_plugin.core.models import Task

# -- clock ----------------------------------------------------------------------------


class Clock(Protocol):
    """The controller clock in seconds."""

    def now(self) -> float: ...


class SettableClock(Clock, Protocol):
    """A clock the discrete event loop moves forward."""

    def advance_to(self, time: float) -> None: ...


class SimClock:
    """Simulated time: only moves when the event loop moves it, never backwards."""

    def __init__(self, start: float = 0.0) -> None:
        self._now = float(start)

    def now(self) -> float:
        return self._now

    def advance_to(self, time: float) -> None:
        if time < self._now:
            raise ValueError(f"the clock cannot go back from {self._now} to {time}")
        self._now = float(time)


# -- tasks ----------------------------------------------------------------------------

#: Exit statuses the simulated runner reports, in the shell's 128+signal convention.
STATUS_SIGTERM = 128 + int(signal.SIGTERM)
STATUS_SIGKILL = 128 + int(signal.SIGKILL)


class TaskReporter(Protocol):
    """What a task runner may call back on (implemented by the controller)."""

    def now(self) -> float: ...

    def at(self, time: float, fn: Callable[[], None]) -> None: ...

    def task_started(self, job_id: str, task_id: int) -> None: ...

    def tasks_started(self, job_id: str, task_ids: Sequence[int]) -> None:
        """:meth:`task_started` for several tasks of one job that started at one
        instant (a grow's tasks), in that order."""
        ...

    def task_start_failed(self, job_id: str, task_id: int, reason: str) -> None: ...

    def task_exited(self, job_id: str, task_id: int, status: int | None, reason: str) -> None: ...

    def tasks_exited(
        self, job_id: str, task_ids: Sequence[int], status: int | None, reason: str
    ) -> None:
        """:meth:`task_exited` for several tasks of one job that ended alike at one
        instant (a release's tasks), in that order."""
        ...


class TaskRunner(Protocol):
    """Starts and stops task processes; reports through the bound reporter.

    The controller calls ``start`` once per task id and ``stop`` once per stop (or
    again after a restart, with the original ``since``); idempotency is its business.
    """

    def bind(self, reporter: TaskReporter) -> None: ...

    def start(self, job_id: str, task: Task, env: Mapping[str, str]) -> None: ...

    def stop(self, job_id: str, task_id: int, grace: float, since: float) -> None: ...


StopMany = Callable[[str, Sequence[int], float, float], None]
StartMany = Callable[[str, Sequence[Task], Mapping[str, str]], None]


def start_many_of(runner: TaskRunner) -> StartMany:
    """How to start several tasks of one job at once with ``runner``: its own
    ``start_many(job_id, tasks, env)`` when it has one (a runner may report them as one
    :meth:`TaskReporter.tasks_started`: a grow of a job of many hosts starts thousands
    at one instant), else :meth:`TaskRunner.start` for each, in order, each with its
    own copy of ``env``."""
    many = getattr(runner, "start_many", None)
    if many is not None:
        return cast(StartMany, many)

    def one_by_one(job_id: str, tasks: Sequence[Task], env: Mapping[str, str]) -> None:
        for task in tasks:
            runner.start(job_id, task, dict(env))

    return one_by_one


def stop_many_of(runner: TaskRunner) -> StopMany:
    """How to stop several tasks of one job at once with ``runner``: its own
    ``stop_many(job_id, task_ids, grace, since)`` when it has one (a runner may report
    them as one :meth:`TaskReporter.tasks_exited`: a release of a job of many hosts
    stops thousands at one instant), else :meth:`TaskRunner.stop` for each, in order."""
    many = getattr(runner, "stop_many", None)
    if many is not None:
        return cast(StopMany, many)

    def one_by_one(job_id: str, task_ids: Sequence[int], grace: float, since: float) -> None:
        for tid in task_ids:
            runner.stop(job_id, tid, grace, since)

    return one_by_one


class InRunner:
    """Whether a call to a task runner is under way (``with in_runner:`` around each).

    A runner may report inside the call that started or stopped a task (the simulated
    one does); such a report answers that call ("sync"), which the controller tells its
    observers and a recording keeps.
    """

    __slots__ = ("_depth",)

    def __init__(self) -> None:
        self._depth = 0

    def __enter__(self) -> None:
        self._depth += 1

    def __exit__(self, *exc_info: object) -> None:
        self._depth -= 1

    def __bool__(self) -> bool:
        return self._depth > 0


StartFailurePredicate = Callable[[str, Task], "bool | str"]


@define
class TaskFaults:
    """Fault injection for the simulated task runner (mutable: tests change it live).

    - ``fail_starts``: ``(job_id, task_id)`` pairs whose start fails.
    - ``fail_start_if``: called as ``fn(job_id, task)``; a true value fails the start (a
      string is used as the reason).
    - ``stop_delay``: simulated seconds a task takes to exit after SIGTERM; when longer
      than the grace period the task is killed at the end of the grace period.
    - ``stop_delays``: the same per ``(job_id, task_id)``, overriding ``stop_delay``.
    """

    fail_starts: set[tuple[str, int]] = field(factory=set)
    fail_start_if: StartFailurePredicate | None = None
    stop_delay: float = 0.0
    stop_delays: dict[tuple[str, int], float] = field(factory=dict)

    def start_failure(self, job_id: str, task: Task) -> str | None:
        """The reason this start fails, or ``None`` when it succeeds."""
        if (job_id, task.id) in self.fail_starts:
            return "injected start failure"
        if self.fail_start_if is not None:
            verdict = self.fail_start_if(job_id, task)
            if verdict:
                return verdict if isinstance(verdict, str) else "injected start failure"
        return None

    def delay(self, job_id: str, task_id: int) -> float:
        return self.stop_delays.get((job_id, task_id), self.stop_delay)


class SimTaskRunner:
    """Tasks without processes: a start succeeds at once unless a fault says otherwise;
    a stopped task exits after the fault's stop delay (SIGKILL at the grace period)."""

    def __init__(self, faults: TaskFaults | None = None) -> None:
        self.faults = faults if faults is not None else TaskFaults()
        self._reporter: TaskReporter | None = None

    def bind(self, reporter: TaskReporter) -> None:
        self._reporter = reporter

    @property
    def reporter(self) -> TaskReporter:
        if self._reporter is None:
            raise RuntimeError("the task runner is not bound to a controller")
        return self._reporter

    def start(self, job_id: str, task: Task, env: Mapping[str, str]) -> None:
        reason = self.faults.start_failure(job_id, task)
        if reason is None:
            self.reporter.task_started(job_id, task.id)
        else:
            self.reporter.task_start_failed(job_id, task.id, reason)

    def start_many(self, job_id: str, tasks: Sequence[Task], env: Mapping[str, str]) -> None:
        """:meth:`start` for each task; without start faults, the starts are reported
        together (:meth:`TaskReporter.tasks_started`), in the order given."""
        faults = self.faults
        if (
            faults.fail_starts
            or faults.fail_start_if is not None
            or type(self).start is not SimTaskRunner.start  # a subclass's own starts
        ):
            for task in tasks:  # each its own report
                self.start(job_id, task, env)
            return
        self.reporter.tasks_started(job_id, tuple(t.id for t in tasks))

    def stop(self, job_id: str, task_id: int, grace: float, since: float) -> None:
        reporter = self.reporter
        when, status, reason = _exit_of(self.faults.delay(job_id, task_id), grace, since)
        if when <= reporter.now():
            reporter.task_exited(job_id, task_id, status, reason)
        else:
            reporter.at(when, lambda: reporter.task_exited(job_id, task_id, status, reason))

    def stop_many(self, job_id: str, task_ids: Sequence[int], grace: float, since: float) -> None:
        """:meth:`stop` for each task; tasks that end alike at one instant are reported
        together (:meth:`TaskReporter.tasks_exited`), in the order given."""
        if self.faults.stop_delays or type(self).stop is not SimTaskRunner.stop:
            for tid in task_ids:  # delays per task, or a subclass's stops: each its own
                self.stop(job_id, tid, grace, since)
            return
        reporter = self.reporter
        ids = tuple(task_ids)
        when, status, reason = _exit_of(self.faults.stop_delay, grace, since)
        if when <= reporter.now():
            reporter.tasks_exited(job_id, ids, status, reason)
        else:
            reporter.at(when, lambda: reporter.tasks_exited(job_id, ids, status, reason))


def _exit_of(delay: float, grace: float, since: float) -> tuple[float, int, str]:
    """When a task stopped at ``since`` exits and how: SIGTERM after ``delay``, or
    SIGKILL at the end of the grace period."""
    if delay <= grace:
        return since + delay, STATUS_SIGTERM, "SIGTERM"
    return since + max(0.0, grace), STATUS_SIGKILL, "SIGKILL"


# -- notifications ------------------------------------------------------------------


@frozen
class NotificationRequest:
    """One run of a notification command (``timeout`` in real seconds; <= 0: none)."""

    job_id: str
    attempt: int
    host: str
    command: str
    env: Mapping[str, str]
    timeout: float
    cwd: Path


@frozen
class NotificationResult:
    """The outcome: ``status`` is the exit status, ``None`` on timeout or failure to run."""

    status: int | None
    reason: str
    stdout: str = ""
    stderr: str = ""
    elapsed: float = 0.0


NotificationDone = Callable[[NotificationResult], None]


class NotificationRunner(Protocol):
    """Runs a notification command and calls ``done`` exactly once with the result
    (synchronously in simulated time; a live runner may call it later)."""

    def run(self, request: NotificationRequest, done: NotificationDone) -> None: ...


#: Variables of the controller's own environment a notification command of its own
#: user inherits: what a login shell needs to find programs and decode text, nothing
#: that would leak the controller's configuration into the job's command.
ESSENTIAL_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "LC_CTYPE", "TMPDIR", "TZ", "USER", "LOGNAME")
#: A key of a request's ``env`` that says it is the command's whole environment: the
#: live controller sets it for a command that runs as another user than its agent's,
#: which must get nothing of the agent's own (root's ``TMPDIR``, ``LANG``, ``LC_*``,
#: ``TZ``: docs/live-controller.md, "Jobs and tasks"). The runner drops it.
WHOLE_ENV = "XCE_NOTIFY_WHOLE_ENV"
#: The ``PATH`` of a job's command that runs as another user than this process's and
#: whose job sets none (and of any command when this process has no usable ``PATH``).
#: This process's own is made for its user (root's, with ``/root/...`` entries), and a
#: directory in it that some user may write (a group's tool directory) would let that
#: user plant commands that other users' jobs run, as them (docs/live-controller.md,
#: "Jobs and tasks"). Not ``os.defpath`` (``/bin:/usr/bin``): it leaves out
#: ``/usr/local/bin``, where a site installs its tools (``bresize``).
DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"


def absolute_path(value: str) -> str:
    """``value`` (a ``PATH``) without its empty and relative entries: each of those is
    looked up from the working directory of the process that runs a command, which
    is not the controller's to vouch for."""
    return os.pathsep.join(p for p in value.split(os.pathsep) if os.path.isabs(p))


def command_path(own_user: bool) -> str:
    """The ``PATH`` a job's command gets when its job sets none: this process's own,
    without its empty and relative entries, when the command runs as this process's
    user (a personal controller: the job is its user's); :data:`DEFAULT_PATH` when it
    runs as another user, or when nothing of this process's is left."""
    inherited = os.environ.get("PATH", "") if own_user else ""
    return absolute_path(inherited) or DEFAULT_PATH


def essential_env(own_user: bool = True) -> dict[str, str]:
    """The :data:`ESSENTIAL_ENV` of this process's environment, with the ``PATH`` of
    :func:`command_path`."""
    env = {k: os.environ[k] for k in ESSENTIAL_ENV if k in os.environ}
    env["PATH"] = command_path(own_user)
    return env


class SubprocessNotificationRunner:
    """Runs the command for real: ``/bin/sh -c command`` in its own session, with the
    essential environment plus the request's (the request's alone when it says it is
    whole: :data:`WHOLE_ENV`), output captured (truncated to
    ``max_output`` characters per stream, bounded while it is read:
    :class:`_CappedOutput`), killed with its whole process group on
    timeout. ``popen`` starts the process (the live worker agent's keeps track of its
    children with it)."""

    def __init__(
        self,
        max_output: int = 65536,
        shell: str = "/bin/sh",
        popen: Callable[..., subprocess.Popen[bytes]] = subprocess.Popen,
    ) -> None:
        self.max_output = max_output
        self.shell = shell
        self.popen = popen

    def environment(self, request: NotificationRequest) -> dict[str, str]:
        given = {str(k): str(v) for k, v in request.env.items()}
        if given.pop(WHOLE_ENV, None) is not None:
            # Another user's command (a live agent's, as root, for a job of its owner):
            # what the controller sent is all of it (:data:`WHOLE_ENV`).
            given.setdefault("PATH", DEFAULT_PATH)
            return given
        env = essential_env()
        env.update(given)
        return env

    def run(self, request: NotificationRequest, done: NotificationDone) -> None:
        begin = time.monotonic()
        try:
            request.cwd.mkdir(parents=True, exist_ok=True)
            proc = self.popen(
                [self.shell, "-c", request.command],
                cwd=request.cwd,
                env=self.environment(request),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                # Own session: a timeout kills the whole group, including children of
                # the shell that would otherwise keep the pipes (and us) waiting.
                start_new_session=True,
            )
        except (OSError, ValueError, subprocess.SubprocessError) as exc:
            # ValueError: a NUL byte in the command or the environment. Any of these is
            # the notification's failure, reported: a runner that raised would leave
            # the change waiting for a result that never comes.
            done(NotificationResult(None, f"cannot run: {exc}", elapsed=time.monotonic() - begin))
            return
        timeout = request.timeout if request.timeout > 0 else None
        deadline = None if timeout is None else time.monotonic() + timeout
        output = _CappedOutput(proc, self.max_output * _UTF8_MAX)
        try:
            ended = output.read_until(deadline) and self._wait(proc, deadline)
            if not ended:
                self._kill_group(proc)
                if not output.read_until(time.monotonic() + 5):
                    # A grandchild left the group and holds the pipes: give up on the
                    # rest of the output rather than block the controller.
                    proc.kill()
        finally:
            output.close()
        code = proc.wait()
        if not ended:
            status, reason = None, "timeout"
        elif code < 0:
            status, reason = 128 - code, f"signal {-code}"
        else:
            status, reason = code, f"exit {code}"
        out, err = (self._text(*output.kept(i)) for i in (0, 1))
        done(NotificationResult(status, reason, out, err, time.monotonic() - begin))

    @staticmethod
    def _kill_group(proc: subprocess.Popen[bytes]) -> None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            proc.kill()

    @staticmethod
    def _wait(proc: subprocess.Popen[bytes], deadline: float | None) -> bool:
        """Whether the process ended by ``deadline`` (its pipes are closed already)."""
        try:
            proc.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            return False
        return True

    def _text(self, data: bytes, dropped: bool = False) -> str:
        text = data.decode("utf-8", errors="replace")
        if len(text) > self.max_output or dropped:
            return text[: self.max_output] + "\n[output truncated]\n"
        return text


#: Bytes of a stream kept per character of output shown: a UTF-8 character is at most
#: 4 bytes, so what is kept always decodes to at least ``max_output`` characters when
#: bytes were dropped beyond it.
_UTF8_MAX = 4
_READ_CHUNK = 65536


class _CappedOutput:
    """A child's stdout and stderr, read together until both end; of each, the first
    ``cap`` bytes are kept and the rest is read and dropped. A notification command is
    the job's: what it writes, and for how long, is not bounded (``yes``, ``cat
    /dev/zero`` until the timeout), so reading it all before truncating
    (``communicate``) would take the memory of the process that runs it, a root worker
    agent serving every job of its host (docs/live-controller.md, "Notification
    commands"). Reading on keeps a verbose command from blocking on a full pipe."""

    def __init__(self, proc: subprocess.Popen[bytes], cap: int) -> None:
        self.cap = cap
        self._streams = [s for s in (proc.stdout, proc.stderr) if s is not None]
        self._data = [bytearray(), bytearray()]
        self._dropped = [False, False]
        self._selector = selectors.DefaultSelector()
        for index, stream in enumerate((proc.stdout, proc.stderr)):
            if stream is not None:  # each stream keeps its own index (0 or 1)
                self._selector.register(stream.fileno(), selectors.EVENT_READ, index)

    def read_until(self, deadline: float | None) -> bool:
        """Read until both streams end (``True``) or ``deadline`` passes (``False``)."""
        while self._selector.get_map():
            wait = None if deadline is None else deadline - time.monotonic()
            if wait is not None and wait <= 0:
                return False
            for key, _ in self._selector.select(wait):
                chunk = os.read(key.fd, _READ_CHUNK)
                if not chunk:
                    self._selector.unregister(key.fd)
                    continue
                data = self._data[key.data]
                room = max(0, self.cap - len(data))
                data += chunk[:room]
                self._dropped[key.data] = self._dropped[key.data] or len(chunk) > room
        return True

    def kept(self, index: int) -> tuple[bytes, bool]:
        """Stream ``index`` (0: stdout, 1: stderr): the bytes kept, whether any were
        dropped."""
        return bytes(self._data[index]), self._dropped[index]

    def close(self) -> None:
        self._selector.close()
        for stream in self._streams:
            stream.close()


NotificationScript = Callable[[NotificationRequest], NotificationResult]


class ScriptedNotificationRunner:
    """Answers from a function instead of running anything: for year-long trace
    simulations (no process per resize) and for tests. Default: always exit 0."""

    def __init__(self, script: NotificationScript | None = None) -> None:
        self.script = script
        self.requests: list[NotificationRequest] = []

    def run(self, request: NotificationRequest, done: NotificationDone) -> None:
        self.requests.append(request)
        done(self.script(request) if self.script else NotificationResult(0, "exit 0"))
