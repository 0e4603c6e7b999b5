"""``xce-resize sweep``: a grid of simulations, run in parallel, cached, summarised.

Each cell of the grid (:mod:`.sweep_config`) is a rigid and an elastic run of its
workload, made by :func:`~.simulate.run_mode`, the same machinery as ``xce-resize
simulate``. Cells that would make the same run share it (:func:`run_key`): the rigid
run of a trace reads no malleable option (not the fraction, the seed, the driver or
the speedup), so one rigid run serves every cell of the trace, and at a malleable
fraction of 0 or 1 the seed chooses nothing, so one elastic run serves every seed
(a synthetic workload without ``seed=``, or host failures, keep the seed: it changes
the jobs or the failures). Runs are made

- on the local cores (:func:`run_sweep` with ``workers``; default: all of them), one
  run per worker process of a :class:`~concurrent.futures.ProcessPoolExecutor`
  (started by ``forkserver``, so no worker inherits the parent's threads), the
  costliest runs first (:func:`expected_cost`) so that the last runs to finish
  are short ones;
  ``workers=1`` makes them in this process, one after the other;
- or on an existing Dask cluster (``dask=ADDRESS``, the ``dask`` extra), one task
  per run; its workers need this package and the trace files at the same paths.

Finished runs are cached (:class:`~.sweep_cache.CellCache`): a file per run named by
the SHA-256 of its inputs — the workload's identity (a trace's files, hashed by
:mod:`.sweep_inputs`; a synthetic spec), the run (rigid or elastic), every option it
reads (fraction, seed, driver, speedup, [resize] ...), the content of the site policy
files it loads, the package version and the hash of its code (:func:`code_hash`) —
holding the run's results. A run found there is not made again, so an interrupted
sweep resumes where it stopped, and a grid that grows by a seed or a fraction makes
only the new runs. A run reads its trace again and makes sure it is the content the
key names (:func:`run_one`): a trace changed during the sweep stops it rather than
caching another trace's results. Results are written by this process as each run
finishes. Local workers end with this process, however it
ends (:func:`_exit_with_parent`).

A cell's result is a JSON object: both runs' metrics (:meth:`~.metrics.RunMetrics.to_json`
plus ``events`` and ``resize_requests``), the workload's job and malleable-job counts,
and the problems their checks found.
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import contextlib
import functools
import hashlib
import importlib
import json
import multiprocessing
import os
import shutil
import tempfile
import threading
import warnings
from collections.abc import Callable, Iterator, Sequence
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import attrs
from attrs import frozen

import xce_resize_plugin
from xce_resize_plugin import __version__
from xce_resize_plugin.errors import ResizeError, UsageError
from xce_resize_plugin.simulation.lublin import is_spec, parse_spec
from xce_resize_plugin.simulation.simulate import (
    MODES,
    Mode,
    RunResult,
    SimOptions,
    SimulationError,
    run_mode,
)
from xce_resize_plugin.simulation.sweep_cache import CellCache, RunResultDoc, default_cache_dir
from xce_resize_plugin.simulation.sweep_config import Cell, SweepConfig, check_loads
from xce_resize_plugin.simulation.sweep_inputs import check_identity, is_swf, open_identified
from xce_resize_plugin.simulation.workloads import open_workload

__all__ = [
    "CACHE_FORMAT",
    "CellCache",
    "Run",
    "SweepResult",
    "cell_result",
    "code_hash",
    "default_cache_dir",
    "run_key",
    "run_one",
    "run_options",
    "run_sweep",
    "tree_hash",
]

#: Part of every cache key: a change of what a cached result holds changes it.
CACHE_FORMAT = "xce-resize-sweep-run/4"

CellResult = dict[str, Any]


def _run_json(run: RunResult) -> dict[str, Any]:
    out: dict[str, Any] = dict(run.metrics.to_json())
    out["events"] = run.events
    out["resize_requests"] = run.requests
    if run.failures is not None:  # --host-failures: what they did, as simulate --json
        out["host_failures"] = run.failures.to_json()
    return out


def run_one(
    source: str, options: SimOptions, mode: Mode, identity: str | None = None
) -> RunResultDoc:
    """Make one run of a cell (in this process) and return its results.

    :param identity: the trace's identity the run's key was made with
        (:mod:`.sweep_inputs`): the run reads that content or stops."""
    if identity is None or is_spec(source):
        workload = open_workload(source, options)
    else:
        workload = open_identified(source, identity, options)
    result = run_mode(workload, options, mode)
    if identity is not None and not is_spec(source) and not is_swf(source):
        check_identity(source, identity)  # its files are read by name during the run
    return {
        "jobs": len(workload.jobs),
        "malleable_jobs": workload.malleable,
        "run": _run_json(result),
        "problems": [f"{mode}: {p}" for p in result.problems],
        # The plugin's warnings, each kind once (.run_log): a sweep's workers print none.
        "warnings": [{"run": mode, "count": w.count, "first": w.first} for w in result.warnings],
    }


def cell_result(rigid: RunResultDoc, elastic: RunResultDoc) -> CellResult:
    """A cell's result from its two runs (the malleable count is the elastic run's)."""
    return {
        "jobs": elastic["jobs"],
        "malleable_jobs": elastic["malleable_jobs"],
        "rigid": rigid["run"],
        "elastic": elastic["run"],
        "problems": [*rigid["problems"], *elastic["problems"]],
        "warnings": [*rigid["warnings"], *elastic["warnings"]],
    }


def run_options(source: str, options: SimOptions, mode: Mode) -> SimOptions:
    """``options`` with what the run does not read set to fixed values, so that cells
    that make the same run have the same options (and key) for it."""
    # The seed picks the malleable jobs; a synthetic spec without seed= takes it for
    # its jobs (one with seed= does not), and host failures for their times: then
    # every run reads it.
    own_seed = not is_spec(source) or parse_spec(source).seed is not None
    seed_chooses_only = own_seed and options.host_failures is None
    if mode == "rigid":
        # Every job runs rigid at its recorded size, with no driver (tested:
        # tests/integration/test_sweep.py).
        plain = SimOptions()
        return attrs.evolve(
            options,
            malleable_fraction=0.0,
            seed=0 if seed_chooses_only else options.seed,
            speedup=plain.speedup,
            driver=plain.driver,
            min_factor=plain.min_factor,
            max_factor=plain.max_factor,
            grow_cooldown=plain.grow_cooldown,
            grow_margin=plain.grow_margin,
            grow_when_queue_empty=plain.grow_when_queue_empty,
            shrink_min_delay=plain.shrink_min_delay,
        )
    if seed_chooses_only and options.malleable_fraction in (0.0, 1.0):
        return attrs.evolve(options, seed=0)  # none or all jobs malleable, whatever the seed
    return options


def _policy_hashes(options: SimOptions) -> list[str]:
    """The content of the site policy files a cell loads (they change its results)."""
    files = options.resize.get("policy_files", [])
    out = []
    for name in files if isinstance(files, list) else []:
        path = Path(str(name))
        if not path.is_absolute() and options.base_dir is not None:
            path = options.base_dir / path
        try:
            out.append(hashlib.sha256(path.read_bytes()).hexdigest())
        except OSError:
            out.append(f"missing {path}")
    return out


@functools.cache
def code_hash() -> str:
    """The SHA-256 of the package's Python code: the version stays 0.1.0 while the
    simulator changes under it, and a cached run of older code is not this code's run."""
    return tree_hash(Path(xce_resize_plugin.__file__).parent)


