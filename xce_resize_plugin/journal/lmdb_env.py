"""The one LMDB helper: how every LMDB store of the project opens, writes and fences.

Three stores use it: the plugin's journal (this package), the simulated controller's own
state (``controllers/store.py``) and the live controller's (``controllers/live/live_store.py``).
:class:`LmdbEnv` wraps one open :class:`lmdb.Environment` and gives them the same rules:

- **opening** with LMDB's durable defaults (``sync=True``, ``metasync=True``; a store
  may give them up for simulations), every failure raised as the store's own error
  naming the data file. An empty data file, or one shorter than its own meta page says,
  is refused before anything reads it: LMDB would start a new environment over the
  first and kill the process with SIGBUS on the second;
- **private files**: the directory is made mode 0700 and ``data.mdb`` and ``lock.mdb``
  0600, whatever the umask (a store holds jobs' commands and environments); looser modes
  found on an existing store are tightened, with a warning naming the path;
- **writing**: a write transaction is a function of the transaction, run whole. On
  ``MapFullError`` the transaction is aborted (nothing of it is kept), the map doubled
  and the function run again on a new transaction. Both the number of growths per
  transaction and the map size are bounded; past either bound the store's error names
  the file and says that nothing was written;
- **fencing**: a write run with a :class:`Fence` first compares the epoch the writer
  holds with the one stored in ``meta``, inside the same transaction, and raises
  :class:`~xce_resize_plugin.errors.FencedError` (writing nothing) when a newer
  controller has taken the state directory since;
- **reading** in a short read transaction, adopting a map grown by another process.

Epochs and other counters are 8-byte big-endian unsigned integers (the stores' bytes on
disk are theirs: this module only reads and writes what they ask for).
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import stat
import struct
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Self, TypeVar

import attrs
import lmdb

from xce_resize_plugin.errors import FencedError, JournalError

__all__ = [
    "DATA_FILE",
    "DEFAULT_MAP_SIZE",
    "EPOCH_KEY",
    "MAX_GROWTHS",
    "MAX_MAP_SIZE",
    "PRIVATE_DIR",
    "PRIVATE_FILE",
    "Fence",
    "LmdbEnv",
    "abort",
    "lmdb_reason",
    "private_dir",
    "restrict_mode",
]

log = logging.getLogger(__name__)

#: Initial map size of every store; the map doubles whenever a transaction does not fit.
DEFAULT_MAP_SIZE: Final = 64 * 1024 * 1024
#: The largest map a store grows to (1 TiB: the map is address space, not disk, and a
#: store this big means something else is wrong).
MAX_MAP_SIZE: Final = 1 << 40
#: Map doublings (or adoptions of a map grown by another process) for one transaction:
#: 2**32 times the initial map is beyond any disk.
MAX_GROWTHS: Final = 32
#: Where the stores keep their epoch, in their ``meta`` database.
EPOCH_KEY: Final = b"epoch"
#: An environment's data file, in its directory (``lock.mdb`` is beside it).
DATA_FILE: Final = "data.mdb"
LOCK_FILE: Final = "lock.mdb"
#: The modes of a store's directory and files (and of the live state directory).
PRIVATE_DIR: Final = 0o700
PRIVATE_FILE: Final = 0o600

_U64: Final = struct.Struct(">Q")

_T = TypeVar("_T")
_E = TypeVar("_E", bound=BaseException)
if TYPE_CHECKING:
    # py-lmdb's stubs make Transaction generic; the runtime class is not subscriptable.
    _Txn = lmdb.Transaction[bytes]
    _Db = lmdb._Database

#: Builds a store's own error (JournalError, StoreError) from a message.
ErrorFactory = Callable[[str], Exception]


def lmdb_reason(exc: BaseException) -> str:
    """An LMDB error as shown in messages: its type and its text."""
    return f"{type(exc).__name__}: {exc}"


def abort(txn: _Txn) -> None:
    """Abort ``txn``, keeping quiet if LMDB ended it already."""
    # After a failed commit LMDB has already ended the transaction; aborting again may
    # raise, and must not hide the original error.
    with contextlib.suppress(lmdb.Error):
        txn.abort()


def private_dir(path: Path, *, error: ErrorFactory = JournalError, name: str | None = None) -> None:
    """Create directory ``path`` (and its missing parents) with mode 0700 whatever the
    umask, or make an existing one 0700 (a looser mode is logged as a warning).

    Failures raise ``error``, the message starting with ``name`` (default: ``path``).
    """
    label = str(path) if name is None else name
    try:
        path.mkdir(mode=PRIVATE_DIR, parents=True, exist_ok=True)
    except OSError as exc:
        raise error(f"{label}: cannot create the directory: {exc}") from exc
    restrict_mode(path, PRIVATE_DIR, label, error)


def restrict_mode(
    path: Path, mode: int, label: str | None = None, error: ErrorFactory = JournalError
) -> None:
    """Give ``path`` exactly ``mode`` if it exists, logging a warning when it was open to
    other users; failures raise ``error``, the message starting with ``label``."""
    try:
        current = stat.S_IMODE(os.stat(path).st_mode)
        if current == mode:
            return
        os.chmod(path, mode)
    except FileNotFoundError:
        return  # lock.mdb of an environment opened without a lock
    except OSError as exc:
        raise error(f"{label or path}: cannot make {path} private (mode {mode:o}): {exc}") from exc
    if current & ~mode & 0o077:
        log.warning("%s: mode was %o, open to other users; made %o", path, current, mode)


def _data_size(data_file: Path, label: str, noun: str, error: ErrorFactory) -> int | None:
    """The data file's size (``None``: no file yet), refusing an empty one."""
    try:
        size = data_file.stat().st_size
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise error(f"{label}: cannot stat the file: {exc}") from exc
    if size == 0:
        # LMDB would silently start a new, empty environment over a zero-length file.
        raise error(
            f"{label}: the file is empty (truncated?); refusing to start {noun} afresh over "
            "it. Move it away only if this is a fresh installation."
        )
    return size


