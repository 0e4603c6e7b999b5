"""``simulate --plot OUT.png``: the two runs in one figure.

Top: utilization over time for both runs (the mean of each of
:data:`~.simulate.USAGE_BINS` equal stretches of the makespan). Bottom: the distribution
of waits as the share of jobs that waited at most a given time, on a log scale (waits
under a second are drawn at one second; the share of jobs that did not wait at all is
in the legend).

matplotlib is an optional dependency (the ``plot`` extra): without it,
:func:`plot_comparison` raises :class:`PlotUnavailable` saying how to install it. The
Agg backend is used, so no display is needed.

The figure is written to exactly the name given, in the format its suffix names (PNG
without one): :func:`check_plot_path` refuses, before any run, a name matplotlib
could not write, and :func:`save_figure` writes it (``simulate --plot`` and
``sweep --plot`` alike; docs/simulation.md).
"""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from xce_resize_plugin.errors import ConfigError, UsageError

if TYPE_CHECKING:
    from xce_resize_plugin.simulation.comparison import Comparison

__all__ = ["PlotUnavailable", "check_plot_path", "plot_comparison", "plot_format", "save_figure"]

INSTALL_HINT = "pip install matplotlib (the plot extra: pip install '.[plot]' in a checkout)"
COLORS = {"rigid": "#4c72b0", "elastic": "#dd8452"}


class PlotUnavailable(ConfigError):
    """matplotlib is not installed."""

    message = "Cannot plot"


def pyplot_or_hint() -> Any:
    """matplotlib's pyplot on the file-only backend, or :class:`PlotUnavailable` with
    how to install it (the commands call it before a long run, to fail at once)."""
    try:
        import matplotlib
    except ImportError:
        raise PlotUnavailable(f"--plot needs matplotlib: {INSTALL_HINT}") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_format(path: str | os.PathLike[str]) -> str:
    """The image format a name asks for: its suffix, lower case; PNG when it has none."""
    return Path(path).suffix.lstrip(".").lower() or "png"


def check_plot_path(path: str | os.PathLike[str]) -> None:
    """Refuse, before the runs, a ``--plot`` name matplotlib writes no image for:
    ``savefig`` would raise only after them. A format matplotlib knows may still need
    what is missing here (``pgf`` runs a TeX system; ``avif`` and ``webp`` need
    Pillow's codecs), so a tiny figure is drawn in that format first."""
    plt = pyplot_or_hint()
    from matplotlib.backend_bases import FigureCanvasBase

    fmt = plot_format(path)
    known = FigureCanvasBase.get_supported_filetypes()
    if fmt not in known:
        raise UsageError(
            f"--plot {path}: matplotlib writes no {fmt!r} image (known: {', '.join(sorted(known))})"
        )
    fig = plt.figure(figsize=(1, 1))
    try:
        fig.text(0.5, 0.5, "x")
        fig.savefig(io.BytesIO(), format=fmt)
    # Whatever a backend raises for what it lacks (RuntimeError for a missing TeX,
    # KeyError or OSError from Pillow), the runs' figure would raise it too.
    except Exception as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise UsageError(
            f"--plot {path}: matplotlib cannot write a {fmt!r} image ({reason})"
        ) from None
    finally:
        plt.close(fig)


def save_figure(fig: Any, path: str | os.PathLike[str], dpi: int) -> None:
    """Write ``fig`` to exactly ``path``: without a suffix matplotlib would add
    ``.png`` to the name, so the format is always given."""
    try:
        fig.savefig(path, dpi=dpi, format=plot_format(path))
    except OSError as exc:
        raise UsageError(f"--plot {path}: cannot write ({exc.strerror or exc})") from None


def plot_comparison(comparison: Comparison, path: str | os.PathLike[str]) -> None:
    """Write the figure of ``comparison`` to ``path`` (:func:`save_figure`)."""
    plt = pyplot_or_hint()
    w, o = comparison.workload, comparison.options
    runs = (comparison.rigid, comparison.elastic)
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 8), constrained_layout=True)
    name = os.path.basename(w.source)
    fig.suptitle(
        f"{name}: {len(w.jobs):,} jobs on {w.capacity:,} slots, "
        f"{o.malleable_fraction:.0%} malleable ({o.driver}, {o.speedup.spec()})",
        fontsize=12,
    )

    for run in runs:
        usage = run.usage
        if not usage:
            continue
        span = run.metrics.makespan / 86400.0
        step = span / len(usage)
        days = [(i + 0.5) * step for i in range(len(usage))]
        top.plot(
            days,
            [u * 100 for u in usage],
            color=COLORS[run.mode],
            linewidth=1.0,
            alpha=0.9,
            label=f"{run.mode} (mean {run.metrics.utilization:.1%})",
        )
    top.set_xlabel("time since the first submission (days)")
    top.set_ylabel("utilization (%)")
    top.set_ylim(0, 105)
    top.set_xlim(left=0)
    top.grid(True, alpha=0.3)
    top.legend(loc="lower right")
    top.set_title("Utilization over time")

    for run in runs:
        waits = sorted(max(1.0, x) for x in run.waits)
        n = len(waits)
        if not n:
            continue
        none = sum(1 for x in run.waits if x <= 0) / n
        # One point per distinct wait, at the share of jobs that waited at most that.
        xs: list[float] = []
        shares: list[float] = []
        for i, x in enumerate(waits):
            if xs and xs[-1] == x:
                shares[-1] = (i + 1) / n * 100
            else:
                xs.append(x)
                shares.append((i + 1) / n * 100)
        bottom.step(
            xs,
            shares,
            where="post",
            color=COLORS[run.mode],
            linewidth=1.4,
            label=(
                f"{run.mode}: mean {run.metrics.mean_wait:,.0f} s, "
                f"median {run.metrics.median_wait:,.0f} s, {none:.0%} did not wait"
            ),
        )
    bottom.set_xscale("log")
    bottom.set_xlabel("wait (s, log scale; under 1 s drawn at 1 s)")
    bottom.set_ylabel("jobs that waited at most this long (%)")
    bottom.set_ylim(0, 101)
    bottom.grid(True, which="both", alpha=0.3)
    bottom.legend(loc="lower right")
    bottom.set_title("Wait-time distribution")

    try:
        save_figure(fig, path, dpi=110)
    finally:
        plt.close(fig)
