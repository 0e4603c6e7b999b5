"""The journal's files: opened and checked before they are trusted, shared in the process.

Opening refuses what LMDB would accept silently (an empty or truncated data file, which
the LMDB helper refuses for every store; an environment that is not a journal; a schema
this version does not read) and creates a journal only in an empty environment. One
process must not open the same environment twice (LMDB's locks are per process and
file; py-lmdb refuses it), so every journal handle on the same files in this process
shares one :class:`SharedEnv`, reference-counted and found by the data file's identity.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from pathlib import Path
from typing import TYPE_CHECKING

import attrs
import lmdb

from xce_resize_plugin.errors import JournalError
from xce_resize_plugin.journal.lmdb_env import LmdbEnv, failed_write, lmdb_reason
from xce_resize_plugin.journal.records import (
    DATA_FILE,
    DB_NAMES,
    EPOCH_KEY,
    FACTS,
    LAST_SEQ_KEY,
    META,
    REMOVED_KEY,
    SCHEMA,
    SCHEMA_KEY,
    U64,
    UPGRADABLE,
)
from xce_resize_plugin.journal.turn import TurnLock

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    _Db = lmdb._Database


@attrs.define(eq=False)
class SharedEnv:
    """One open environment and what every handle on it in this process shares."""

    env: LmdbEnv
    file: str
    key: tuple[int, int]
    readonly: bool
    sync: bool
    dbs: dict[str, _Db]
    users: int = 0
    turn: TurnLock = attrs.field(factory=TurnLock)


_REGISTRY: dict[tuple[int, int], SharedEnv] = {}
_REGISTRY_LOCK = threading.Lock()


def _file_key(data_file: Path) -> tuple[int, int] | None:
    """Identity of the data file: the same files under another path are the same env."""
    try:
        st = data_file.stat()
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


def acquire(path: Path, *, map_size: int, sync: bool, readonly: bool) -> SharedEnv:
    """The shared environment of the journal in directory ``path``, opened if needed;
    release it with :func:`release`."""
    data_file = path / DATA_FILE
    with _REGISTRY_LOCK:
        key = _file_key(data_file)
        shared = _REGISTRY.get(key) if key is not None else None
        if shared is None:
            shared = _open_env(path, data_file, map_size=map_size, sync=sync, readonly=readonly)
            _REGISTRY[shared.key] = shared
        elif shared.readonly and not readonly:
            _reopen_writable(shared, path, data_file, map_size=map_size, sync=sync)
        shared.users += 1
        return shared


def _reopen_writable(
    shared: SharedEnv, path: Path, data_file: Path, *, map_size: int, sync: bool
) -> None:
    """Swap a read-only environment for a writable one under its existing handles.

    The files cannot be opened twice in one process, so the read-only environment is
    closed and the same files opened for writing; the read-only handles keep working
    (they refuse writes themselves). Called with the registry lock held.
    """
    with shared.turn:
        shared.env.close()
        try:
            fresh = _open_env(path, data_file, map_size=map_size, sync=sync, readonly=False)
        except BaseException:
            # Give the existing handles their environment back before reporting.
            with contextlib.suppress(JournalError):
                old = _open_env(path, data_file, map_size=map_size, sync=sync, readonly=True)
                shared.env, shared.dbs = old.env, old.dbs
            raise
        shared.env, shared.dbs, shared.readonly, shared.sync = fresh.env, fresh.dbs, False, sync


def release(shared: SharedEnv) -> None:
    """Drop one handle's share; the environment closes with the last one."""
    # Closed under the registry lock: an open() racing with the last close() must find
    # either the registered environment or none at all, never one still closing (which
    # py-lmdb would refuse as "already open in this process").
    with _REGISTRY_LOCK:
        shared.users -= 1
        if shared.users:
            return
        if _REGISTRY.get(shared.key) is shared:
            del _REGISTRY[shared.key]
        with shared.turn:
            shared.env.close()


def _open_env(
    path: Path, data_file: Path, *, map_size: int, sync: bool, readonly: bool
) -> SharedEnv:
    """Open and check the environment; create a fresh journal only in an empty one.

    The LMDB helper refuses an empty or truncated data file (before LMDB reads it) and
    makes the directory and files private; what is checked here is what makes the
    environment a journal.
    """
    if readonly and not data_file.is_file():
        raise JournalError(f"{data_file}: no journal here (the file does not exist)")
    env = _lmdb(path, data_file, map_size=map_size, sync=sync, readonly=readonly)
    try:
        dbs = _open_dbs(env.env, data_file, readonly=readonly)
        key = _file_key(data_file)
        if key is None:
            raise JournalError(f"{data_file}: the file disappeared while opening it")
    except BaseException:
        env.close()
        raise
    return SharedEnv(env=env, file=str(data_file), key=key, readonly=readonly, sync=sync, dbs=dbs)


def _lmdb(path: Path, data_file: Path, *, readonly: bool, map_size: int, sync: bool) -> LmdbEnv:
    """The journal's environment through the LMDB helper: ``metasync`` always (and never
    ``writemap``: :meth:`~.lmdb_env.LmdbEnv.open`)."""
    return LmdbEnv.open(
        path,
        name=str(data_file),
        noun="the journal",
        unusable="not a usable LMDB environment",
        map_size=map_size,
        max_dbs=len(DB_NAMES) + 1,
        sync=sync,
        metasync=True,
        readonly=readonly,
    )