def tree_hash(root: Path) -> str:
    """The SHA-256 of the ``*.py`` files under ``root``, with their names."""
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        data = path.read_bytes()
        # Name and length delimit each file: no two trees hash the same bytes.
        name = path.relative_to(root).as_posix().encode()
        digest.update(b"%d:%s %d:" % (len(name), name, len(data)))
        digest.update(data)
    return digest.hexdigest()


def run_key(cell: Cell, options: SimOptions, mode: Mode) -> str:
    """The SHA-256 of everything one run's results depend on (``options`` as
    :func:`run_options` gives them for the run)."""
    failures = options.host_failures
    doc = {
        "format": CACHE_FORMAT,
        "package": __version__,
        "code": code_hash(),
        "workload": cell.workload.identity,
        "run": mode,
        "options": options.to_json(),
        # The exact values, whatever the text of the spec in to_json() shows.
        "host_failures": None if failures is None else attrs.asdict(failures),
        "policies": _policy_hashes(options),
    }
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


@frozen
class SweepResult:
    """Every cell with its results, in grid order, and how many runs were made or
    came from the cache (cells that make the same run share it)."""

    config: SweepConfig
    cells: tuple[tuple[Cell, CellResult], ...]
    ran: int
    cached: int


@frozen
class Run:
    """One run a sweep makes: ``cell`` is the first cell that needs it (it names the run
    in errors), ``options`` are :func:`run_options`'s for it."""

    key: str
    mode: Mode
    cell: Cell
    options: SimOptions

    def make(self) -> RunResultDoc:
        workload = self.cell.workload
        return run_one(workload.source, self.options, self.mode, workload.identity)

    def failed(self, exc: Exception) -> SimulationError:
        # The project's errors say what they are; anything else is named by its type.
        what = str(exc) if isinstance(exc, ResizeError) else f"{type(exc).__name__}: {exc}"
        return SimulationError(f"cell {self.cell.label()} ({self.mode} run): {what}")