def _lock_file_kind(lock_file: Path, error: ErrorFactory) -> None:
    """Refuse a ``lock.mdb`` that is not a regular file (LMDB's own error named the data
    file, which is not what is wrong)."""
    try:
        mode = lock_file.stat().st_mode
    except FileNotFoundError:
        return  # made by LMDB
    except OSError as exc:
        raise error(f"{lock_file}: cannot stat the file: {exc}") from exc
    if not stat.S_ISREG(mode):
        raise error(f"{lock_file}: not a regular file; LMDB keeps its reader table there")


def _check_size(env: lmdb.Environment, data_file: Path, label: str, error: ErrorFactory) -> None:
    """Refuse a data file shorter than its own meta page says it is.

    LMDB maps the file and does not check this: reading a page past the end of a
    truncated file kills the process with SIGBUS instead of raising.
    """
    try:
        needed = (env.info()["last_pgno"] + 1) * env.stat()["psize"]
        actual = data_file.stat().st_size
    except (lmdb.Error, OSError) as exc:
        raise error(f"{label}: cannot read the file ({lmdb_reason(exc)})") from exc
    if actual < needed:
        raise error(
            f"{label}: truncated: {actual} bytes on disk, but its last page ends at byte {needed}"
        )


@attrs.frozen
class _Where:
    """An environment about to be opened, and how its failures are worded."""

    path: Path
    label: str
    noun: str
    failure: str

    def open(self, error: ErrorFactory, **options: Any) -> lmdb.Environment:
        """``lmdb.open`` in the directory with ``options``, new files 0600; a failure
        is ``error`` naming :attr:`label`. An environment still open in this process
        by an object nobody refers to any more is collected and the open tried again."""

        def attempt() -> lmdb.Environment:
            return lmdb.open(str(self.path), subdir=True, mode=PRIVATE_FILE, **options)

        try:
            try:
                return attempt()
            except lmdb.Error as exc:
                if "already open" not in str(exc):
                    raise
                gc.collect()
                return attempt()
        except lmdb.Error as exc:
            if "already open" in str(exc):
                raise error(
                    f"{self.label}: {self.noun} is still open in this process; close() the "
                    "old controller or drop every reference to it first"
                ) from exc
            raise error(f"{self.label}: {self.failure} ({lmdb_reason(exc)})") from exc


