"""``journal export``: every fact as a JSON line (also the archive format of compaction)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TextIO

from xce_resize_plugin.journal.journal import Journal
from xce_resize_plugin.journal.page_walk import require_readable


def _fact_json(payload: bytes) -> object:
    """The payload as JSON if it is utf-8 JSON (strict: no NaN), else its hex."""

    def reject(constant: str) -> object:
        raise ValueError(constant)

    try:
        value: object = json.loads(payload.decode("utf-8"), parse_constant=reject)
    except (UnicodeDecodeError, ValueError, RecursionError):
        # RecursionError: a record nested deeper than the parser goes is not a fact
        # either; it must not stop the export of the rest.
        return {"hex": payload.hex()}
    return value


def export(path: Path | str, out: TextIO, *, checked: bool = False) -> int:
    """Write every fact as a JSON line ``{"seq", "job", "fact"}``; return how many.

    ``fact`` is the payload parsed as JSON when it is utf-8 JSON, else ``{"hex": ...}``.
    Opens the journal read-only; a damaged record raises :class:`JournalError`. The
    meta pages and the page structure are checked first (a damaged page would kill the
    process reading it through LMDB), unless the caller has (``checked``): damage
    raises :class:`JournalError` before anything is written.
    """
    if not checked:
        require_readable(path, "nothing was exported")
    count = 0
    with Journal.open(path, readonly=True) as journal:
        for seq, job_id, payload in journal.facts():
            export_line(out, seq, job_id, payload)
            count += 1
    return count


def export_line(out: TextIO, seq: int, job_id: str, payload: bytes) -> None:
    """Write one fact as an :func:`export` line."""
    fact = _fact_json(payload)
    try:
        line = _line(seq, job_id, fact)
    except (ValueError, RecursionError):
        # Parsed, but not writable as strict utf-8 JSON: a number too big for a float
        # (1e999 would come out as Infinity), a lone surrogate escape (\ud800, which
        # no utf-8 file can hold), or nested just too deep to write back. The record
        # is kept whole, as hex.
        line = _line(seq, job_id, {"hex": payload.hex()})
    out.write(line + "\n")


def _line(seq: int, job_id: str, fact: object) -> str:
    """One export line; ``ValueError`` unless it is strict JSON encodable as utf-8."""
    line = json.dumps(
        {"seq": seq, "job": job_id, "fact": fact},
        ensure_ascii=False,
        separators=(",", ":"),
        allow_nan=False,
    )
    line.encode("utf-8")  # UnicodeEncodeError (a ValueError) on a lone surrogate
    return line
