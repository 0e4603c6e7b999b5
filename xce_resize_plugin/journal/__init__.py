"""The plugin's LMDB journal: facts + materialised state, group commit, fencing
(docs/journal-format.md), and the one LMDB helper every LMDB store of the project uses.

The journal stores bytes. It knows nothing about the domain models: the engine encodes
facts and states (:mod:`xce_resize_plugin.core.converters`) and hands the bytes over, so
the storage format of a record and the meaning of its payload can evolve separately.
It sits below ``core`` and imports only :mod:`xce_resize_plugin.errors`.

Modules:

- :mod:`~xce_resize_plugin.journal.lmdb_env`: the LMDB helper (durable opening, bounded
  map growth with whole-transaction retry, fencing), also used by the controllers' stores;
- :mod:`~xce_resize_plugin.journal.records`: databases, keys and CRC-sealed records;
- :mod:`~xce_resize_plugin.journal.entries`: :class:`Entry`, :class:`Tail`,
  :class:`StoredState`, what the engine hands over and reads back;
- :mod:`~xce_resize_plugin.journal.files`: opening and checking the files, one
  environment per process (:mod:`~xce_resize_plugin.journal.turn`: its fair lock);
- :mod:`~xce_resize_plugin.journal.journal`: :class:`Journal`;
- :mod:`~xce_resize_plugin.journal.group_commit`: :class:`GroupCommitter`, :class:`Ticket`;
- :mod:`~xce_resize_plugin.journal.verification`, :mod:`~xce_resize_plugin.journal.exporting`,
  :mod:`~xce_resize_plugin.journal.compaction`: the offline tools behind
  ``xce-resize journal verify|export|compact``, and the check a controller makes of
  its journal before it starts (:mod:`~xce_resize_plugin.journal.start_check`:
  :func:`require_intact`); :mod:`~xce_resize_plugin.journal.meta_pages` and
  :mod:`~xce_resize_plugin.journal.page_walk`, the checks of the pages made before
  LMDB reads them (:func:`require_readable`);
- :mod:`~xce_resize_plugin.journal.loading`: :func:`collector_paused`, around the
  decoding of a store's live records at a controller's start.
"""

from __future__ import annotations

from xce_resize_plugin.journal.compaction import compact
from xce_resize_plugin.journal.entries import MAX_JOB_ID_BYTES, Entry, StoredState, Tail
from xce_resize_plugin.journal.exporting import export
from xce_resize_plugin.journal.group_commit import GroupCommitter, Ticket
from xce_resize_plugin.journal.journal import Journal
from xce_resize_plugin.journal.lmdb_env import DEFAULT_MAP_SIZE, Fence, LmdbEnv
from xce_resize_plugin.journal.loading import collector_paused
from xce_resize_plugin.journal.page_walk import require_readable
from xce_resize_plugin.journal.records import SCHEMA
from xce_resize_plugin.journal.start_check import require_intact
from xce_resize_plugin.journal.verification import VerifyReport, verify

__all__ = [
    "DEFAULT_MAP_SIZE",
    "MAX_JOB_ID_BYTES",
    "SCHEMA",
    "Entry",
    "Fence",
    "GroupCommitter",
    "Journal",
    "LmdbEnv",
    "StoredState",
    "Tail",
    "Ticket",
    "VerifyReport",
    "collector_paused",
    "compact",
    "export",
    "require_intact",
    "require_readable",
    "verify",
]