@attrs.frozen
class Fence:
    """The epoch a writer holds and where the current epoch is stored.

    ``subject`` and ``advice`` word the :class:`FencedError` (each store says it its
    own way); ``required`` says whether a missing epoch is damage (the journal writes
    it when created) or 0 (a store that takes its first epoch on first opening).
    """

    db: _Db
    epoch: int = 0
    key: bytes = EPOCH_KEY
    subject: str = "the state"
    advice: str = ""
    required: bool = False

    def fenced(self, name: str, stored: int) -> FencedError:
        """The error a writer holding :attr:`epoch` gets when ``stored`` is newer."""
        return FencedError(
            f"{name}: this controller holds epoch {self.epoch} but {self.subject} is at "
            f"epoch {stored}: a newer controller has started on this state directory"
            f"{self.advice}"
        )


def failed_write(exc: _E) -> _E:
    """Mark ``exc`` as a write to the disk that did not happen (LMDB could not begin,
    grow or commit a write transaction): what the live controller takes for a failing
    disk (docs/live-controller.md, "When the state cannot be written"). A record that
    cannot be read or decoded, or a value that cannot be encoded, is not one: that is
    the one request's failure, not every user's."""
    exc.failed_write = True  # type: ignore[attr-defined]
    return exc


def is_failed_write(exc: BaseException) -> bool:
    """Whether :func:`failed_write` marked ``exc``."""
    return getattr(exc, "failed_write", False) is True


