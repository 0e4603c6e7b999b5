"""``journal export``: every fact as a JSON line (also the archive format of compaction)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TextIO

from xce_resize_plugin.journal.journal import Journal


def _fact_json(payload: bytes) -> object:
    """The payload as JSON if it is utf-8 JSON (strict: no NaN), else its hex."""

    def reject(constant: str) -> object:
        raise ValueError(constant)

    try:
        value: object = json.loads(payload.decode("utf-8"), parse_constant=reject)
    except (UnicodeDecodeError, ValueError):
        return {"hex": payload.hex()}
    return value


def export(path: Path | str, out: TextIO) -> int:
    """Write every fact as a JSON line ``{"seq", "job", "fact"}``; return how many.

    ``fact`` is the payload parsed as JSON when it is utf-8 JSON, else ``{"hex": ...}``.
    Opens the journal read-only; a damaged record raises :class:`JournalError`.
    """
    count = 0
    with Journal.open(path, readonly=True) as journal:
        for seq, job_id, payload in journal.facts():
            export_line(out, seq, job_id, payload)
            count += 1
    return count


def export_line(out: TextIO, seq: int, job_id: str, payload: bytes) -> None:
    """Write one fact as an :func:`export` line."""
    line = {"seq": seq, "job": job_id, "fact": _fact_json(payload)}
    out.write(json.dumps(line, ensure_ascii=False, separators=(",", ":")) + "\n")
