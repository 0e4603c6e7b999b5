"""What the engine hands the journal: one job's transition, and what it reads back.

The journal stores bytes: the engine encodes facts, states and history rows
(:mod:`xce_resize_plugin.core.converters`) and these classes carry them, checked as they
are built so that a bad entry fails its own caller before anything is written.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Final, TypeVar

import attrs

from xce_resize_plugin.journal.records import TAILS

#: Longest job id (utf-8 bytes): the ``index`` key adds 9 bytes and LMDB's keys are at
#: most 511 bytes long.
MAX_JOB_ID_BYTES: Final = 500
#: History row indexes are 8-byte unsigned integers in their keys: all below this.
_INDEX_LIMIT: Final = 2**64

_T = TypeVar("_T")


def _check_job_id(_instance: object, _attribute: object, value: str) -> None:
    """Job ids become LMDB keys: non-empty, no NUL (the index separator), short enough."""
    if not value or "\0" in value:
        raise ValueError(f"job_id must be non-empty and contain no NUL: {value!r}")
    if len(value.encode("utf-8")) > MAX_JOB_ID_BYTES:
        raise ValueError(f"job_id longer than {MAX_JOB_ID_BYTES} utf-8 bytes: {value[:40]!r}...")


def _tuple_of(kind: type[_T], value: Iterable[_T], rule: str) -> tuple[_T, ...]:
    """``value`` as a tuple, every item of type ``kind`` (else ``TypeError: rule, ...``)."""
    items = tuple(value)
    for item in items:
        if not isinstance(item, kind):
            raise TypeError(f"{rule}, not {type(item).__name__}")
    return items


def _to_facts(value: Iterable[bytes]) -> tuple[bytes, ...]:
    return _tuple_of(bytes, value, "facts must be bytes")


def _is_time(value: object) -> bool:
    """A finite real number of seconds: a bool is not one, nor are NaN and infinities
    (nor an int too big for the 8-byte float it is stored as)."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def _check_ended_at(_instance: object, _attribute: object, value: float | None) -> None:
    # NaN and +inf compare false with every cutoff, so compaction would never drop the
    # job; -inf would always drop it (docs/journal-format.md: times are finite).
    if value is not None and not _is_time(value):
        raise ValueError(f"ended_at must be a finite number of seconds or None, not {value!r:.60}")


def _check_tail_name(_instance: object, _attribute: object, value: str) -> None:
    if value not in TAILS:
        raise ValueError(f"unknown history sequence {value!r} (known: {', '.join(TAILS)})")


def _check_tail(instance: Tail, _attribute: object, value: int) -> None:
    # Checked here, not when written: a tail that fails in the commit fails every entry
    # of its group-commit batch, and every one queued after it (group_commit.py).
    for bound in (instance.start, value):
        if not isinstance(bound, int) or isinstance(bound, bool):
            raise TypeError(f"a tail's start and stop must be int, not {type(bound).__name__}")
    end = max(instance.start + len(instance.rows), value)
    if not 0 <= instance.start <= value or end > _INDEX_LIMIT:
        raise ValueError(
            f"a tail needs 0 <= start <= stop and rows numbered below 2**64, got start "
            f"{instance.start}, stop {value}, {len(instance.rows)} rows"
        )


@attrs.frozen
class Tail:
    """The end of one of a job's history sequences (``records``: resize records,
    ``charges``: charged-slot steps) as a transition left it.

    ``rows`` replace the stored rows from index ``start`` on; ``stop`` is how many rows
    the sequence had before, so rows ``start + len(rows)`` up to ``stop`` are removed (a
    charge step at the same instant as the one before replaces it). The sequences only
    ever change at their end: a transition writes what changed, not the whole history.
    """

    name: str = attrs.field(validator=_check_tail_name)
    start: int
    rows: tuple[bytes, ...] = attrs.field(converter=_to_facts)
    stop: int = attrs.field(validator=_check_tail)


def _to_tails(value: Iterable[Tail]) -> tuple[Tail, ...]:
    return _tuple_of(Tail, value, "history must be Tail objects")


@attrs.frozen
class Entry:
    """One engine transition of one job: the facts it appends, the job's new state and
    what changed at the end of its history.

    ``ended_at`` is ``None`` while the job is live (its state goes to ``jobs``); a time
    (seconds since the epoch) moves the state to ``done``, out of the recovery path.
    The history (``history`` database) stays where it is either way.
    """

    job_id: str = attrs.field(validator=[attrs.validators.instance_of(str), _check_job_id])
    facts: tuple[bytes, ...] = attrs.field(converter=_to_facts)
    state: bytes = attrs.field(validator=attrs.validators.instance_of(bytes))
    ended_at: float | None = attrs.field(default=None, validator=_check_ended_at)
    history: tuple[Tail, ...] = attrs.field(default=(), converter=_to_tails)


@attrs.frozen
class StoredState:
    """A job's stored state payload and its history rows, each sequence in order."""

    state: bytes
    records: tuple[bytes, ...] = ()
    charges: tuple[bytes, ...] = ()
