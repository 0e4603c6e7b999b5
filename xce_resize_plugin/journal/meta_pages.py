"""The two LMDB meta pages of a data file, read without liblmdb, and the check of their pair.

LMDB keeps no checksum on its meta pages (pages 0 and 1) and opens the one with the
higher transaction id. Every completed write transaction N writes meta page ``N & 1``
with txnid N, so a healthy file holds N and N - 1 (a new file: 0 and 0; a compacted copy
made by ``env.copy(compact=True)``: 0 and 1), each on the page of its parity. A damaged
txnid that makes LMDB open the older page would silently roll the journal back a
transaction; :func:`meta_pair_problems` catches every change that breaks the pair, and
docs/journal-format.md ("Meta pages") says which damage it cannot tell from a real
older transaction.
"""

from __future__ import annotations

import struct
import sys
from pathlib import Path
from typing import Final

import attrs

#: LMDB 0.9 on a 64-bit host: the page header, then MDB_meta (magic, version, address,
#: map size, the two MDB_db records (the first one's pad is the page size), last page,
#: txnid), in the host's byte order.
_HEADER: Final = 16
_MAGIC: Final = 0xBEEFC0DE
_ORDER: Final = "<" if sys.byteorder == "little" else ">"
_U32: Final = struct.Struct(_ORDER + "I")
_U64: Final = struct.Struct(_ORDER + "Q")
_MAGIC_AT: Final = _HEADER
_PSIZE_AT: Final = _HEADER + 24
_LAST_PG_AT: Final = _HEADER + 120
_TXNID_AT: Final = _HEADER + 128
_META_END: Final = _TXNID_AT + 8
#: Reads of the pair that may disagree because a writer committed in between.
_READS: Final = 5


@attrs.frozen
class MetaPage:
    """What the pair check needs of one meta page."""

    page: int
    txnid: int
    last_pg: int


def read_metas(data_file: Path) -> tuple[MetaPage, MetaPage] | None:
    """Both meta pages, or ``None`` when the file is not a 64-bit LMDB 0.9 data file
    (opening it says what is wrong; this check has nothing to add)."""
    if sys.maxsize <= 2**32:
        return None  # a 32-bit build lays the meta page out otherwise: not checked
    with open(data_file, "rb") as fh:
        first = fh.read(_META_END)
        if len(first) < _META_END or _U32.unpack_from(first, _MAGIC_AT)[0] != _MAGIC:
            return None
        psize: int = _U32.unpack_from(first, _PSIZE_AT)[0]
        if psize < _META_END or psize & (psize - 1):
            return None
        # Both pages in one read: a writer committing between two reads would show
        # one page from before its commit and one from after.
        fh.seek(0)
        both = fh.read(psize + _META_END)
    if len(both) < psize + _META_END or _U32.unpack_from(both, psize + _MAGIC_AT)[0] != _MAGIC:
        return None  # page 1 is no meta page: opening the file says so
    pages = tuple(
        MetaPage(
            page=n,
            txnid=_U64.unpack_from(both, n * psize + _TXNID_AT)[0],
            last_pg=_U64.unpack_from(both, n * psize + _LAST_PG_AT)[0],
        )
        for n in (0, 1)
    )
    return pages[0], pages[1]


def pair_problems(metas: tuple[MetaPage, MetaPage]) -> list[str]:
    """What is wrong with the pair (empty: nothing this check can see)."""
    zero, one = metas
    if zero.txnid == one.txnid == 0 and zero.last_pg == one.last_pg == 1:
        # A new environment, no transaction committed yet: LMDB writes both pages
        # alike, ending at page 1. A file after transaction 1 whose id went to 0 (which
        # LMDB would open as that empty environment) has a longer page 1.
        return []
    problems = [
        f"meta page {meta.page} holds transaction {meta.txnid}, which LMDB never writes "
        f"to page {meta.page} (transaction N goes to page N mod 2)"
        for meta in metas
        if meta.txnid % 2 != meta.page
    ]
    if abs(zero.txnid - one.txnid) != 1:
        problems.append(
            f"meta pages hold transactions {zero.txnid} and {one.txnid}, not two consecutive ones"
        )
    newer, older = (zero, one) if zero.txnid > one.txnid else (one, zero)
    if newer.last_pg < older.last_pg:
        problems.append(
            f"meta page {newer.page} (transaction {newer.txnid}, the one LMDB opens) ends "
            f"at page {newer.last_pg}, before the end of the older meta page's file "
            f"(page {older.last_pg})"
        )
    return problems


def meta_pair_problems(data_file: Path) -> list[str]:
    """Problems of the meta pair of ``data_file``, each starting "meta pages:".

    Read again while the pages change between reads (a writer committing: the
    controller may be running); damage stays the same from one read to the next.
    """
    previous: tuple[MetaPage, MetaPage] | None = None
    for _ in range(_READS):
        metas = read_metas(data_file)
        if metas is None:
            return []
        problems = pair_problems(metas)
        if not problems:
            return []
        if metas == previous:
            return [f"meta pages: {problem}" for problem in problems]
        previous = metas
    # Different at every read: a writer committing all along, not damage (which reads
    # the same every time).
    return []
