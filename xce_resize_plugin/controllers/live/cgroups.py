"""Per-task cgroups of the worker agent (cgroup v2), with ``pids.max`` where a pids
controller is there (docs/live-controller.md, "Process containment").

Why: the agent's ``/proc`` tracking (:mod:`.proc`) sees a process only if it lives
through a scan; a "comet" (each process forks a child and exits within milliseconds)
is never seen, and was reported gone while it ran on. A cgroup holds every process a
task forks, whatever it does: ``cgroup.kill`` kills them all at once, and
``cgroup.events`` says when none is left (``populated 0``).

The agent's cgroups are a subtree of its own cgroup, one per host and state directory:
``<v2 mount>/<the agent's cgroup>/xce-<hash of the state dir>/<host>/``, and in it one
cgroup per task launch and per notification attempt (:class:`TaskCgroup`). The v2
hierarchy is found in ``/proc/self/mountinfo``, never at a fixed path (a hybrid host
mounts it at ``/sys/fs/cgroup/unified``). ``pids.max`` needs a pids controller: the v2
one when it can be enabled down the subtree (``cgroup.subtree_control``), else a v1
``pids`` hierarchy, where the agent makes the same subtree and places each process too.

Everything here is made by root (or the agent's user) with the default modes: a task's
owner cannot write any ``cgroup.procs`` of it, so cannot move a process out.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import select
import signal
import time
from pathlib import Path

from attrs import define, frozen

#: How long a cgroup whose processes were killed may stay populated before it is left
#: for later (a process in uninterruptible sleep cannot die until its I/O ends).
KILL_WAIT = 5.0
#: ``task_pids_max`` unless the configuration says otherwise: systemd's own
#: ``DefaultTasksMax`` (15 % of the host's pids and threads); see docs/admin-guide.md.
DEFAULT_PIDS_MAX = "15%"
#: The largest pid Linux allows (``PID_MAX_LIMIT`` on 64-bit): a larger limit is a typo.
PID_MAX_LIMIT = 4194304
#: The ``containment`` settings.
MODES = ("auto", "cgroup", "proc")
#: The file under a worker's directory where its subtrees are recorded for a successor.
RECORD = "cgroups.json"


class Unavailable(Exception):
    """No cgroup containment here; the message says why (one line)."""


def _unescape(field: str) -> str:
    """A path field of ``mountinfo`` (space, tab, newline, backslash are octal escapes)."""
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(code, char)
    return field


def _mounts(mountinfo: str) -> list[tuple[str, str, str, str]]:
    """``(root, mount point, fs type, super options)`` of each line of ``mountinfo``."""
    out = []
    for line in mountinfo.splitlines():
        fields = line.split()
        if " - " not in line or len(fields) < 5:
            continue
        tail = line.split(" - ", 1)[1].split()
        if len(tail) >= 3:
            out.append((_unescape(fields[3]), _unescape(fields[4]), tail[0], tail[2]))
    return out


def _own_paths(proc_cgroup: str) -> dict[str, str]:
    """This process's cgroup by hierarchy: ``""`` for v2, each v1 controller by name."""
    out: dict[str, str] = {}
    for line in proc_cgroup.splitlines():
        _, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if not controllers:
            out[""] = path
        for name in controllers.split(","):
            if name:
                out[name] = path
    return out


def _below(mount: str, root: str, own: str) -> Path | None:
    """Where cgroup ``own`` is under a hierarchy mounted at ``mount`` from ``root``."""
    root = root.rstrip("/")
    if own != root and not own.startswith(root + "/"):
        return None  # our cgroup is not visible through this mount
    return Path(mount + own[len(root) :])


def cgroup_mounts() -> list[Path]:
    """Where cgroup hierarchies (v1 and v2) are mounted."""
    try:
        mounts = _mounts(Path("/proc/self/mountinfo").read_text())
    except OSError:
        return []
    return [Path(point) for _, point, fstype, _ in mounts if fstype in ("cgroup", "cgroup2")]


def find_hierarchies(mountinfo: str, proc_cgroup: str) -> tuple[Path | None, Path | None]:
    """The directory of this process's cgroup in the v2 hierarchy and in a v1 ``pids``
    hierarchy (``None``: not mounted, or not visible here)."""
    own = _own_paths(proc_cgroup)
    v2 = pids = None
    for root, point, fstype, options in _mounts(mountinfo):
        if fstype == "cgroup2" and v2 is None and "" in own:
            v2 = _below(point, root, own[""])
        elif fstype == "cgroup" and pids is None and "pids" in options.split(","):
            pids = _below(point, root, own.get("pids", "/"))
    return v2, pids


