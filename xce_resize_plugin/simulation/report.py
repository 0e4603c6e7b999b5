"""What ``xce-resize simulate`` shows: the side-by-side table.

The table is for people (stdout); ``--json`` is for scripts
(:meth:`~.comparison.Comparison.to_json`). The progress bars are :mod:`.progress`.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from xce_resize_plugin.simulation.run_log import format_kinds

if TYPE_CHECKING:
    from xce_resize_plugin.simulation.comparison import Comparison
    from xce_resize_plugin.simulation.simulate import RunResult

__all__ = ["format_table"]


def _num(value: float, digits: int = 1) -> str:
    if not math.isfinite(value):
        return "-"
    return f"{value:,.{digits}f}"


def _change(a: float, b: float) -> str:
    if not (math.isfinite(a) and math.isfinite(b)) or a == 0:
        return ""
    return f"{(b - a) / a * 100:+.1f}%"


def _duration(seconds: float) -> str:
    """``1d 02:03:04`` style, for the makespan."""
    if not math.isfinite(seconds):
        return "-"
    days, rest = divmod(round(seconds), 86400)
    h, rest = divmod(rest, 3600)
    m, s = divmod(rest, 60)
    return f"{days}d {h:02d}:{m:02d}:{s:02d}"


def format_table(comparison: Comparison) -> str:
    """The comparison as a text table (what ``simulate`` prints without ``--json``)."""
    w, o = comparison.workload, comparison.options
    a, b = comparison.rigid.metrics, comparison.elastic.metrics
    name = w.source.rsplit("/", 1)[-1]
    sph = {n for _, n in w.hosts}
    hosts = f"{len(w.hosts):,} host" + ("" if len(w.hosts) == 1 else "s")
    per_host = f"{hosts} x {max(sph)}" if len(sph) == 1 else hosts
    # Jobs whose trace fixed their kind and range (ElastiSim) are not chosen by the
    # fraction (simulation/malleable.py): saying "20% chosen" of them would mislead.
    fixed = sum(1 for j in w.trace.jobs if j.min_procs is not None or j.max_procs is not None)
    chosen = f"{o.malleable_fraction:.0%} chosen, seed {o.seed}, "
    chosen += f"range {o.min_factor:g}x..{o.max_factor:g}x"
    if fixed == len(w.trace.jobs):
        chosen = "kinds and ranges from the trace"
    elif fixed:
        chosen = f"{fixed:,} jobs' kinds and ranges from the trace; of the rest {chosen}"
    lines = [
        f"Trace {name}: {len(w.jobs):,} jobs, {w.capacity:,} slots ({per_host})",
        f"Malleable: {w.malleable:,} jobs ({chosen}); speedup {o.speedup.spec()}; "
        f"driver {o.driver}",
        "",
    ]
    rows: list[tuple[str, str, str, str]] = [
        ("jobs", f"{a.jobs:,}", f"{b.jobs:,}", ""),
        ("mean wait (s)", _num(a.mean_wait), _num(b.mean_wait), _change(a.mean_wait, b.mean_wait)),
        (
            "median wait (s)",
            _num(a.median_wait),
            _num(b.median_wait),
            _change(a.median_wait, b.median_wait),
        ),
        (
            "mean turnaround (s)",
            _num(a.mean_turnaround),
            _num(b.mean_turnaround),
            _change(a.mean_turnaround, b.mean_turnaround),
        ),
        (
            "mean bounded slowdown",
            _num(a.mean_bounded_slowdown, 2),
            _num(b.mean_bounded_slowdown, 2),
            _change(a.mean_bounded_slowdown, b.mean_bounded_slowdown),
        ),
        (
            "utilization",
            f"{a.utilization:.2%}",
            f"{b.utilization:.2%}",
            _change(a.utilization, b.utilization),
        ),
        ("makespan", _duration(a.makespan), _duration(b.makespan), _change(a.makespan, b.makespan)),
        (
            "resizes (grow/shrink)",
            f"{a.resizes:,}",
            f"{b.resizes:,} ({b.grows:,}/{b.shrinks:,})",
            "",
        ),
    ]
    rows.extend(_failure_rows(comparison.rigid, comparison.elastic))
    header = ("", "rigid", "elastic", "change")
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(4)]
    for row in [header, *rows]:
        lines.append(
            f"{row[0]:<{widths[0]}}  {row[1]:>{widths[1]}}  {row[2]:>{widths[2]}}  "
            f"{row[3]:>{widths[3]}}".rstrip()
        )
    lines.append("")
    lines.extend(_checks(comparison.rigid, comparison.elastic))
    lines.extend(_warnings(comparison.rigid, comparison.elastic))
    return "\n".join(lines) + "\n"


def _failure_rows(rigid: RunResult, elastic: RunResult) -> list[tuple[str, str, str, str]]:
    """The rows of ``--host-failures``: what the same failures did to each run."""
    a, b = rigid.failures, elastic.failures
    if a is None or b is None:
        return []
    return [
        ("host failures", f"{a.failures:,}", f"{b.failures:,}", ""),
        ("jobs killed", f"{a.jobs_killed:,}", f"{b.jobs_killed:,}", ""),
        *(
            [("jobs requeued", f"{a.jobs_requeued:,}", f"{b.jobs_requeued:,}", "")]
            if a.jobs_requeued or b.jobs_requeued
            else []
        ),
        ("jobs shrunk", f"{a.jobs_shrunk:,}", f"{b.jobs_shrunk:,}", ""),
        (
            "slot-hours lost",
            _num(a.slot_hours_lost),
            _num(b.slot_hours_lost),
            _change(a.slot_hours_lost, b.slot_hours_lost),
        ),
    ]


def _checks(*runs: RunResult) -> list[str]:
    bad = [r for r in runs if r.problems]
    if not bad:
        if any(r.failures is not None for r in runs):
            # Host failures end jobs and change the cluster: no textbook EASY check.
            return [
                "checks: passed (every job ended, DONE or killed by a host failure; no host "
                "over its slots; work conserved; utilization <= 1)"
            ]
        return [
            "checks: passed (every job ended; no host over its slots; work conserved; "
            "utilization <= 1; rigid schedule FCFS + EASY)"
        ]
    out = []
    for run in bad:
        out.append(f"checks FAILED in the {run.mode} run:")
        out.extend(f"  {p}" for p in run.problems)
    return out


def _warnings(*runs: RunResult) -> list[str]:
    """The plugin's warnings of each run, one line per kind: how many, and the first
    (a controller logs them one per job; :mod:`.run_log`)."""
    out: list[str] = []
    for run in runs:
        title = f"plugin warnings in the {run.mode} run (how many, and the first of each kind):"
        out.extend(format_kinds(title, run.warnings))
    return out
