"""Write a trace in the Standard Workload Format (what ``simulate --save-swf`` writes).

The header is the trace's own ``Key: value`` lines (``; Version: 2.2`` first, as the
archive's files begin), each data line the 18 fields of SWF 2.2 in the order the
reader (:mod:`.traces`) reads them: job, submit, wait, run time, allocated procs,
average CPU time, used memory, requested procs, requested time, requested memory,
status, user, group, executable, queue, partition, preceding job, think time; what a
:class:`~.traces.TraceJob` does not know is ``-1``. Submit times are written as the
trace holds them (relative to its first job) plus ``header.submit_offset``. Reading the
file back with :func:`~.traces.read_swf` gives the same jobs (tested). A name ending in
``.gz`` is written gzip-compressed (``mtime`` 0, so the same trace gives the same bytes).
"""

from __future__ import annotations

import gzip
import io
import os
from typing import IO

from xce_resize_plugin.simulation.traces import Trace, TraceJob

__all__ = ["write_swf"]


def _num(value: float | int | None) -> str:
    if value is None:
        return "-1"
    if isinstance(value, int) or float(value).is_integer():
        return str(int(value))
    return repr(float(value))


def _line(job: TraceJob, offset: float) -> str:
    user = "-1" if job.user == "unknown" else job.user
    fields = (
        job.id,
        _num(job.submit + offset),
        _num(job.wait),
        _num(job.runtime),
        _num(job.procs),
        "-1",
        "-1",
        _num(job.procs),
        _num(job.requested_time),
        "-1",
        _num(job.status),
        user,
        "-1",
        "-1",
        "-1",
        "-1",
        "-1",
        "-1",
    )
    return " ".join(fields)


def _write(trace: Trace, out: IO[str]) -> None:
    fields = list(trace.header.fields)
    if not any(k == "Version" for k, _ in fields):
        fields.insert(0, ("Version", "2.2"))
    for key, value in fields:
        lines = value.split("\n")
        out.write(f"; {key}: {lines[0]}\n")
        for more in lines[1:]:
            out.write(f";{'':{len(key) + 4}}{more}\n")  # an indented continuation line
    out.write(";\n")
    offset = trace.header.submit_offset
    for job in trace.jobs:
        out.write(_line(job, offset) + "\n")


def write_swf(trace: Trace, path: str | os.PathLike[str]) -> None:
    """Write ``trace`` to ``path`` (gzip when the name ends in ``.gz``)."""
    name = os.fspath(path)
    if name.endswith(".gz"):
        with open(name, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as gz:
            text = io.TextIOWrapper(gz, encoding="utf-8", newline="\n")
            _write(trace, text)
            text.flush()
            text.detach()
        return
    with open(name, "w", encoding="utf-8", newline="\n") as out:
        _write(trace, out)
