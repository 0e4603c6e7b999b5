"""What every trace reader returns: the cleaned jobs, the header, the read trace.

The readers (:mod:`.swf`, :mod:`.elastisim`) build these; :mod:`.traces` picks the
reader by file name and is where callers import them from.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from typing import IO, Literal, TypeAlias

import attrs

from xce_resize_plugin.errors import ConfigError

TraceKind: TypeAlias = Literal["rigid", "moldable", "malleable"]

#: What a reader reads from: a path, a binary stream or a text stream.
Source: TypeAlias = "str | os.PathLike[str] | IO[bytes] | IO[str]"


class TraceError(ConfigError):
    """A trace file cannot be read; the detail names the file and the line or job."""

    message = "Trace error"

    def __init__(
        self,
        reason: str,
        *,
        source: str | None = None,
        line: int | None = None,
        job_index: int | None = None,
    ) -> None:
        self.source = source
        self.line = line
        self.job_index = job_index
        self.reason = reason
        where = source or "<trace>"
        if line is not None:
            where = f"{where}:{line}"
        if job_index is not None:
            where = f"{where}: job {job_index}"
        super().__init__(f"{where}: {reason}")


@attrs.frozen
class TraceJob:
    """One cleaned job of a trace.

    Times are seconds; ``submit`` is relative to the trace's first job (0 for it).
    ``procs`` is the size to run it at; ``min_procs``/``max_procs`` are set only when the
    trace itself says how flexible the job is (ElastiSim), ``None`` when it does not
    (SWF): the malleable conversion decides for those. ``wait`` and ``status`` are the
    recorded values, for comparison with a simulation.
    """

    id: str
    submit: float
    runtime: float
    procs: int
    requested_time: float | None = None
    user: str = "unknown"
    kind: TraceKind = "rigid"
    min_procs: int | None = None
    max_procs: int | None = None
    wait: float | None = None
    status: int | None = None


@attrs.frozen
class TraceHeader:
    """What a trace says about itself.

    For SWF the named attributes are the standard header keys; ``fields`` keeps every
    ``Key: value`` line in file order (repeated keys such as ``Queue`` and ``Note``
    included; continuation lines joined to their value with a newline). ``notes`` are
    the ``Note`` values. ``submit_offset`` is the original submit time of the first
    kept job (output submit times are relative to it).
    """

    format: Literal["swf", "elastisim"]
    version: str | None = None
    computer: str | None = None
    installation: str | None = None
    acknowledge: str | None = None
    information: tuple[str, ...] = ()
    conversion: str | None = None
    max_jobs: int | None = None
    max_records: int | None = None
    max_nodes: int | None = None
    max_procs: int | None = None
    unix_start_time: int | None = None
    time_zone: int | None = None
    time_zone_string: str | None = None
    start_time: str | None = None
    end_time: str | None = None
    notes: tuple[str, ...] = ()
    queues: tuple[str, ...] = ()
    partitions: tuple[str, ...] = ()
    fields: tuple[tuple[str, str], ...] = ()
    submit_offset: float = 0.0

    def get(self, key: str) -> str | None:
        """The first value of header key ``key`` (case-insensitive), or ``None``."""
        values = self.get_all(key)
        return values[0] if values else None

    def get_all(self, key: str) -> tuple[str, ...]:
        """Every value of header key ``key`` (case-insensitive), in file order."""
        k = key.lower()
        return tuple(v for name, v in self.fields if name.lower() == k)


class Trace:
    """A read trace: ``header``, ``jobs`` (sorted by submit), ``stats`` and ``source``.

    Iterating yields the jobs; ``len()`` is their number. The jobs are held in memory
    (about 250 bytes each: a year-long trace is tens of MB) because the submit-order
    guarantee needs the whole trace before the first job can be handed out.
    """

    __slots__ = ("header", "jobs", "source", "stats")

    def __init__(
        self,
        header: TraceHeader,
        jobs: Sequence[TraceJob],
        stats: Mapping[str, int],
        source: str,
    ) -> None:
        self.header = header
        self.jobs: tuple[TraceJob, ...] = tuple(jobs)
        self.stats: dict[str, int] = dict(stats)
        self.source = source

    def __iter__(self) -> Iterator[TraceJob]:
        return iter(self.jobs)

    def __len__(self) -> int:
        return len(self.jobs)

    def __repr__(self) -> str:
        return f"Trace({self.source!r}, {len(self.jobs)} jobs, stats={self.stats!r})"


def check_limit(limit: int | None, source: str) -> None:
    """A reader's ``limit``: ``None`` or a non-negative integer."""
    if limit is not None and (isinstance(limit, bool) or limit < 0):
        raise TraceError(f"limit must be a non-negative integer, not {limit!r}", source=source)