Runner = Callable[[Sequence[Run]], Iterator[tuple[str, RunResultDoc]]]

#: How much more an elastic run costs than a rigid run of the same jobs, per unit of
#: malleable fraction: KTH's and CTC's first 3,000 jobs measured 1.6x at 0.2, 2.5x at
#: 0.5 and 4x at 1.0 (docs/performance.md, "Sweeps on local workers").
ELASTIC_COST_PER_FRACTION = 3.0


def expected_cost(run: Run) -> float:
    """A run's cost relative to the others', for ordering: its jobs, weighted by how
    much of its work is the plugin's (an elastic run's malleable jobs resize)."""
    jobs = float(run.cell.workload.jobs)
    if run.mode == "rigid":
        return jobs
    return jobs * (1.0 + ELASTIC_COST_PER_FRACTION * run.options.malleable_fraction)


def _serial(runs: Sequence[Run]) -> Iterator[tuple[str, RunResultDoc]]:
    for run in runs:
        try:
            result = run.make()
        except SimulationError:
            raise
        except Exception as exc:  # a run's failure names its cell
            raise run.failed(exc) from exc
        yield run.key, result


def _exit_with_parent(lifeline: Connection, scratch: str) -> None:
    """A worker's initializer: end the worker when ``lifeline``'s other end closes, and
    make its runs' temporary directories under ``scratch``, which the sweep removes
    (a worker so ended runs no clean-up of its own)."""
    tempfile.tempdir = scratch

    def watch() -> None:
        with contextlib.suppress(EOFError, OSError):
            lifeline.recv()  # nothing is ever sent: this returns at EOF
        os._exit(1)

    threading.Thread(target=watch, name="xce-sweep-lifeline", daemon=True).start()


