"""Progress bars on stderr for ``simulate`` and ``sweep`` (tqdm).

A bar is drawn only on a terminal: when stderr is a file or a pipe (a batch job's
log, a test) or with ``--quiet`` nothing is written, so logs hold results, not
carriage returns.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TextIO

from tqdm import tqdm

__all__ = ["CellBar", "PrepareBar", "RunBars", "wanted"]


def wanted(stream: TextIO, quiet: bool) -> bool:
    """Whether to draw a bar on ``stream``: a terminal, and not ``--quiet``."""
    if quiet:
        return False
    isatty = getattr(stream, "isatty", None)
    return bool(isatty is not None and isatty())


class RunBars:
    """One bar per run of a simulation (jobs ended); :meth:`update` is the
    ``progress`` callback of :func:`~.comparison.simulate`."""

    def __init__(self, runs: Sequence[str], *, quiet: bool = False, stream: TextIO | None = None):
        out = stream if stream is not None else sys.stderr
        off = not wanted(out, quiet)
        self.bars = {
            run: tqdm(desc=f"{run:<8}", unit="job", file=out, position=i, disable=off, leave=True)
            for i, run in enumerate(runs)
        }

    def update(self, run: str, done: int, total: int) -> None:
        bar = self.bars.get(run)
        if bar is None or bar.disable:
            return
        if bar.total != total:
            bar.total = total
        if done > bar.n:
            bar.update(done - bar.n)

    def close(self) -> None:
        for bar in self.bars.values():
            bar.close()


class CellBar:
    """The runs of a sweep: ``done`` counts runs finished (cached ones at once)."""

    def __init__(
        self, total: int, cached: int, *, quiet: bool = False, stream: TextIO | None = None
    ):
        out = stream if stream is not None else sys.stderr
        self.bar = tqdm(
            total=total,
            initial=cached,
            desc="sweep",
            unit="run",
            file=out,
            disable=not wanted(out, quiet),
        )

    def done(self) -> None:
        self.bar.update(1)

    def close(self) -> None:
        self.bar.close()


class PrepareBar:
    """A sweep's cells as their run keys are made and looked up in the cache, before
    the first run: ``update`` is :func:`~.sweep.run_sweep`'s ``on_prepare``."""

    def __init__(self, *, quiet: bool = False, stream: TextIO | None = None):
        out = stream if stream is not None else sys.stderr
        self.bar = tqdm(desc="preparing", unit="cell", file=out, disable=not wanted(out, quiet))

    def update(self, done: int, total: int) -> None:
        if self.bar.disable:
            return
        if self.bar.total != total:
            self.bar.total = total
        if done > self.bar.n:
            self.bar.update(done - self.bar.n)

    def close(self) -> None:
        self.bar.close()
