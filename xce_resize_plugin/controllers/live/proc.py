"""Process and file helpers shared by the live controller and the worker agents.

Linux only (``/proc``, ``flock``), like the live controller itself. Why not just
``os.kill(pid, 0)``: a process that exited but was not reaped yet (a zombie) still
answers it, and the live controller's workers and tasks are often somebody else's
children (they outlive the process that started them), so nobody here can reap them.

A task is every process it started, not only its process group: :func:`become_subreaper`
makes the agent the parent of the task's orphans, :class:`ProcessTable` finds a task's
descendants, and :func:`signal_verified` signals a pid only while it is still the process
that was seen (docs/live-controller.md, "Jobs and tasks").

Who a job's processes run as is an :class:`Account`: the controller decides it at
submission, the agent starts the processes as it (:func:`run_as_options`) and gives it
the log files it writes for them (:func:`open_log`) (docs/live-controller.md, "Who runs
a job").
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import os
import pwd
import secrets
import signal
import tempfile
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, BinaryIO

from attrs import frozen

from xce_resize_plugin.journal.lmdb_env import PRIVATE_FILE, restrict_mode


@frozen
class Account:
    """A local account a job's processes run as: user and group ids, the groups it is
    a member of (``os.getgrouplist``), and its home directory."""

    name: str
    uid: int
    gid: int
    groups: tuple[int, ...]
    home: str

    @classmethod
    def named(cls, name: str) -> Account:
        """The account of the local user ``name`` (``KeyError``: there is none)."""
        return cls._of(pwd.getpwnam(name))

    @classmethod
    def of_uid(cls, uid: int) -> Account:
        """The account of user id ``uid``; one without a passwd entry (a container's
        arbitrary uid) is named by its number, with this process's groups."""
        try:
            return cls._of(pwd.getpwuid(uid))
        except KeyError:
            home = os.environ.get("HOME", "/")
            return cls(str(uid), uid, os.getegid(), tuple(os.getgroups()), home)

    @classmethod
    def _of(cls, entry: pwd.struct_passwd) -> Account:
        groups = tuple(os.getgrouplist(entry.pw_name, entry.pw_gid))
        return cls(entry.pw_name, entry.pw_uid, entry.pw_gid, groups, entry.pw_dir)


def account_json(account: Account) -> dict[str, Any]:
    """An account as the controller stores it and sends it to the agents."""
    return {
        "name": account.name,
        "uid": account.uid,
        "gid": account.gid,
        "groups": list(account.groups),
        "home": account.home,
    }


def parse_account(data: Any) -> Account:
    """The account of a stored job or an agent command (``ValueError`` when malformed)."""
    ids = ("uid", "gid")
    if (
        not isinstance(data, Mapping)
        or not isinstance(data.get("name"), str)
        or not isinstance(data.get("home"), str)
        or not all(type(data.get(k)) is int and data[k] >= 0 for k in ids)
        or not isinstance(data.get("groups"), list)
        or not all(type(g) is int and g >= 0 for g in data["groups"])
    ):
        raise ValueError(f"no valid user to run as: {data!r}")
    return Account(data["name"], data["uid"], data["gid"], tuple(data["groups"]), data["home"])


def run_as_options(account: Account) -> dict[str, Any]:
    """``subprocess.Popen``'s keyword arguments that run a child as ``account``: none
    when this process has its uid already; its uid, gid and groups when this process is
    root. ``PermissionError`` otherwise: a process that is not root never starts
    anything as somebody else."""
    uid = os.geteuid()
    if account.uid == uid:
        return {}
    if uid != 0:
        raise PermissionError(
            f"this agent runs as uid {uid}, not root: it cannot run processes as "
            f"{account.name} (uid {account.uid})"
        )
    return {"user": account.uid, "group": account.gid, "extra_groups": list(account.groups)}


def open_log(path: Path | str, owner: Account | None, *, append: bool = True) -> BinaryIO:
    """Open a log file the agent writes for a job, mode 0600, given to ``owner`` (the
    job's user, when the job runs as another user than the agent's) so that the job's
    owner, and only it, reads it. Never through a symbolic link."""
    mode = os.O_APPEND if append else os.O_TRUNC
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | mode, 0o600)
    try:
        if owner is not None:
            os.fchown(fd, owner.uid, owner.gid)
        return os.fdopen(fd, "ab" if append else "wb")
    except BaseException:
        os.close(fd)
        raise


#: A job's directory when the job runs as another user than the controller's: the
#: controller's (``jobs/ID`` root's, 0711), which the job's owner passes through to the
#: files its environment names and nobody lists (docs/live-controller.md, "State
#: directory"). Not the owner's group's: users often share one (``users``), and it
#: would show each of them the others' jobs and allocations.
SHARED_JOB_DIR = 0o711
#: A job's directory when the job runs as the controller's own user (a personal
#: controller): nobody else has anything to reach in it.
OWN_JOB_DIR = 0o700


