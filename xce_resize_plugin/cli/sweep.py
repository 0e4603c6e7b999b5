"""``xce-resize sweep CONFIG.toml``: the command behind the subcommand (imported on use).

Exit status: 0 when every cell ran and passed its checks, 1 when a check failed in a
cell (the table lists them, and they are on stderr), 2 for bad usage or input (the
message names the file and key, or the option).
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time
from pathlib import Path
from typing import TextIO

from xce_resize_plugin.cli.simulate import check_output, write_results
from xce_resize_plugin.errors import UsageError
from xce_resize_plugin.simulation.progress import CellBar, PrepareBar
from xce_resize_plugin.simulation.sweep import CellCache, default_cache_dir, run_sweep
from xce_resize_plugin.simulation.sweep_config import load_sweep
from xce_resize_plugin.simulation.sweep_report import format_sweep, sweep_json

EXIT_OK, EXIT_PROBLEMS = 0, 1


def _terminated(signum: int, frame: object) -> None:
    """SIGTERM during the runs (a batch system's time limit, ``kill``): end as Ctrl-C
    does, the workers stopped and their resources released (the finished runs are in
    the cache), exit 143, instead of dying with the workers' semaphores leaked."""
    print("xce-resize: terminated", file=sys.stderr)
    raise SystemExit(128 + signum)


def _default_cache() -> Path:
    """The default cache directory, or a :class:`UsageError` when there is none (a
    HOME that does not exist: the cache is not made where nobody asked)."""
    try:
        return default_cache_dir()
    except OSError as exc:
        raise UsageError(
            f"no default cache directory ({exc}): give --cache DIR or --no-cache"
        ) from None


def run(args: argparse.Namespace, out: TextIO) -> int:
    """Run ``sweep`` for parsed arguments; ``out`` is stdout."""
    if args.workers is not None and args.workers < 1:
        raise UsageError(f"--workers must be at least 1, not {args.workers}")
    if args.dask is not None and args.workers is not None:
        raise UsageError("give either --workers N (local processes) or --dask ADDRESS")
    if args.no_cache and args.cache is not None:
        raise UsageError("give either --cache DIR or --no-cache")
    if args.json not in (None, "-"):
        check_output("--json", args.json)
    if args.plot is not None:
        check_output("--plot", args.plot)
        from xce_resize_plugin.simulation.sweep_plot import check_plot_path

        # Fail now, not after the runs, when matplotlib is missing or the format unknown.
        check_plot_path(args.plot)
    config = load_sweep(args.config)
    cache = None if args.no_cache else CellCache(args.cache or _default_cache())
    if cache is not None:
        try:
            cache.prepare()
        except OSError as exc:
            what = "--cache" if args.cache is not None else "the cache directory"
            raise UsageError(
                f"{what} {cache.directory}: cannot write there ({exc.strerror or exc}); "
                "give --cache DIR or --no-cache"
            ) from None
    began = time.monotonic()
    bars: list[CellBar] = []
    # A large grid takes seconds to prepare (each cell's run keys, the cache): a bar
    # says so, instead of a terminal that shows nothing.
    preparing = PrepareBar(quiet=args.quiet)

    def start(total: int, cached: int) -> None:
        preparing.close()
        bars.append(CellBar(total, cached, quiet=args.quiet))

    # (Only the main thread may set a handler: a program that runs this command in
    # another thread keeps its own.)
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _terminated) if main_thread else None
    try:
        result = run_sweep(
            config,
            workers=args.workers,
            dask=args.dask,
            cache=cache,
            on_start=start,
            on_cell=lambda: bars[0].done(),
            on_prepare=preparing.update,
        )
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, previous)
        preparing.close()
        for bar in bars:
            bar.close()
    write_results(out, args.json, sweep_json(result), lambda: format_sweep(result))
    if args.plot is not None:
        from xce_resize_plugin.simulation.sweep_plot import plot_sweep

        plot_sweep(result, args.plot)
    if not args.quiet:
        where = "no cache" if cache is None else f"cache {cache.directory}"
        print(
            f"sweep: {time.monotonic() - began:.1f} s, {result.ran} runs made, "
            f"{result.cached} from the cache ({where})",
            file=sys.stderr,
        )
    if cache is not None and cache.unkept:
        # Not an error: the results are all here, only the next sweep makes them again.
        print(
            f"xce-resize: warning: {cache.unkept} run(s) could not be kept in the cache "
            f"({cache.unkept_reason})",
            file=sys.stderr,
        )
    problems = [(c, p) for c, r in result.cells for p in r["problems"]]
    for cell, problem in problems:
        print(f"xce-resize: check failed: {cell.label()}: {problem}", file=sys.stderr)
    return EXIT_PROBLEMS if problems else EXIT_OK
