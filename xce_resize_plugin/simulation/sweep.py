"""``xce-resize sweep``: a grid of simulations, run in parallel, cached, summarised.

Each cell of the grid (:mod:`.sweep_config`) is one :func:`~.simulate.simulate` call —
both runs, rigid and elastic, one after the other in one process — through
:func:`run_cell`, the same machinery as ``xce-resize simulate``. Cells run

- on the local cores (:func:`run_sweep` with ``workers``; default: all of them), one
  cell per worker process of a :class:`~concurrent.futures.ProcessPoolExecutor`
  (started by ``forkserver``, so no worker inherits the parent's threads), the
  largest workloads first so that the last cells to finish are short ones;
  ``workers=1`` runs them in this process, one after the other;
- or on an existing Dask cluster (``dask=ADDRESS``, the ``dask`` extra), one task
  per cell; its workers need this package and the trace files at the same paths.

Finished cells are cached (:class:`CellCache`): a file per cell named by the SHA-256 of
its inputs — the workload's identity (a trace file's SHA-256, a synthetic spec), every
option (fraction, seed, driver, speedup, [resize] ...), the content of the site policy
files it loads, and the package version — holding the cell's results. A cell found
there is not run again, so an interrupted sweep resumes where it stopped, and a grid
that grows by a seed or a fraction runs only the new cells. Results are written by
this process as each cell finishes.

A cell's result is a JSON object: both runs' metrics (:meth:`~.metrics.RunMetrics.to_json`
plus ``events`` and ``resize_requests``), the workload's job and malleable-job counts,
and the problems its checks found.
"""

from __future__ import annotations

import concurrent.futures as cf
import hashlib
import importlib
import json
import multiprocessing
import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from attrs import frozen

from xce_resize_plugin import __version__
from xce_resize_plugin.errors import UsageError
from xce_resize_plugin.simulation.simulate import RunResult, SimOptions, SimulationError, simulate
from xce_resize_plugin.simulation.sweep_config import Cell, SweepConfig
from xce_resize_plugin.simulation.workloads import open_workload

__all__ = ["CACHE_FORMAT", "CellCache", "SweepResult", "default_cache_dir", "run_cell", "run_sweep"]

#: Part of every cache key: a change of what a cached result holds changes it.
CACHE_FORMAT = "xce-resize-sweep-cell/1"

CellResult = dict[str, Any]


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/xce-resize/sweep``, else ``~/.cache/xce-resize/sweep``."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "xce-resize" / "sweep"


def _run_json(run: RunResult) -> dict[str, Any]:
    out: dict[str, Any] = dict(run.metrics.to_json())
    out["events"] = run.events
    out["resize_requests"] = run.requests
    return out


def run_cell(source: str, options: SimOptions) -> CellResult:
    """Simulate one cell (both runs, in this process) and return its results."""
    workload = open_workload(source, options)
    comparison = simulate(workload.source, options, workload=workload, parallel=False)
    return {
        "jobs": len(workload.jobs),
        "malleable_jobs": workload.malleable,
        "rigid": _run_json(comparison.rigid),
        "elastic": _run_json(comparison.elastic),
        "problems": comparison.problems,
    }


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


def cell_key(cell: Cell, options: SimOptions) -> str:
    """The SHA-256 of everything a cell's results depend on."""
    doc = {
        "format": CACHE_FORMAT,
        "package": __version__,
        "workload": cell.workload.identity,
        "options": options.to_json(),
        "policies": _policy_hashes(options),
    }
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