def _open_dbs(env: lmdb.Environment, data_file: Path, *, readonly: bool) -> dict[str, _Db]:
    """Open the named databases; initialise a journal only in an empty environment."""
    try:
        with env.begin() as txn:
            has_meta = txn.get(META.encode()) is not None
            empty = not txn.cursor().first()
    except lmdb.Error as exc:
        raise JournalError(f"{data_file}: damaged ({lmdb_reason(exc)})") from exc
    if not has_meta and not empty:
        raise JournalError(
            f"{data_file}: an LMDB environment, but not a journal (no meta database)"
        )
    if not has_meta and readonly:
        raise JournalError(f"{data_file}: an empty LMDB environment, not a journal yet")
    if has_meta:
        schema = _check_schema(env, data_file)
        dbs = _existing_dbs(env, data_file)
        if schema != SCHEMA and not readonly:
            _upgrade(env, dbs, data_file, schema)
    else:
        dbs = _create_dbs(env, data_file)
    _check_schema(env, data_file)
    return dbs


def _upgrade(env: lmdb.Environment, dbs: dict[str, _Db], data_file: Path, schema: int) -> None:
    """Mark a journal of an older schema this version reads (``UPGRADABLE``) as of this
    one, before anything of the new schema is written to it: from then on an older
    version refuses it as newer instead of failing on a fact it does not know."""
    try:
        with env.begin(write=True) as txn:
            txn.put(SCHEMA_KEY, U64.pack(SCHEMA), db=dbs[META])
    except lmdb.Error as exc:
        raise failed_write(  # a write that did not happen: a failing disk's
            JournalError(
                f"{data_file}: cannot upgrade journal schema {schema} to {SCHEMA} "
                f"({lmdb_reason(exc)})"
            )
        ) from exc
    log.info("%s: journal schema %s upgraded to %s", data_file, schema, SCHEMA)


def _existing_dbs(env: lmdb.Environment, data_file: Path) -> dict[str, _Db]:
    dbs: dict[str, _Db] = {}
    for name in DB_NAMES:
        try:
            dbs[name] = env.open_db(name.encode(), create=False)
        except lmdb.NotFoundError:
            raise JournalError(f"{data_file}: damaged: the {name} database is missing") from None
        except lmdb.Error as exc:
            raise JournalError(
                f"{data_file}: cannot open the {name} database ({lmdb_reason(exc)})"
            ) from exc
    return dbs


def _create_dbs(env: lmdb.Environment, data_file: Path) -> dict[str, _Db]:
    dbs: dict[str, _Db] = {}
    try:
        with env.begin(write=True) as txn:
            for name in DB_NAMES:
                dbs[name] = env.open_db(name.encode(), txn=txn, create=True)
            # overwrite=False: a second process initialising at the same moment must
            # not reset an epoch the first one has already taken.
            for key in (SCHEMA_KEY, EPOCH_KEY, LAST_SEQ_KEY, REMOVED_KEY):
                value = SCHEMA if key == SCHEMA_KEY else 0
                txn.put(key, U64.pack(value), db=dbs[META], overwrite=False)
    except lmdb.Error as exc:
        raise failed_write(  # a write that did not happen: a failing disk's
            JournalError(f"{data_file}: cannot initialise a new journal ({lmdb_reason(exc)})")
        ) from exc
    return dbs


def _check_schema(env: lmdb.Environment, data_file: Path) -> int:
    """Refuse a journal of a schema this version does not read before opening its
    databases (a different schema may have different ones); return its schema."""
    try:
        meta = env.open_db(META.encode(), create=False)
        with env.begin() as txn:
            raw = txn.get(SCHEMA_KEY, db=meta)
            # Named databases are keys of the main one: a store without the journal's
            # facts is another LMDB store (the live controller's), not a damaged journal.
            journal = txn.get(FACTS.encode()) is not None
    except lmdb.Error as exc:
        raise JournalError(f"{data_file}: damaged ({lmdb_reason(exc)})") from exc
    if not journal:
        raise JournalError(
            f"{data_file}: not a plugin journal (an LMDB store without its facts "
            "database: another store's directory?)"
        )
    if raw is None or len(raw) != U64.size:
        raise JournalError(f"{data_file}: damaged: meta has no valid schema version")
    schema: int = U64.unpack(raw)[0]
    if schema > SCHEMA:
        raise JournalError(
            f"{data_file}: written by a newer version (journal schema {schema}, this version "
            f"reads up to {SCHEMA}); upgrade xce_resize_plugin"
        )
    if schema == 1:
        raise JournalError(
            f"{data_file}: journal schema 1, written by an earlier development version of "
            f"xce_resize_plugin (this version reads schemas 2 to {SCHEMA}); export its facts "
            "with that version (`xce-resize journal export`) and start from a new state "
            "directory"
        )
    if schema < 1 or (schema != SCHEMA and schema not in UPGRADABLE):
        raise JournalError(f"{data_file}: unknown journal schema {schema}")
    return schema