def atomic_write(
    path: Path, data: str | bytes, mode: int = 0o644, owner: Account | None = None
) -> None:
    """Replace ``path`` with ``data`` atomically: a reader sees the old or the new
    content, never a mix (temporary file in the same directory, fsync, rename).

    ``owner``: the account the file is given to (a job's file that only its owner
    reads, docs/live-controller.md, "State directory"). Its mode and owner are set
    through the new file's descriptor, before it has a name anyone could know: the
    file never exists under ``path`` with other modes or another owner."""
    raw = data.encode() if isinstance(data, str) else data
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        try:
            os.fchmod(fd, mode)
            if owner is not None:
                os.fchown(fd, owner.uid, owner.gid)
        except BaseException:
            os.close(fd)
            raise
        _write_durably(fd, raw, path)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _write_durably(fd: int, raw: bytes, path: Path) -> None:
    """Write ``raw`` to the new file open on ``fd``, fsync it and close it; an OSError
    names ``path``, the file it is written for. A buffered write, a flush or an fsync
    fails without a file name (``[Errno 28] No space left on device``), and the
    controller reports a failed write as it is: its health ``reason`` and its refusals
    promise the file and the error (docs/live-controller.md)."""
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(raw)
            fh.flush()
            os.fsync(fh.fileno())
    except OSError as exc:
        if exc.filename is not None or exc.errno is None:
            raise
        raise OSError(exc.errno, exc.strerror, str(path)) from exc


def secret_file(path: Path, *, create: bool = True) -> str:
    """The random secret in ``path``, created on first use unless ``create`` is false
    (then :class:`FileNotFoundError`); mode 0600, an existing looser file is tightened.

    Two processes creating it at the same moment agree on one secret: the new file is
    written under a temporary name and linked into place, which fails if it exists.
    """
    try:
        text = path.read_text().strip()
    except FileNotFoundError:
        if not create:
            raise
    else:
        restrict_mode(path, PRIVATE_FILE, error=OSError)
        return text
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)  # mode 0600
    try:
        _write_durably(fd, secrets.token_urlsafe(32).encode(), path)
        with contextlib.suppress(FileExistsError):
            os.link(tmp, path)
    finally:
        os.unlink(tmp)
    return path.read_text().strip()


def _stat_fields(pid: int) -> list[str] | None:
    """Fields of ``/proc/PID/stat`` after the command name, or ``None`` when gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    # The command name is in parentheses and may itself contain spaces or ')'.
    return raw[raw.rfind(b")") + 2 :].decode().split()


def start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (``None``: no such process).

    Stored next to a pid so that a recycled pid is never mistaken for our process.
    """
    fields = _stat_fields(pid)
    return int(fields[19]) if fields is not None else None


def pid_alive(pid: int, ticks: int | None = None) -> bool:
    """Whether ``pid`` runs (not a zombie) and, given ``ticks``, is the same process."""
    fields = _stat_fields(pid)
    if fields is None or fields[0] in ("Z", "X"):
        return False
    return ticks is None or int(fields[19]) == ticks