class CellCache:
    """Finished cells, one JSON file per cell key in ``directory`` (created on use)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def _path(self, key: str) -> Path:
        return self.directory / f"{key}.json"

    def get(self, key: str) -> CellResult | None:
        """The cached result, or ``None`` (also for a file cut short by a crash)."""
        try:
            doc = json.loads(self._path(key).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return doc if isinstance(doc, dict) and "elastic" in doc else None

    def put(self, key: str, result: CellResult) -> None:
        """Write atomically: a reader sees the whole file or none."""
        self.directory.mkdir(parents=True, exist_ok=True)
        tmp = self._path(key).with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(result, sort_keys=True), encoding="utf-8")
        os.replace(tmp, self._path(key))


@frozen
class SweepResult:
    """Every cell with its results, in grid order, and how many ran or were cached."""

    config: SweepConfig
    cells: tuple[tuple[Cell, CellResult], ...]
    ran: int
    cached: int


Job = tuple[int, Cell, SimOptions, str]
Runner = Callable[[Sequence[Job]], Iterator[tuple[int, CellResult]]]


def _serial(jobs: Sequence[Job]) -> Iterator[tuple[int, CellResult]]:
    for i, cell, options, _ in jobs:
        yield i, _guarded(cell, options)


def _guarded(cell: Cell, options: SimOptions) -> CellResult:
    try:
        return run_cell(cell.workload.source, options)
    except SimulationError:
        raise
    except Exception as exc:  # a cell's failure names the cell
        raise SimulationError(f"cell {cell.label()}: {type(exc).__name__}: {exc}") from exc


def _local(workers: int) -> Runner:
    def run(jobs: Sequence[Job]) -> Iterator[tuple[int, CellResult]]:
        methods = multiprocessing.get_all_start_methods()
        ctx = multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")
        with cf.ProcessPoolExecutor(max_workers=min(workers, len(jobs)), mp_context=ctx) as pool:
            futures = {
                pool.submit(run_cell, cell.workload.source, options): (i, cell)
                for i, cell, options, _ in jobs
            }
            try:
                for fut in cf.as_completed(futures):
                    i, cell = futures[fut]
                    yield i, _result_of(cell, fut.result)
            finally:
                for fut in futures:
                    fut.cancel()

    return run


def _result_of(cell: Cell, get: Callable[[], CellResult]) -> CellResult:
    try:
        return get()
    except Exception as exc:  # raised in a worker: name the cell
        raise SimulationError(f"cell {cell.label()}: {type(exc).__name__}: {exc}") from exc


def _dask(address: str) -> Runner:
    try:
        # Imported by name: an optional extra, untyped; Any either way for mypy.
        distributed: Any = importlib.import_module("distributed")
    except ImportError:
        raise UsageError(
            "--dask needs the dask extra: pip install 'xce_resize_plugin[dask]'"
        ) from None

    def run(jobs: Sequence[Job]) -> Iterator[tuple[int, CellResult]]:
        try:
            client = distributed.Client(address, timeout=10, set_as_default=False)
        except (OSError, TimeoutError) as exc:
            raise UsageError(f"--dask {address}: cannot connect ({exc})") from None
        with client:
            futures = {
                client.submit(
                    run_cell, cell.workload.source, options, key=f"xce-sweep-{key}", pure=False
                ): (i, cell)
                for i, cell, options, key in jobs
            }
            try:
                for fut in distributed.as_completed(futures, loop=client.loop):
                    i, cell = futures[fut]
                    yield i, _result_of(cell, fut.result)
            finally:
                client.cancel(list(futures))

    return run


def run_sweep(
    config: SweepConfig,
    *,
    workers: int | None = None,
    dask: str | None = None,
    cache: CellCache | None = None,
    on_cell: Callable[[], None] | None = None,
    on_start: Callable[[int, int], None] | None = None,
) -> SweepResult:
    """Run the cells of ``config`` that ``cache`` does not hold; return them all.

    :param workers: local worker processes (default: the machine's cores; 1 runs the
        cells in this process).
    :param dask: the address of a Dask scheduler to run the cells on instead.
    :param on_start: called once with (cells, cached cells) before any cell runs.
    :param on_cell: called as each cell to run finishes (a progress bar).
    """
    cells = config.cells()
    results: dict[int, CellResult] = {}
    todo: list[Job] = []
    for i, cell in enumerate(cells):
        options = config.options_for(cell)
        key = cell_key(cell, options)
        hit = cache.get(key) if cache is not None else None
        if hit is not None:
            results[i] = hit
        else:
            todo.append((i, cell, options, key))
    if on_start is not None:
        on_start(len(cells), len(results))
    # The largest workloads first: the cells left at the end are then the short ones.
    todo.sort(key=lambda job: -job[1].workload.jobs)
    keys = {i: key for i, _, _, key in todo}
    if todo:
        n = workers if workers is not None else (os.cpu_count() or 1)
        runner = _dask(dask) if dask is not None else (_serial if n <= 1 else _local(n))
        for i, result in runner(todo):
            results[i] = result
            if cache is not None:
                cache.put(keys[i], result)
            if on_cell is not None:
                on_cell()
    ordered = tuple((cell, results[i]) for i, cell in enumerate(cells))
    return SweepResult(config, ordered, ran=len(todo), cached=len(cells) - len(todo))