def subtree_name(state_dir: Path, host: str) -> tuple[str, str]:
    """The names of the agent's two levels: ``xce-<hash of state_dir>`` and the host's
    (a host name that is not a plain file name is hashed)."""
    digest = hashlib.sha256(str(state_dir).encode()).hexdigest()[:12]
    plain = host.replace("-", "").replace("_", "").replace(".", "").isalnum()
    if not plain or host.startswith(".") or len(host) > 64:
        host = "host-" + hashlib.sha256(host.encode()).hexdigest()[:12]
    return f"xce-{digest}", host


def leaf_name(job: str, what: str) -> str:
    """The start of the name of a job's cgroup (``job7.task3``, ``job7.notify2``); a
    job id that is not a short plain name is hashed."""
    if not (job.isascii() and job.isalnum() and len(job) <= 32):
        job = hashlib.sha256(job.encode()).hexdigest()[:12]
    return f"job{job}.{what}"


def pids_limit(setting: str | int) -> int | None:
    """``task_pids_max`` as a number of pids (``None``: no limit): ``"max"``, a count,
    or a percentage of the host's pids and threads (``/proc/sys/kernel``)."""
    if setting == "max":
        return None
    if isinstance(setting, int):
        return setting
    budget = PID_MAX_LIMIT
    for name in ("pid_max", "threads-max"):
        with contextlib.suppress(OSError, ValueError):
            budget = min(budget, int(Path(f"/proc/sys/kernel/{name}").read_text()))
    return max(1, budget * int(setting.rstrip("%")) // 100)


def parse_pids_max(value: object) -> str | int:
    """A ``task_pids_max`` setting as checked (``ValueError``: what is wrong with it)."""
    if value == "max":
        return "max"
    if type(value) is int and 1 <= value <= PID_MAX_LIMIT:
        return value
    share = isinstance(value, str) and value.endswith("%") and value[:-1].isdigit()
    if share and 1 <= int(str(value)[:-1]) <= 100:
        return str(value)
    raise ValueError(
        f'must be "max", a number of pids (1 to {PID_MAX_LIMIT}) or a percentage of '
        f'the host\'s ("15%"), not {value!r}'
    )


def _write(path: Path, text: str) -> None:
    """One write to a cgroup file (the kernel takes each write as one command)."""
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def _gone(exc: OSError) -> bool:
    """Whether an error on a cgroup's file means the cgroup is gone: removed before
    the open (``ENOENT``), or while the file was open (``ENODEV``: another thread of
    the agent removed it meanwhile, which the kernel reports on the next read)."""
    return isinstance(exc, FileNotFoundError) or exc.errno == errno.ENODEV


def _mkdir(path: Path) -> None:
    with contextlib.suppress(FileExistsError):
        path.mkdir()


def populated(path: Path) -> bool:
    """Whether the cgroup at ``path`` has a live process (a removed one has none)."""
    try:
        text = (path / "cgroup.events").read_text()
    except OSError as exc:
        if _gone(exc):
            return False
        raise
    return "populated 1" in text


def wait_empty(path: Path, timeout: float) -> bool:
    """Wait until the cgroup has no process, at most ``timeout`` seconds; whether it
    has none. The kernel wakes a ``poll`` on ``cgroup.events`` when it changes; a poll
    is re-armed every 100 ms anyway, so a missed wake-up costs that much at most."""
    deadline = time.monotonic() + timeout
    try:
        fd = os.open(path / "cgroup.events", os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        if _gone(exc):
            return True
        raise
    try:
        poller = select.poll()
        poller.register(fd, select.POLLPRI | select.POLLERR)
        while True:
            try:
                events = os.pread(fd, 256, 0)
            except OSError as exc:
                if _gone(exc):
                    return True
                raise
            if b"populated 1" not in events:
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            poller.poll(min(left, 0.1) * 1000)
    finally:
        os.close(fd)


def kill(path: Path) -> None:
    """SIGKILL every process in the cgroup and its children at once (``cgroup.kill``:
    a process forking at that instant is killed too, its child with it)."""
    try:
        _write(path / "cgroup.kill", "1")
    except OSError as exc:
        if not _gone(exc):
            raise


def remove_tree(path: Path, timeout: float = KILL_WAIT) -> list[Path]:
    """Kill every process of the cgroup at ``path`` and below, and remove them all,
    deepest first; the cgroups that could not be removed (still populated)."""
    if not path.is_dir():
        return []
    kill(path)
    wait_empty(path, timeout)
    left: list[Path] = []
    for dirpath, _, _ in sorted(os.walk(path), key=lambda w: -len(Path(w[0]).parts)):
        try:
            os.rmdir(dirpath)
        except FileNotFoundError:
            pass
        except OSError:
            left.append(Path(dirpath))
    return left


@frozen
class TaskCgroup:
    """One task launch's (or notification attempt's) cgroup: ``path`` in the v2
    hierarchy, ``pids`` in a v1 pids hierarchy when that one limits it, and ``line``,
    how ``/proc/PID/cgroup`` names it (``0::/…``)."""

    path: Path
    pids: Path | None
    line: str

    def place(self, pid: int) -> None:
        """Move process ``pid`` (still held at its start barrier) into the cgroup."""
        if self.pids is not None:
            _write(self.pids / "cgroup.procs", str(pid))
        _write(self.path / "cgroup.procs", str(pid))

    def populated(self) -> bool:
        return populated(self.path)

    def kill(self) -> None:
        kill(self.path)

    def pids_in(self) -> list[int]:
        """The processes in the cgroup now (a pid may be gone, or reused, by the time
        it is used: :meth:`signal` checks)."""
        try:
            return [int(p) for p in (self.path / "cgroup.procs").read_text().split()]
        except ValueError:
            return []
        except OSError as exc:
            if _gone(exc):
                return []
            raise

    def holds(self, pid: int) -> bool:
        """Whether process ``pid`` is in this cgroup now."""
        try:
            text = Path(f"/proc/{pid}/cgroup").read_text()
        except OSError:
            return False
        return self.line in text.splitlines()

    def signal(self, sig: int) -> bool:
        """Send ``sig`` to every process of the cgroup; whether there was any. Each pid
        is pinned by a pidfd, then checked to be in the cgroup still: a pid that was
        reused in between is another process, not signalled."""
        sent = False
        for pid in self.pids_in():
            try:
                pidfd = os.pidfd_open(pid)
            except OSError:
                continue
            try:
                if self.holds(pid):
                    signal.pidfd_send_signal(pidfd, sig)
                    sent = True
            except OSError:
                pass
            finally:
                os.close(pidfd)
        return sent

    def remove(self) -> bool:
        """Remove the cgroup (once it has no process); whether it is gone."""
        gone = True
        for path in (self.path, self.pids):
            if path is None:
                continue
            try:
                os.rmdir(path)
            except FileNotFoundError:
                pass
            except OSError:
                gone = False
        return gone


@define
class Containment:
    """The agent's cgroup subtree for its host (see the module docstring)."""

    #: The host's cgroup in the v2 hierarchy, and its name in ``/proc/PID/cgroup``.
    root: Path
    line: str
    #: The host's cgroup in a v1 pids hierarchy (``None``: pids limited in v2, or not).
    pids_root: Path | None = None
    #: ``pids.max`` of each task's cgroup (``None``: no limit written).
    pids_max: int | None = None
    #: Where ``pids.max`` is applied: ``"v2"``, ``"v1"`` or ``""`` (nowhere).
    pids_where: str = ""
    _count: int = 0

    def create(self, name: str) -> TaskCgroup:
        """A new, empty cgroup for one launch or notification attempt (``name``, and a
        counter that makes it unique); its ``pids.max`` written. ``OSError``: it could
        not be made (then nothing of it is left)."""
        while True:
            self._count += 1
            leaf = f"{name}.{self._count}"
            try:
                (self.root / leaf).mkdir()
                break
            except FileExistsError:
                continue  # a predecessor's, not removed yet
        group = TaskCgroup(self.root / leaf, None, f"{self.line}/{leaf}")
        try:
            if self.pids_max is not None and self.pids_where == "v2":
                _write(group.path / "pids.max", str(self.pids_max))
            if self.pids_max is not None and self.pids_root is not None:
                _mkdir(self.pids_root / leaf)
                group = TaskCgroup(group.path, self.pids_root / leaf, group.line)
                _write(self.pids_root / leaf / "pids.max", str(self.pids_max))
        except OSError:
            group.remove()
            raise
        return group

    def holds(self, cgroup_text: str) -> bool:
        """Whether a ``/proc/PID/cgroup`` text puts the process in this subtree."""
        return any(line.startswith(self.line + "/") for line in cgroup_text.splitlines())

    def trees(self) -> list[Path]:
        """The host's cgroups in every hierarchy used."""
        return [p for p in (self.root, self.pids_root) if p is not None]

    def record(self, where: Path) -> None:
        """Write the subtrees to ``where`` for a successor that may start in another
        cgroup (another service, another controller)."""
        where.write_text(json.dumps([str(p) for p in self.trees()]))

    def close(self) -> None:
        """Remove the subtree (the agent's clean stop): what is empty goes, and the
        level above if no other host's agent uses it."""
        for tree in self.trees():
            remove_tree(tree, 0.0 if not populated(tree) else KILL_WAIT)
            with contextlib.suppress(OSError):
                os.rmdir(tree.parent)


def recorded(where: Path, mounts: list[Path]) -> list[Path]:
    """The subtrees a predecessor recorded (``where``), those inside a cgroup mount
    (``mounts``) and named as :func:`subtree_name` makes them."""
    try:
        paths = [Path(p) for p in json.loads(where.read_text())]
    except (OSError, ValueError, TypeError):
        return []
    return [
        p
        for p in paths
        if p.parent.name.startswith("xce-")
        and ".." not in p.parts
        and any(p.is_relative_to(m) for m in mounts)
    ]


def _enable_pids(chain: list[Path]) -> bool:
    """Enable the v2 pids controller in each cgroup of ``chain``, top down; whether it
    is enabled in the last one's children (a non-root cgroup that has processes of its
    own refuses: ``EBUSY``, the "no internal processes" rule)."""
    if "pids" not in (chain[0] / "cgroup.controllers").read_text().split():
        return False
    for path in chain:
        if "pids" in (path / "cgroup.subtree_control").read_text().split():
            continue
        try:
            _write(path / "cgroup.subtree_control", "+pids")
        except OSError:
            return False
    return True


def _v2_subtree(own: Path, top: str, host: str) -> Path:
    for path in (own / top, own / top / host):
        try:
            _mkdir(path)
        except OSError as exc:
            raise Unavailable(f"cannot make the cgroup {path}: {exc.strerror}") from None
    if not (own / top / host / "cgroup.kill").exists():
        raise Unavailable("this kernel has no cgroup.kill (Linux 5.14 and newer have)")
    return own / top / host


def open_containment(state_dir: Path, host: str, pids_max: int | None) -> Containment:
    """Make (or take again) the agent's subtree; :class:`Unavailable` when there is no
    writable cgroup v2 hierarchy. Where no pids controller can limit it, the result's
    ``pids_where`` is ``""``."""
    try:
        mountinfo = Path("/proc/self/mountinfo").read_text()
        proc_cgroup = Path("/proc/self/cgroup").read_text()
    except OSError as exc:
        raise Unavailable(f"cannot read this process's cgroups: {exc}") from None
    own, own_pids = find_hierarchies(mountinfo, proc_cgroup)
    if own is None:
        raise Unavailable("no cgroup v2 hierarchy is mounted where this process sees it")
    if not os.access(own, os.W_OK):
        raise Unavailable(f"the cgroup {own} cannot be written by uid {os.geteuid()}")
    top, leaf = subtree_name(state_dir, host)
    root = _v2_subtree(own, top, leaf)
    own_line = _own_paths(proc_cgroup)[""].rstrip("/")
    found = Containment(root, f"0::{own_line}/{top}/{leaf}", pids_max=pids_max)
    if pids_max is None:
        return found
    with contextlib.suppress(OSError):
        if _enable_pids([own, own / top, root]):
            found.pids_where = "v2"
            return found
    if own_pids is not None:
        # A hybrid host's v1 pids hierarchy: each process is placed in both.
        with contextlib.suppress(OSError):
            _mkdir(own_pids / top)
            _mkdir(own_pids / top / leaf)
            found.pids_root, found.pids_where = own_pids / top / leaf, "v1"
    return found
