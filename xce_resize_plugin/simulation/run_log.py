"""The plugin's warnings during a simulated run, counted instead of printed.

A controller logs a warning per job for some outcomes (a requeue refused past
``max_requeue``, a grow a site policy stopped, a target not reached). That is the right
log for an administrator watching one controller; a simulation of a year of trace would
print thousands of such lines, one per job, on top of its table. A run therefore counts
the records of the package's loggers by their message pattern (the format string, so
"job 1: ..." and "job 2: ..." are one kind) and keeps the first of each kind as it was
written; the report shows one line per kind (``simulate``: docs/simulation.md).

Handlers a program configured itself (on the root logger, say) still receive every
record: the tally only takes the place of Python's last-resort printing to stderr.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from attrs import frozen

#: The package's loggers all live under this name.
PACKAGE_LOGGER = "xce_resize_plugin"


@frozen
class LogSummary:
    """One kind of warning: how often it was logged, and its first record."""

    #: Records of this kind (same logger, same message pattern).
    count: int
    #: The logger's name.
    logger: str
    #: The message pattern (``LogRecord.msg``), e.g. ``"job %s: ...; the job ends"``.
    pattern: str
    #: The first record of this kind, formatted (``LogRecord.getMessage()``).
    first: str

    def to_json(self) -> dict[str, Any]:
        return {
            "count": self.count,
            "logger": self.logger,
            "pattern": self.pattern,
            "first": self.first,
        }


class LogTally(logging.Handler):
    """Counts records by ``(logger, pattern)``, in the order kinds first appear."""

    def __init__(self, level: int = logging.WARNING) -> None:
        super().__init__(level)
        self._kinds: dict[tuple[str, str], list[Any]] = {}

    def emit(self, record: logging.LogRecord) -> None:
        key = (record.name, str(record.msg))
        seen = self._kinds.get(key)
        if seen is not None:
            seen[0] += 1
            return
        try:
            first = record.getMessage()
        except Exception:  # a record whose arguments do not fit its pattern
            first = f"{record.msg!s} {record.args!r}"
        self._kinds[key] = [1, first]

    def restart(self) -> None:
        """Count afresh (a segment of a time-parallel run marks a probe: what it logs
        after it is joined to the run it relieves, .segments)."""
        self._kinds = {}

    def summaries(self) -> tuple[LogSummary, ...]:
        """One :class:`LogSummary` per kind, in the order the kinds first appeared."""
        return tuple(
            LogSummary(count, name, pattern, first)
            for (name, pattern), (count, first) in self._kinds.items()
        )


def format_kinds(title: str, kinds: Sequence[LogSummary]) -> list[str]:
    """Report lines: ``title`` then one line per kind, its count and its first record
    (no lines when there are no kinds)."""
    if not kinds:
        return []
    width = max(len(f"{w.count:,}") for w in kinds)
    return [title, *(f"  {w.count:>{width},}  {w.first}" for w in kinds)]


@contextmanager
def tally_warnings(logger: str = PACKAGE_LOGGER) -> Iterator[LogTally]:
    """Count the warnings (and worse) ``logger`` and its children log in the block."""
    tally = LogTally()
    target = logging.getLogger(logger)
    target.addHandler(tally)
    try:
        yield tally
    finally:
        target.removeHandler(tally)
