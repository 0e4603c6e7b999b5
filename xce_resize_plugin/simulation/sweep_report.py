"""A sweep's results: mean and 95 % confidence interval across seeds, as a table and JSON.

Cells are grouped by (workload, run, malleable fraction, driver): the *elastic* run of
each (fraction, driver), and one *rigid* group per workload — the rigid run does not
depend on the fraction or the driver, so each seed's rigid run counts once. For each
metric of a group of n seeds with values x1..xn:

- mean = (x1 + ... + xn) / n;
- s = sqrt(sum (xi - mean)^2 / (n - 1)), the sample standard deviation;
- the 95 % confidence interval is mean ± t x s / sqrt(n), with t the 0.975 quantile of
  Student's t with n - 1 degrees of freedom (12.71 for 2 seeds, 4.30 for 3, 2.78 for
  5): the seeds are independent draws of the malleable choice (and, for a synthetic
  workload without its own seed, of the workload), and the interval says how far the
  mean of the seeds tried may be from the mean over all seeds. One seed has no
  interval (``null``, shown ``-``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

from attrs import frozen

from xce_resize_plugin.simulation.special import student_t_quantile
from xce_resize_plugin.simulation.sweep import SweepResult

__all__ = ["METRICS", "Group", "Stat", "format_sweep", "groups", "mean_ci", "sweep_json"]

FORMAT = "xce-resize-sweep"
FORMAT_VERSION = 1

#: The metrics summarised, with their column titles.
METRICS: dict[str, str] = {
    "mean_wait": "mean wait (s)",
    "median_wait": "median wait (s)",
    "mean_turnaround": "mean turnaround (s)",
    "mean_bounded_slowdown": "mean bounded slowdown",
    "utilization": "utilization",
    "makespan": "makespan (days)",
    "resizes": "resizes",
}


@frozen
class Stat:
    """One metric of a group: its mean, the half-width of its 95 % interval, the values."""

    mean: float
    ci95: float | None
    values: tuple[float, ...]


def mean_ci(values: Sequence[float], confidence: float = 0.95) -> Stat:
    """The mean and the Student t interval's half-width (``None`` below two values)."""
    n = len(values)
    if n == 0:
        raise ValueError("no values")
    if all(x == values[0] for x in values):
        # The same run for every seed (a trace's rigid run): fsum / n may round to
        # another float than the value, and leave a tiny s > 0 as an "interval".
        return Stat(values[0], 0.0 if n > 1 else None, tuple(values))
    mean = math.fsum(values) / n
    if n < 2:
        return Stat(mean, None, tuple(values))
    s = math.sqrt(math.fsum((x - mean) ** 2 for x in values) / (n - 1))
    t = student_t_quantile(1.0 - (1.0 - confidence) / 2.0, n - 1)
    return Stat(mean, t * s / math.sqrt(n), tuple(values))


@frozen
class Group:
    """The cells of one row of the table."""

    workload: str
    run: str  # "rigid" or "elastic"
    fraction: float | None
    driver: str | None
    seeds: tuple[int, ...]
    stats: dict[str, Stat]


def _group(
    workload: str,
    run: str,
    fraction: float | None,
    driver: str | None,
    rows: Iterable[tuple[int, dict[str, Any]]],
) -> Group:
    rows = list(rows)
    stats = {m: mean_ci([float(r[m]) for _, r in rows]) for m in METRICS}
    return Group(workload, run, fraction, driver, tuple(s for s, _ in rows), stats)


def groups(result: SweepResult) -> list[Group]:
    """The rows of the summary, in the grid's order (each workload's rigid row first)."""
    config = result.config
    out: list[Group] = []
    for w in config.workloads:
        mine = [(c, r) for c, r in result.cells if c.workload == w]
        rigid: dict[int, dict[str, Any]] = {}
        for c, r in mine:
            rigid.setdefault(c.seed, r["rigid"])
        out.append(_group(w.name, "rigid", None, None, sorted(rigid.items())))
        for f in config.fractions:
            for d in config.drivers:
                rows = [
                    (c.seed, r["elastic"]) for c, r in mine if c.fraction == f and c.driver == d
                ]
                out.append(_group(w.name, "elastic", f, d, rows))
    return out