@attrs.define(eq=False)
class LmdbEnv:
    """One open LMDB environment of a store (see the module docstring).

    ``name`` starts every message (the store's data file or directory), ``noun`` says
    what the store is ("the journal"), ``error`` builds the store's error. Not
    thread-safe by itself: a store serialises its calls (the journal takes turns, the
    controllers hold their lock), which also keeps every transaction of this process
    closed while the map changes size, as LMDB requires.
    """

    env: lmdb.Environment
    name: str
    noun: str = attrs.field(kw_only=True)
    error: ErrorFactory = attrs.field(default=JournalError, kw_only=True)
    max_map_size: int = attrs.field(default=MAX_MAP_SIZE, kw_only=True)
    max_growths: int = attrs.field(default=MAX_GROWTHS, kw_only=True)

    @classmethod
    def open(
        cls,
        path: Path,
        *,
        noun: str,
        name: str | None = None,
        error: ErrorFactory = JournalError,
        unusable: str | None = None,
        map_size: int = DEFAULT_MAP_SIZE,
        max_map_size: int = MAX_MAP_SIZE,
        max_growths: int = MAX_GROWTHS,
        max_dbs: int,
        sync: bool = True,
        metasync: bool = True,
        readonly: bool = False,
        lock: bool = True,
    ) -> Self:
        """Open (creating it and its directory unless ``readonly``) the environment in
        directory ``path``.

        ``sync`` and ``metasync`` are LMDB's durable defaults. Never ``writemap``: its
        writes go through the memory map into a sparse file, and a page a full disk
        cannot back kills the process with SIGBUS, without a word; written with
        write(2), a full disk is an error naming the file (reserving the map instead
        took real disk for every environment: 22 GB for the test suite). A failure
        raises ``error``: "``name``: ``unusable`` (reason)",
        ``name`` being the data file unless given and ``unusable`` "cannot open
        ``noun``" unless given. An empty or truncated data file is refused before
        LMDB reads it. Unless ``readonly``, the directory and the files are made
        private (see the module docstring). When the environment is already open in
        this process by an object nobody refers to any more (a controller dropped
        without ``close()``, as a simulated crash does), the cycle collector frees it
        and the open is tried once more.
        """
        data_file = path / DATA_FILE
        label = str(data_file) if name is None else name
        where = _Where(path, label, noun, f"cannot open {noun}" if unusable is None else unusable)
        if not readonly:
            private_dir(path, error=error, name=label)
        _data_size(data_file, label, noun, error)
        if lock:
            _lock_file_kind(path / LOCK_FILE, error)
        env = where.open(
            error,
            map_size=map_size,
            readonly=readonly,
            sync=sync,
            metasync=metasync,
            create=not readonly,
            max_dbs=max_dbs,
            lock=lock,
        )
        try:
            _check_size(env, data_file, label, error)
            if not readonly:
                for file in (data_file, path / LOCK_FILE):
                    restrict_mode(file, PRIVATE_FILE, label, error)
        except BaseException:
            env.close()
            raise
        return cls(
            env,
            label,
            noun=noun,
            error=error,
            max_map_size=max_map_size,
            max_growths=max_growths,
        )

    def close(self) -> None:
        """Close the environment (every database handle of it becomes invalid)."""
        self.env.close()

    def open_db(self, name: bytes) -> _Db:
        """The named database, created if missing (in a writable environment)."""
        try:
            return self.env.open_db(name)
        except lmdb.Error as exc:
            raise self.fail(f"open the {name.decode()} database", exc) from exc

    @property
    def map_size(self) -> int:
        """The current map size in bytes."""
        return self.env.info()["map_size"]

    def fail(self, what: str, exc: BaseException) -> Exception:
        """The store's error for an LMDB failure: "``name``: cannot ``what`` (reason)"."""
        return self.error(f"{self.name}: cannot {what} ({lmdb_reason(exc)})")

    def write_fail(self, what: str, exc: BaseException) -> Exception:
        """:meth:`fail` for a write that did not happen (:func:`failed_write`)."""
        return failed_write(self.fail(what, exc))

    # -- transactions

    def read(self, fn: Callable[[_Txn], _T]) -> _T:
        """Run ``fn`` in a read transaction; the values it returns are copies (bytes)."""
        for _ in range(self.max_growths):
            try:
                with self.env.begin(buffers=False) as txn:
                    return fn(txn)
            except lmdb.MapResizedError:
                # Another process grew the map: adopt its size, then try again.
                self.set_map_size(0)
            except lmdb.ReadersFullError as exc:
                if not self._clear_stale_readers():
                    raise self.fail(f"read {self.noun}", exc) from exc
            except lmdb.Error as exc:
                raise self.fail(f"read {self.noun}", exc) from exc
        raise self.error(f"{self.name}: the map keeps changing size under this reader")

    def write(self, fn: Callable[[_Txn], _T], fence: Fence | None = None) -> _T:
        """Run ``fn`` in one write transaction and commit it, growing the map as needed.

        With a ``fence``, the stored epoch is checked first in the same transaction
        (:class:`FencedError`, nothing written, when it is not the fence's). ``fn`` must
        be repeatable: on ``MapFullError`` the transaction is aborted, the map doubled
        and ``fn`` run again from the start on a new transaction, at most
        :attr:`max_growths` times and up to :attr:`max_map_size` bytes; past that the
        store's error says so and nothing of the transaction is written.
        """
        for _ in range(self.max_growths + 1):
            try:
                txn = self.env.begin(write=True)
            except lmdb.MapResizedError:
                self.set_map_size(0)  # another process grew it: adopt, begin again
                continue
            except lmdb.Error as exc:
                raise self.write_fail("begin a write transaction", exc) from exc
            try:
                if fence is not None:
                    self.check_fence(txn, fence)
                result = fn(txn)
                txn.commit()
            except lmdb.MapFullError:
                abort(txn)
                self._grow()
                continue
            except lmdb.Error as exc:
                abort(txn)
                raise self.write_fail(f"write {self.noun}", exc) from exc
            except BaseException:
                abort(txn)
                raise
            return result
        raise failed_write(
            self.error(
                f"{self.name}: a transaction does not fit even after growing the map "
                f"{self.max_growths} times (now {self.map_size} bytes); nothing of it was "
                "written"
            )
        )

    def set_map_size(self, size: int) -> None:
        """Set the map size (0: adopt the size another process set); no transaction of
        this process may be open."""
        try:
            self.env.set_mapsize(size)
        except lmdb.Error as exc:
            raise self.fail(f"set the map size to {size or 'the current size'}", exc) from exc

    def _grow(self) -> None:
        if self._clear_stale_readers():
            return  # the pages they held are free again: try before growing
        old = self.map_size
        if old >= self.max_map_size:
            raise failed_write(
                self.error(
                    f"{self.name}: the map is full at {old} bytes, the most it may grow to; "
                    "nothing of this transaction was written"
                )
            )
        new = min(old * 2, self.max_map_size)
        try:
            self.set_map_size(new)
        except Exception as exc:
            raise failed_write(exc) from None
        log.info("%s: map full, grown from %d to %d bytes", self.name, old, new)

    def _clear_stale_readers(self) -> int:
        """Free the reader slots of processes that died inside a read transaction
        (``kill -9`` of a ``journal verify``); how many were freed.

        LMDB keeps such a slot, and every page its snapshot could see, until a reader
        check: the map would keep doubling, and once every slot is taken no one could
        read. LMDB makes the check only when the first process opens the files.
        """
        try:
            cleared = self.env.reader_check()
        except lmdb.Error as exc:
            raise self.fail("check the reader table", exc) from exc
        if cleared:
            log.warning(
                "%s: cleared %d reader slot(s) left by processes that died reading it",
                self.name,
                cleared,
            )
        return cleared

    # -- counters and fencing

    def get_u64(self, txn: _Txn, db: _Db, key: bytes, default: int | None = None) -> int:
        """The 8-byte counter ``key`` of ``db``; ``default`` if absent (``None``: absent
        is damage, as is a value of another length)."""
        raw = txn.get(key, db=db)
        if raw is None and default is not None:
            return default
        if raw is None or len(raw) != _U64.size:
            raise self.error(f"{self.name}: damaged: meta {key.decode()} is missing or invalid")
        value: int = _U64.unpack(raw)[0]
        return value

    def put_u64(self, txn: _Txn, db: _Db, key: bytes, value: int) -> None:
        """Store the 8-byte counter ``key`` of ``db``; a value it cannot hold is the
        store's error (a counter one short of 2**64 is damage, not history)."""
        if not 0 <= value < 1 << 64:
            raise self.error(
                f"{self.name}: damaged: {key.decode()} cannot go to {value}, past the "
                "largest 8-byte counter (is its stored value damaged?); nothing was written"
            )
        txn.put(key, _U64.pack(value), db=db)

    def stored_epoch(self, txn: _Txn, fence: Fence) -> int:
        """The epoch stored where ``fence`` keeps it, read in ``txn``."""
        return self.get_u64(txn, fence.db, fence.key, None if fence.required else 0)

    def check_fence(self, txn: _Txn, fence: Fence) -> None:
        """Raise :class:`FencedError` if the epoch in ``txn`` is not ``fence``'s."""
        stored = self.stored_epoch(txn, fence)
        if stored != fence.epoch:
            raise fence.fenced(self.name, stored)

    def take_epoch(self, fence: Fence) -> Fence:
        """Durably take the next epoch where ``fence`` keeps it; the fence holding it.

        From then on, writes fenced with an earlier epoch fail: a controller calls this
        once when it starts.
        """

        def bump(txn: _Txn) -> int:
            epoch = self.stored_epoch(txn, fence) + 1
            self.put_u64(txn, fence.db, fence.key, epoch)
            return epoch

        return attrs.evolve(fence, epoch=self.write(bump))
