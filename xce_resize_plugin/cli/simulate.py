"""``xce-resize simulate``: the command behind the subcommand (imported on use only).

Exit status: 0 when the runs completed and every check passed (for ``--replay``: the
replay produced the recorded starts and facts), 1 when a check failed or the replay
diverged, 2 for bad usage or input (the message names what).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any, TextIO

from xce_resize_plugin.errors import UsageError
from xce_resize_plugin.simulation.report import Progress, format_table
from xce_resize_plugin.simulation.simulate import MODES, load_options, load_workload, simulate

EXIT_OK, EXIT_PROBLEMS = 0, 1


def run(args: argparse.Namespace, out: TextIO) -> int:
    """Run ``simulate`` for parsed arguments; ``out`` is stdout."""
    if args.replay is not None:
        return _replay(args, out)
    if args.trace is None:
        raise UsageError("simulate needs a TRACE (or --replay RECORDING)")
    options = load_options(
        args.config,
        malleable_fraction=args.malleable_fraction,
        seed=args.seed,
        speedup=args.speedup,
        driver=args.driver,
        limit=args.limit,
        slots_per_host=args.slots_per_host,
    )
    if args.plot is not None:
        from xce_resize_plugin.simulation.plot import _pyplot

        _pyplot()  # fail now, not after the runs, when matplotlib is missing
    began = time.monotonic()
    workload = load_workload(args.trace, options)
    progress = None if args.no_progress else Progress(MODES)
    try:
        if args.record is not None:
            comparison = _recorded(args, options, workload, progress)
        else:
            comparison = simulate(
                args.trace,
                options,
                workload=workload,
                progress=progress.update if progress is not None else None,
                parallel=False if args.sequential else None,
            )
    finally:
        if progress is not None:
            progress.close()
    doc = json.dumps(comparison.to_json(), indent=2) + "\n"
    if args.json == "-":
        out.write(doc)
    else:
        out.write(format_table(comparison))
        if args.json is not None:
            with open(args.json, "w", encoding="utf-8") as fh:
                fh.write(doc)
    if args.plot is not None:
        from xce_resize_plugin.simulation.plot import plot_comparison

        plot_comparison(comparison, args.plot)
    r, e = comparison.rigid, comparison.elastic
    print(
        f"simulate: {time.monotonic() - began:.1f} s (rigid run {r.seconds:.1f} s, "
        f"{r.events / r.seconds if r.seconds else 0:,.0f} events/s; elastic run "
        f"{e.seconds:.1f} s, {e.events / e.seconds if e.seconds else 0:,.0f} events/s)",
        file=sys.stderr,
    )
    for problem in comparison.problems:
        print(f"xce-resize: check failed: {problem}", file=sys.stderr)
    return EXIT_PROBLEMS if comparison.problems else EXIT_OK


def _recorded(args: argparse.Namespace, options: Any, workload: Any, progress: Any) -> Any:
    """Both runs one after the other, the elastic one recorded."""
    from xce_resize_plugin.simulation.simulate import Comparison, run_mode

    update = progress.update if progress is not None else None
    rigid = run_mode(workload, options, "rigid", progress=update)
    elastic = run_mode(workload, options, "elastic", progress=update, record=args.record)
    return Comparison(workload, options, rigid, elastic)


def _replay(args: argparse.Namespace, out: TextIO) -> int:
    from xce_resize_plugin.recording.replay import replay

    if args.trace is not None:
        raise UsageError("--replay takes no TRACE: the recording holds the jobs")
    result = replay(args.replay)
    state = "identical" if result.ok else "DIFFERENT"
    out.write(
        f"replayed {result.inputs:,} inputs of {args.replay}: {result.starts:,} job starts and "
        f"{result.facts:,} resize facts, {state}\n"
    )
    for problem in result.problems:
        out.write(f"  {problem}\n")
    return EXIT_OK if result.ok else EXIT_PROBLEMS
