"""Both runs of a workload, rigid and elastic, and their comparison.

:func:`simulate` is what ``xce-resize simulate`` runs: the workload read once, then both
runs, on worker processes where the machine has cores to spare (:mod:`.parallel`) or
one after the other; :class:`Comparison` is their result side by side, the document
``--json`` writes.
"""

from __future__ import annotations

import math
import multiprocessing
import os
from typing import Any

from attrs import frozen

from xce_resize_plugin.simulation.metrics import RunMetrics
from xce_resize_plugin.simulation.parallel import run_both
from xce_resize_plugin.simulation.simulate import (
    FORMAT,
    FORMAT_VERSION,
    MODES,
    ProgressFn,
    RunResult,
    SimOptions,
    Workload,
    load_workload,
    run_mode,
)

__all__ = ["Comparison", "simulate"]


@frozen
class Comparison:
    """Both runs of one simulation, side by side."""

    workload: Workload
    options: SimOptions
    rigid: RunResult
    elastic: RunResult

    @property
    def problems(self) -> list[str]:
        return [f"{r.mode}: {p}" for r in (self.rigid, self.elastic) for p in r.problems]

    def to_json(self) -> dict[str, Any]:
        """The deterministic document ``--json`` writes."""
        w = self.workload
        header = w.trace.header
        return {
            "format": FORMAT,
            "version": FORMAT_VERSION,
            "trace": {
                "source": w.source,
                "format": header.format,
                "computer": header.computer,
                "jobs": len(w.jobs),
                "malleable_jobs": w.malleable,
                "slots": w.capacity,
                "hosts": len(w.hosts),
                "stats": dict(w.trace.stats),
            },
            "options": self.options.to_json(),
            "runs": {"rigid": self.rigid.to_json(), "elastic": self.elastic.to_json()},
            "change": _changes(self.rigid.metrics, self.elastic.metrics),
        }


def _changes(rigid: RunMetrics, elastic: RunMetrics) -> dict[str, float | None]:
    """Relative change of the elastic run against the rigid one, per metric."""
    out: dict[str, float | None] = {}
    for key in (
        "mean_wait",
        "median_wait",
        "mean_turnaround",
        "mean_bounded_slowdown",
        "utilization",
        "makespan",
    ):
        a, b = getattr(rigid, key), getattr(elastic, key)
        out[key] = (b - a) / a if a and math.isfinite(a) and math.isfinite(b) else None
    return out


def simulate(
    path: str | os.PathLike[str],
    options: SimOptions,
    *,
    progress: ProgressFn | None = None,
    parallel: bool | None = None,
    workload: Workload | None = None,
    job_rows: bool = False,
) -> Comparison:
    """Run the trace rigid and elastic and compare them.

    :param parallel: run the two runs in processes of their own, one per core, each
        split in time when a core is free (.parallel; default: when the machine has at
        least two cores and ``fork`` is available). The results are the same.
    :param job_rows: keep one row per job and run (``RunResult.jobs``).
    """
    if workload is None:
        workload = load_workload(path, options)
    if parallel is None:
        parallel = (os.cpu_count() or 1) >= 2 and _can_fork()
    if parallel:
        results = run_both(workload, options, progress, job_rows)
    else:
        results = {
            mode: run_mode(workload, options, mode, progress=progress, job_rows=job_rows)
            for mode in MODES
        }
    return Comparison(workload, options, results["rigid"], results["elastic"])


def _can_fork() -> bool:
    return "fork" in multiprocessing.get_all_start_methods()
