"""Readers for real workload traces: the Standard Workload Format and ElastiSim jobs.

Pure parsing: no simulation, no randomness, no global state. Every reader returns a
:class:`Trace` — the header (:class:`TraceHeader`), the cleaned jobs (:class:`TraceJob`,
sorted by submit time, submit times relative to the first job) and counters of what the
cleaning did (``trace.stats``). :func:`read_trace` picks the reader by file name.

- SWF (``.swf``, ``.swf.gz``): :func:`read_swf` (:mod:`.swf`, whose docstring gives
  the fields read and the cleaning rule);
- ElastiSim (``jobs.json``): :func:`read_elastisim` (:mod:`.elastisim`, whose docstring
  gives the mapping and how run times are derived from application models).

The types every reader returns are in :mod:`.trace_types`; this module re-exports
them and the readers, so that callers import from one place.
"""

from __future__ import annotations

import os
from pathlib import Path

from xce_resize_plugin.simulation.elastisim import DEFAULT_NODE_FLOPS as DEFAULT_NODE_FLOPS
from xce_resize_plugin.simulation.elastisim import read_elastisim as read_elastisim
from xce_resize_plugin.simulation.swf import read_swf as read_swf
from xce_resize_plugin.simulation.trace_types import Trace as Trace
from xce_resize_plugin.simulation.trace_types import TraceError as TraceError
from xce_resize_plugin.simulation.trace_types import TraceHeader as TraceHeader
from xce_resize_plugin.simulation.trace_types import TraceJob as TraceJob
from xce_resize_plugin.simulation.trace_types import TraceKind as TraceKind

__all__ = [
    "DEFAULT_NODE_FLOPS",
    "Trace",
    "TraceError",
    "TraceHeader",
    "TraceJob",
    "TraceKind",
    "read_elastisim",
    "read_swf",
    "read_trace",
]


def read_trace(path: str | os.PathLike[str], limit: int | None = None) -> Trace:
    """Read a trace, choosing the reader by name.

    ``.swf`` and ``.swf.gz`` → :func:`read_swf`; ``.json`` → :func:`read_elastisim`; a
    directory holding ``jobs.json`` (an ElastiSim project's input) → its ``jobs.json``.
    Anything else raises :class:`TraceError`.
    """
    p = Path(path)
    name = p.name.lower()
    if p.is_dir():
        jobs = p / "jobs.json"
        if jobs.is_file():
            return read_elastisim(jobs, limit=limit)
        raise TraceError("a directory trace must contain jobs.json", source=str(p))
    if name.endswith((".swf", ".swf.gz")):
        return read_swf(p, limit=limit)
    if name.endswith(".json"):
        return read_elastisim(p, limit=limit)
    raise TraceError(
        "unknown trace format (expected .swf, .swf.gz, an ElastiSim .json or a directory "
        "with jobs.json)",
        source=str(p),
    )
