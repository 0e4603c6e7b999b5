"""Process and file helpers shared by the live controller and the worker agents.

Linux only (``/proc``, ``flock``), like the live controller itself. Why not just
``os.kill(pid, 0)``: a process that exited but was not reaped yet (a zombie) still
answers it, and the live controller's workers and tasks are often somebody else's
children (they outlive the process that started them), so nobody here can reap them.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import secrets
import signal
import tempfile
from pathlib import Path

from xce_resize_plugin.journal.lmdb_env import PRIVATE_FILE, restrict_mode


def atomic_write(path: Path, data: str | bytes, mode: int = 0o644) -> None:
    """Replace ``path`` with ``data`` atomically: a reader sees the old or the new
    content, never a mix (temporary file in the same directory, fsync, rename)."""
    raw = data.encode() if isinstance(data, str) else data
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(raw)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


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
        with os.fdopen(fd, "w") as fh:
            fh.write(secrets.token_urlsafe(32))
            fh.flush()
            os.fsync(fh.fileno())
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


def group_alive(pgid: int) -> bool:
    """Whether any process of group ``pgid`` still runs (zombies do not count)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        entries = os.listdir("/proc")
    except OSError:
        return True
    for name in entries:
        if not name.isdigit():
            continue
        fields = _stat_fields(int(name))
        # fields: state, ppid, pgrp, ...
        if fields is not None and fields[0] not in ("Z", "X") and int(fields[2]) == pgid:
            return True
    return False


def signal_group(pgid: int, sig: int) -> bool:
    """Send ``sig`` to a process group; ``False`` when the group is gone."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def kill_group_verified(pid: int, ticks: int | None) -> None:
    """SIGKILL the group led by ``pid`` if ``pid`` is still the process we started.

    Used on orphans whose supervisor died: without the start-time check a recycled
    pid could belong to an unrelated process group.
    """
    # The leader gone, its group may live on: a group keeps its id until its last
    # member is gone, so a live group with this id is still the one we started.
    if ticks is not None and not pid_alive(pid, ticks) and not group_alive(pid):
        return
    signal_group(pid, signal.SIGKILL)


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
