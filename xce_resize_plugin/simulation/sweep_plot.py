"""``sweep --plot OUT.png``: each metric against the malleable fraction, with error bars.

One panel per metric (mean wait, mean bounded slowdown, mean turnaround, utilization);
in each, a line per (workload, driver) through the elastic runs' means at each
fraction, with the 95 % confidence interval across seeds as error bars
(:mod:`.sweep_report`), and the workload's rigid baseline as a dashed line of the same
colour. Needs matplotlib (the ``plot`` extra), as ``simulate --plot``.
"""

from __future__ import annotations

import os

# check_plot_path is simulate's as well (its home is .plot); cli/sweep.py imports it here.
from xce_resize_plugin.simulation.plot import check_plot_path, pyplot_or_hint, save_figure
from xce_resize_plugin.simulation.sweep import SweepResult
from xce_resize_plugin.simulation.sweep_report import METRICS, groups

__all__ = ["PLOTTED", "check_plot_path", "plot_sweep"]

#: The metrics drawn, one panel each.
PLOTTED = ("mean_wait", "mean_bounded_slowdown", "mean_turnaround", "utilization")


def plot_sweep(result: SweepResult, path: str | os.PathLike[str]) -> None:
    """Write the figure of a sweep to ``path`` (:func:`~.plot.save_figure`)."""
    plt = pyplot_or_hint()
    rows = groups(result)
    fig, axes = plt.subplots(2, 2, figsize=(12, 8), constrained_layout=True)
    fig.suptitle(f"{os.path.basename(result.config.path)}: mean and 95 % CI across seeds")
    lines = sorted({(g.workload, g.driver) for g in rows if g.run == "elastic"}, key=str)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, metric in zip(axes.flat, PLOTTED, strict=True):
        baselines: set[str] = set()
        for k, (workload, driver) in enumerate(lines):
            color = colors[k % len(colors)]
            mine = sorted(
                (g for g in rows if (g.workload, g.driver) == (workload, driver)),
                key=lambda g: g.fraction or 0.0,
            )
            xs = [g.fraction for g in mine]
            ys = [g.stats[metric].mean for g in mine]
            err = [g.stats[metric].ci95 or 0.0 for g in mine]
            label = f"{os.path.basename(workload)} ({driver})"
            ax.errorbar(xs, ys, yerr=err, marker="o", capsize=3, color=color, label=label)
            rigid = next(g for g in rows if g.workload == workload and g.run == "rigid")
            if workload not in baselines:  # once per workload, in its first line's colour
                baselines.add(workload)
                ax.axhline(rigid.stats[metric].mean, color=color, linestyle="--", linewidth=1)
        ax.set_title(METRICS[metric])
        ax.set_xlabel("malleable fraction")
        ax.grid(True, alpha=0.3)
    axes.flat[0].legend(fontsize=8)
    try:
        save_figure(fig, path, dpi=100)
    finally:
        plt.close(fig)