def _fmt(metric: str, stat: Stat) -> str:
    def one(v: float) -> str:
        if not math.isfinite(v):
            return "-"
        if metric == "utilization":
            return f"{v:.2%}"
        if metric == "makespan":
            return f"{v / 86400:,.2f}"
        if metric == "resizes":
            return f"{v:,.0f}"
        return f"{v:,.2f}" if metric == "mean_bounded_slowdown" else f"{v:,.0f}"

    hw = one(stat.ci95) if stat.ci95 is not None else "-"
    return f"{one(stat.mean)} ± {hw}"


def _n(count: int, thing: str) -> str:
    """``1 seed``, ``2 seeds``."""
    return f"{count} {thing}" if count == 1 else f"{count} {thing}s"


def format_sweep(result: SweepResult) -> str:
    """The summary as a text table (what ``sweep`` prints without ``--json -``)."""
    config = result.config
    cells = len(result.cells)
    lines = [
        f"Sweep {config.path}: {_n(len(config.workloads), 'workload')} x "
        f"{_n(len(config.fractions), 'malleable fraction')} x {_n(len(config.seeds), 'seed')} "
        f"x {_n(len(config.drivers), 'driver')} = {_n(cells, 'cell')}, "
        f"{_n(result.ran + result.cached, 'run')} ({result.ran} made, "
        f"{result.cached} from the cache)",
        "Each value: mean ± half-width of the 95 % confidence interval across seeds "
        "(Student t; - for one seed).",
        "",
    ]
    header = ["workload", "run", "fraction", "seeds", *METRICS.values()]
    rows = [header]
    for g in groups(result):
        run = "rigid" if g.run == "rigid" else f"elastic {g.driver}"
        fraction = "-" if g.fraction is None else f"{g.fraction:.0%}"
        rows.append(
            [g.workload, run, fraction, str(len(g.seeds))] + [_fmt(m, g.stats[m]) for m in METRICS]
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    for r in rows:
        left = [f"{r[i]:<{widths[i]}}" for i in range(2)]
        right = [f"{r[i]:>{widths[i]}}" for i in range(2, len(header))]
        lines.append("  ".join(left + right).rstrip())
    problems = [(c, p) for c, r in result.cells for p in r["problems"]]
    lines.append("")
    if problems:
        lines.append(f"checks FAILED in {len({c for c, _ in problems})} cells:")
        lines.extend(f"  {c.label()}: {p}" for c, p in problems)
    else:
        lines.append("checks: passed in every cell")
    warned = [(c, w) for c, r in result.cells for w in r["warnings"]]
    if warned:
        lines.append("plugin warnings (how many, and the first of each kind, per cell and run):")
        lines.extend(f"  {c.label()} {w['run']}: {w['count']:,}  {w['first']}" for c, w in warned)
    return "\n".join(lines) + "\n"


def _stat_json(stat: Stat) -> dict[str, Any]:
    def num(v: float | None) -> float | None:
        return v if v is not None and math.isfinite(v) else None

    return {"mean": num(stat.mean), "ci95": num(stat.ci95), "values": [num(v) for v in stat.values]}


def sweep_json(result: SweepResult) -> dict[str, Any]:
    """The deterministic document ``--json`` writes: the summary and every cell."""
    config = result.config
    return {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "config": str(config.path),
        "grid": {
            "workloads": [w.name for w in config.workloads],
            "malleable_fractions": list(config.fractions),
            "seeds": list(config.seeds),
            "drivers": list(config.drivers),
        },
        "options": {
            k: v
            for k, v in config.options.to_json().items()
            if k not in ("malleable_fraction", "seed", "driver")
        },
        "summary": [
            {
                "workload": g.workload,
                "run": g.run,
                "malleable_fraction": g.fraction,
                "driver": g.driver,
                "seeds": list(g.seeds),
                "metrics": {m: _stat_json(s) for m, s in g.stats.items()},
            }
            for g in groups(result)
        ],
        "cells": [
            {
                "workload": c.workload.name,
                "malleable_fraction": c.fraction,
                "seed": c.seed,
                "driver": c.driver,
                **r,
            }
            for c, r in result.cells
        ],
    }