def _local(workers: int) -> Runner:
    def make(runs: Sequence[Run]) -> Iterator[tuple[str, RunResultDoc]]:
        methods = multiprocessing.get_all_start_methods()
        ctx = multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")
        # Only this process holds the pipe's write end, so the workers see it close
        # when this process ends, however it ends (SIGTERM, SIGHUP, SIGKILL: no
        # cleanup runs), or gives up (Ctrl-C, a failed run). Else each worker finishes
        # a run nobody reads, and then waits for work forever.
        lifeline, keep_alive = ctx.Pipe(duplex=False)
        scratch = tempfile.mkdtemp(prefix="xce-sweep-")
        done = False
        try:
            with cf.ProcessPoolExecutor(
                max_workers=min(workers, len(runs)),
                mp_context=ctx,
                initializer=_exit_with_parent,
                initargs=(lifeline, scratch),
            ) as pool:
                futures = {
                    pool.submit(run_one, run.cell.workload.source, run.options, run.mode): run
                    for run in runs
                }
                try:
                    for fut in cf.as_completed(futures):
                        run = futures[fut]
                        yield run.key, _result_of(run, fut.result)
                    done = True
                finally:
                    if not done:
                        # Stop the running runs now, not when they end: the workers
                        # exit, the pool breaks and fails every run not done. Not by
                        # cancelling them first: Python 3.11's pool then fails a
                        # cancelled one, and its thread died printing a traceback.
                        keep_alive.close()
        finally:
            keep_alive.close()
            lifeline.close()
            # The pool has waited for its workers: nothing writes there any more.
            shutil.rmtree(scratch, ignore_errors=True)

    return make


def _result_of(run: Run, get: Callable[[], RunResultDoc]) -> RunResultDoc:
    try:
        return get()
    except Exception as exc:  # raised in a worker: name the cell
        raise run.failed(exc) from exc


#: How long the scheduler at ``--dask ADDRESS`` has to answer distributed's handshake
#: (10 s): a port that accepts and never answers kept the sweep silent for minutes, one
#: that speaks HTTP ended in a 3 EiB allocation's traceback.
DASK_PROBE_SECONDS = 10.0


def _probe(distributed: Any, address: str) -> None:
    """Connect to ``address`` and make distributed's handshake, within
    :data:`DASK_PROBE_SECONDS`; a :class:`UsageError` naming the option and the
    address when no Dask scheduler answers there (before a ``Client``, whose
    failures hang at exit and print tracebacks)."""

    async def handshake() -> None:
        comm = await asyncio.wait_for(
            distributed.comm.connect(address, timeout=DASK_PROBE_SECONDS),
            DASK_PROBE_SECONDS + 1.0,
        )
        await comm.close()

    try:
        asyncio.run(handshake())
    except TimeoutError:
        raise UsageError(
            f"--dask {address}: no Dask scheduler answered within {DASK_PROBE_SECONDS:g} s"
        ) from None
    except Exception as exc:  # whatever the other end says: it is no scheduler
        why = f"{type(exc).__name__}: {exc}"[:200]
        raise UsageError(f"--dask {address}: no Dask scheduler answers there ({why})") from None


def _dask(address: str) -> Runner:
    try:
        # Imported by name: an optional extra, untyped; Any either way for mypy.
        distributed: Any = importlib.import_module("distributed")
    except ImportError:
        raise UsageError(
            "--dask needs distributed: pip install distributed (the dask extra: pip install "
            "'.[dask]' in a checkout)"
        ) from None

    def make(runs: Sequence[Run]) -> Iterator[tuple[str, RunResultDoc]]:
        try:
            # A malformed address fails here, not in Client(), whose half-made object
            # then hangs for 20 s at exit and prints a traceback.
            with warnings.catch_warnings():
                # A removed protocol (ucx://) warns, then raises: one line says it.
                warnings.simplefilter("ignore")
                distributed.comm.resolve_address(address)
            _probe(distributed, address)
            client = distributed.Client(address, timeout=10, set_as_default=False)
        except (ValueError, Warning) as exc:
            why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise UsageError(f"--dask {address}: not a scheduler address ({why})") from None
        except (OSError, TimeoutError) as exc:
            raise UsageError(f"--dask {address}: cannot connect ({exc})") from None
        with client:
            futures = {
                client.submit(
                    run_one,
                    run.cell.workload.source,
                    run.options,
                    run.mode,
                    key=f"xce-sweep-{run.key}",
                    pure=False,
                ): run
                for run in runs
            }
            try:
                for fut in distributed.as_completed(futures, loop=client.loop):
                    run = futures[fut]
                    yield run.key, _result_of(run, fut.result)
            finally:
                client.cancel(list(futures))

    return make