#: ``prctl(2)`` option: orphaned descendants are re-parented to the calling process
#: (instead of init), which can then find, stop and reap them.
PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> bool:
    """Make this process the "child subreaper" of its descendants: a task's process whose
    parent exits (a daemon's double fork, ``setsid cmd &``) becomes our child, not init's.
    ``False`` where the kernel or the C library does not allow it (not Linux, Linux
    older than 3.4): tasks are then contained as far as their descendants can be seen."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


@frozen
class ProcInfo:
    """One process as ``/proc`` shows it (``uid``: the owner of ``/proc/PID``)."""

    pid: int
    ppid: int
    pgid: int
    ticks: int
    uid: int
    zombie: bool


class ProcessTable:
    """One scan of ``/proc``: every process's parent, group, start time and owner, and
    who descends from whom. A scan costs a read per process (tens of microseconds each:
    a third of a second for 8,000), and any user chooses how many processes there are;
    callers take one and ask it several questions, and it is indexed by parent and by
    group so that a task's processes cost what the task has, not what the host runs
    (docs/performance.md, "The worker agent and many processes").

    ``taken``: ``time.monotonic()`` when the scan began; a process started later is not
    in it. ``took``: how long the scan lasted (seconds)."""

    def __init__(self) -> None:
        self.taken = time.monotonic()
        self.procs: dict[int, ProcInfo] = {}
        self.children: dict[int, list[int]] = {}
        self.groups: dict[int, list[int]] = {}
        try:
            names = os.listdir("/proc")
        except OSError:
            names = []
        for name in names:
            if not name.isdigit():
                continue
            try:
                uid = os.stat(f"/proc/{name}").st_uid
            except OSError:
                continue
            fields = _stat_fields(int(name))
            if fields is None:
                continue
            # fields: state, ppid, pgrp, ..., starttime (the 22nd field of the line)
            zombie = fields[0] in ("Z", "X")
            info = ProcInfo(int(name), int(fields[1]), int(fields[2]), int(fields[19]), uid, zombie)
            self.procs[info.pid] = info
            self.children.setdefault(info.ppid, []).append(info.pid)
            if not zombie:
                self.groups.setdefault(info.pgid, []).append(info.pid)
        self.took = time.monotonic() - self.taken

    def alive(self, pid: int, ticks: int | None = None) -> bool:
        """Whether ``pid`` runs (not a zombie) and, given ``ticks``, is the same process."""
        info = self.procs.get(pid)
        return info is not None and not info.zombie and (ticks is None or info.ticks == ticks)

    def tree(self, roots: Iterable[int]) -> dict[int, int]:
        """The live ``roots`` and every live descendant of them: pid -> start ticks."""
        out: dict[int, int] = {}
        todo = [pid for pid in roots if pid in self.procs]
        while todo:
            pid = todo.pop()
            if pid in out:
                continue
            info = self.procs[pid]
            if not info.zombie:
                out[pid] = info.ticks
            # A zombie's children are still its descendants until they are re-parented.
            todo.extend(self.children.get(pid, ()))
        return out

    def group(self, pgid: int) -> list[int]:
        """The live members of process group ``pgid``."""
        return list(self.groups.get(pgid, ()))


def environ_marks(pid: int, names: tuple[str, ...]) -> dict[str, str]:
    """The values of ``names`` in the environment ``pid`` was started with (empty when
    it cannot be read)."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    wanted = {n.encode() for n in names}
    out: dict[str, str] = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep and key in wanted:
            out[key.decode()] = value.decode(errors="replace")
    return out


def signal_verified(pid: int, ticks: int, sig: int) -> bool:
    """Send ``sig`` to ``pid`` if it is still the process that started at ``ticks``;
    whether it was sent. A pidfd pins the process between the check and the signal, so
    a recycled pid is never signalled."""
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return False
    except (OSError, AttributeError):
        pidfd = -1  # no pidfd (Linux < 5.3): the start time check alone
    try:
        if start_ticks(pid) != ticks:
            return False
        if pidfd >= 0:
            signal.pidfd_send_signal(pidfd, sig)
        else:
            os.kill(pid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False
    finally:
        if pidfd >= 0:
            os.close(pidfd)


class FileLock:
    """An exclusive ``flock`` held for a process's lifetime (the worker's "I run" lock).

    The kernel drops it when the process dies, even by SIGKILL, so "is the lock held?"
    answers "does the worker run?" without pids that could be recycled. Task processes
    do not inherit it (``close_fds``).
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    def acquire(self) -> bool:
        """Take the lock without waiting; ``False`` when another process holds it."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EACCES):
                return False
            raise
        self._fd = fd
        return True

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def listens_on(pid: int, port: int) -> bool | None:
    """Whether process ``pid`` holds the socket listening on TCP ``port`` (``None``:
    this system has no ``/proc`` to tell).

    An agent's registration names its pid and port, but the port is free to any
    process once the agent is gone: a job that took the port of an agent that crashed
    would be sent the controller's secret. The controller connects only to a port whose
    listener is the registered agent's (docs/live-controller.md, "Agents")."""
    inodes: set[str] = set()
    tables = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table, encoding="ascii") as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        tables += 1
        for row in rows:
            fields = row.split()
            # local address "0100007F:9C40", state 0A = LISTEN, inode in field 10.
            listening = len(fields) > 9 and fields[3] == "0A"
            if listening and int(fields[1].rpartition(":")[2], 16) == port:
                inodes.add(fields[9])
    if not tables:
        return None
    if not inodes:
        return False
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False  # gone, or not ours to read: not proven
    for fd in fds:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:[") and target[8:-1] in inodes:
            return True
    return False


def lock_held(path: Path) -> bool:
    """Whether some process holds the exclusive lock on ``path``.

    Probes with a shared lock, which never blocks an exclusive holder's work and is
    dropped at once; a worker starting at that very instant retries its own lock.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EWOULDBLOCK, errno.EACCES):
            return True
        raise
    finally:
        os.close(fd)  # closing drops our shared lock, if we got it
    return False


def exit_status(returncode: int) -> tuple[int, str]:
    """A Popen return code as a shell-style status and a reason (``exit 3``, ``signal 15``)."""
    if returncode < 0:
        return 128 - returncode, f"signal {-returncode}"
    return returncode, f"exit {returncode}"