#: How many cells (or runs) between two calls of ``on_prepare``.
_PREPARE_STEP = 500


def _plan(
    config: SweepConfig, cells: Sequence[Cell], on_prepare: Callable[[int, int], None] | None
) -> tuple[dict[str, Run], list[tuple[str, str]]]:
    """Every run the cells need, by key (cells that make the same run share it), and
    each cell's (rigid, elastic) run keys."""
    pairs: list[tuple[str, str]] = []
    runs: dict[str, Run] = {}
    for i, cell in enumerate(cells, 1):
        options = config.options_for(cell)
        keys = []
        for mode in MODES:
            run_opts = run_options(cell.workload.source, options, mode)
            key = run_key(cell, run_opts, mode)
            runs.setdefault(key, Run(key, mode, cell, run_opts))
            keys.append(key)
        pairs.append((keys[0], keys[1]))
        if on_prepare is not None and i % _PREPARE_STEP == 0:
            # The runs are not counted yet: at most two a cell, so 3 x cells in all.
            on_prepare(i, 3 * len(cells))
    return runs, pairs


def run_sweep(
    config: SweepConfig,
    *,
    workers: int | None = None,
    dask: str | None = None,
    cache: CellCache | None = None,
    on_cell: Callable[[], None] | None = None,
    on_start: Callable[[int, int], None] | None = None,
    on_prepare: Callable[[int, int], None] | None = None,
) -> SweepResult:
    """Make the runs of ``config``'s cells that ``cache`` does not hold; return every
    cell with its results.

    :param workers: local worker processes (default: the machine's cores; 1 makes the
        runs in this process).
    :param dask: the address of a Dask scheduler to make the runs on instead.
    :param on_start: called once with (runs, runs in the cache) before any run starts.
    :param on_cell: called as each run to make finishes (a progress bar).
    :param on_prepare: called with (done, total) as the cells' run keys are made and
        then the runs looked up in the cache (seconds for a large grid), before
        ``on_start``.
    """
    cells = config.cells()
    runs, pairs = _plan(config, cells, on_prepare)
    results: dict[str, RunResultDoc] = {}
    for i, (key, run) in enumerate(runs.items(), 1):
        hit = cache.get(key, run.mode) if cache is not None else None
        if hit is not None:
            results[key] = hit
        if on_prepare is not None and (i % _PREPARE_STEP == 0 or i == len(runs)):
            on_prepare(len(cells) + i, len(cells) + len(runs))
    todo = [run for key, run in runs.items() if key not in results]
    check_loads(config, (run.cell for run in todo))
    if on_start is not None:
        on_start(len(runs), len(results))
    # The costliest runs first, so that the runs left at the end, when some workers
    # already idle, are the short ones (longest-processing-time-first scheduling).
    todo.sort(key=lambda run: -expected_cost(run))
    if todo:
        n = workers if workers is not None else (os.cpu_count() or 1)
        runner = _dask(dask) if dask is not None else (_serial if n <= 1 else _local(n))
        for key, result in runner(todo):
            results[key] = result
            if cache is not None:
                cache.put(key, result)
            if on_cell is not None:
                on_cell()
    ordered = tuple(
        (cell, cell_result(results[rigid], results[elastic]))
        for cell, (rigid, elastic) in zip(cells, pairs, strict=True)
    )
    return SweepResult(config, ordered, ran=len(todo), cached=len(runs) - len(todo))
