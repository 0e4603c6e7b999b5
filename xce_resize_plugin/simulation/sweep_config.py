"""The configuration file of ``xce-resize sweep`` and the grid of cells it names.

A TOML file with a ``[sweep]`` table (the grid) and, optionally, the ``[simulate]`` and
``[resize]`` tables of ``simulate --config`` (every cell's other settings)::

    [sweep]
    workloads = ["traces/KTH-SP2-1996-2.1-cln.swf.gz", "lublin:jobs=5000,procs=1024,load=0.8"]
    malleable_fractions = [0.0, 0.2, 0.5]
    seeds = [0, 1, 2]          # or a count: seeds = 5 means 0..4
    drivers = ["grow-shrink"]  # optional, this is the default

The grid is every workload x fraction x seed x driver; each combination is a
:class:`Cell`, run as ``simulate`` runs a trace (both runs). Trace paths are relative
to the configuration file's directory. A synthetic spec without ``seed=`` takes the
cell's seed (so seeds vary the workload as well as the malleable choice); with one,
only the malleable choice varies. ``[simulate]`` may not set what the grid sets
(``malleable_fraction``, ``seed``, ``driver``).

Every mistake is a :class:`~xce_resize_plugin.errors.ConfigError` naming the file and
the key (and, for a list, the entry): unknown tables and keys, wrong types, empty or
repeated lists, fractions outside 0..1, a seed count above :data:`MAX_SEEDS`, a grid of
more than :data:`MAX_CELLS` cells, a seed of more than 19 digits, unknown
drivers, missing trace files, traces that do not parse (every trace is read once here,
before any cell runs, so that a bad one stops the sweep at once rather than hours
later), bad synthetic specs. A synthetic ``load`` that the workload of one of the
grid's seeds cannot have is refused in the same words by :func:`check_loads`, which
the sweep calls for the cells it is about to run, before it runs any.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
from attrs import frozen

from xce_resize_plugin.errors import ConfigError
from xce_resize_plugin.simulation.drivers import DRIVERS
from xce_resize_plugin.simulation.lublin import check_load, is_spec, parse_spec
from xce_resize_plugin.simulation.simulate import (
    SimOptions,
    host_count,
    machine_procs,
    options_from_tables,
    read_toml,
)
from xce_resize_plugin.simulation.sweep_inputs import trace_identity
from xce_resize_plugin.simulation.traces import read_trace

__all__ = ["MAX_CELLS", "Cell", "SweepConfig", "WorkloadRef", "check_loads", "load_sweep"]

_TABLES = ("sweep", "simulate", "resize")
#: The largest ``seeds = N`` count (a grid of that many seeds is already days of runs).
MAX_SEEDS = 10_000
#: The most cells a grid may have (workloads x fractions x seeds x drivers): each is
#: two runs of seconds to minutes, and preparing a cell (its run keys, its cache
#: files) takes about 0.1 ms, so 100,000 cells are ten seconds before the first run
#: and days of runs. A million-cell grid worked silently for minutes, a larger one
#: ran out of memory listing its cells (docs/simulation.md, "Limits on inputs").
MAX_CELLS = 100_000
_SWEEP_KEYS = ("workloads", "malleable_fractions", "seeds", "drivers")
_GRID_KEYS = {
    "malleable_fraction": "malleable_fractions",
    "seed": "seeds",
    "driver": "drivers",
}


@frozen
class WorkloadRef:
    """One workload of the grid: its name in the file, what to open, and what
    identifies its content for the cache (a trace's SHA-256, a spec's text)."""

    name: str
    source: str
    identity: str
    jobs: int


@frozen
class Cell:
    """One run of the grid: a workload at a malleable fraction, seed and driver."""

    workload: WorkloadRef
    fraction: float
    seed: int
    driver: str

    def label(self) -> str:
        return (
            f"{self.workload.name} fraction {self.fraction:g} seed {self.seed} driver {self.driver}"
        )


@frozen
class SweepConfig:
    """A read sweep file: its grid and the options every cell shares."""

    path: Path
    workloads: tuple[WorkloadRef, ...]
    fractions: tuple[float, ...]
    seeds: tuple[int, ...]
    drivers: tuple[str, ...]
    options: SimOptions

    def cells(self) -> list[Cell]:
        """Every cell, workload by workload, then fraction, seed and driver."""
        return [
            Cell(w, f, s, d)
            for w in self.workloads
            for f in self.fractions
            for s in self.seeds
            for d in self.drivers
        ]

    def options_for(self, cell: Cell) -> SimOptions:
        return attrs.evolve(
            self.options, malleable_fraction=cell.fraction, seed=cell.seed, driver=cell.driver
        )


def _list(path: Path, section: Mapping[str, Any], key: str, kinds: tuple[type, ...]) -> list[Any]:
    value = section[key]
    if not isinstance(value, list) or not value:
        raise ConfigError(f"{path}: [sweep] {key} must be a non-empty list, not {value!r}")
    for i, item in enumerate(value):
        if isinstance(item, bool) or not isinstance(item, kinds):
            names = " or ".join(k.__name__ for k in kinds)
            raise ConfigError(f"{path}: [sweep] {key}[{i}] must be {names}, not {item!r}")
    if len(set(value)) != len(value):
        raise ConfigError(f"{path}: [sweep] {key} lists an entry twice: {value!r}")
    return value


def _seeds(path: Path, section: Mapping[str, Any]) -> tuple[int, ...]:
    value = section.get("seeds", [0])
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 1:
            raise ConfigError(f"{path}: [sweep] seeds must be a count >= 1 or a list, not {value}")
        if value > MAX_SEEDS:
            raise ConfigError(
                f"{path}: [sweep] seeds = {value} is too many (at most {MAX_SEEDS}; "
                "a list names any seeds)"
            )
        return tuple(range(value))
    seeds = tuple(_list(path, {"seeds": value}, "seeds", (int,)))
    for i, seed in enumerate(seeds):
        try:
            SimOptions(seed=seed)
        except ConfigError as exc:
            raise ConfigError(f"{path}: [sweep] seeds[{i}]: {exc.detail}") from None
    return seeds


def _workload(path: Path, i: int, text: str, options: SimOptions) -> WorkloadRef:
    where = f"{path}: [sweep] workloads[{i}]"
    if is_spec(text):
        try:
            spec = parse_spec(text)
        except ConfigError as exc:
            raise ConfigError(f"{where}: {text}: {exc.detail}") from None
        jobs = spec.jobs if options.limit is None else min(spec.jobs, options.limit)
        _check_machine(where, spec.procs, options)
        return WorkloadRef(text, text, f"synthetic {spec.text()}", jobs)
    trace_path = Path(text)
    if not trace_path.is_absolute():
        trace_path = (path.resolve().parent / trace_path).resolve()
    if not trace_path.exists():
        raise ConfigError(f"{where}: no such trace {str(trace_path)!r}")
    try:
        trace = read_trace(trace_path, limit=options.limit)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc.detail}") from None
    if not trace.jobs:
        raise ConfigError(f"{where}: {trace_path} has no job to simulate")
    _check_machine(where, machine_procs(trace), options)
    try:
        identity = trace_identity(trace_path)
    except OSError as exc:
        raise ConfigError(f"{where}: cannot read {trace_path} ({exc})") from None
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc.detail}") from None
    return WorkloadRef(text, os.fspath(trace_path), identity, len(trace))


def check_loads(config: SweepConfig, cells: Iterable[Cell]) -> None:
    """The ``load`` of each synthetic workload among ``cells`` can be met by the
    workload each of their seeds generates (a spec's own ``seed=`` is its only one):
    a load out of reach would stop the sweep only when its cell ran, after the cells
    before it, in a line naming the cell rather than the file's entry. The sweep asks
    this for the cells it is about to run, before any runs: those in its cache were
    generated once already, and a large spec costs a good part of generating it
    (:func:`~.lublin.check_load`)."""
    wanted = {(c.workload, c.seed) for c in cells}
    for i, workload in enumerate(config.workloads):
        if not is_spec(workload.source):
            continue
        spec = parse_spec(workload.source)
        own = spec.seed is not None
        for seed in sorted({seed for w, seed in wanted if w == workload}):
            try:
                check_load(spec, seed)
            except ConfigError as exc:
                where = f"{config.path}: [sweep] workloads[{i}]: {workload.name}"
                at = "" if own else f" (seed {seed})"
                raise ConfigError(f"{where}{at}: {exc.detail}") from None
            if own:
                break  # every seed of the grid generates the spec's own


def _check_machine(where: str, procs: int, options: SimOptions) -> None:
    """The machine the workload needs can be simulated (checked here, not after the
    other workloads' runs)."""
    try:
        host_count(procs, options.slots_per_host)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc.detail}") from None


def _refuse_repeats(path: Path, workloads: Sequence[WorkloadRef]) -> None:
    """Two entries that are one workload under two names (a trace's path through
    ``..`` or a link, a spec's keys in another order) would make the same runs and
    show them as two workloads: a repeated entry, as in the other lists. (Copies of
    one trace under two names are allowed: the docs' tests stand one sample in for
    several traces.)"""
    first: dict[str, int] = {}
    for i, w in enumerate(workloads):
        # A spec's identity is its canonical text; a trace is its file, wherever named.
        j = first.setdefault(w.identity if is_spec(w.source) else _file_of(w.source), i)
        if j != i:
            raise ConfigError(
                f"{path}: [sweep] workloads[{i}] {w.name!r} is the same workload as "
                f"workloads[{j}] {workloads[j].name!r}"
            )


def _file_of(source: str) -> str:
    """The file a trace is read from: an ElastiSim directory is its ``jobs.json``."""
    path = Path(source)
    return os.path.realpath(path / "jobs.json" if path.is_dir() else path)


def _options(path: Path, data: Mapping[str, Any]) -> SimOptions:
    section = data.get("simulate", {})
    if isinstance(section, dict):
        for key, grid_key in _GRID_KEYS.items():
            if key in section:
                raise ConfigError(
                    f"{path}: [simulate] {key} is set by the grid: use [sweep] {grid_key}"
                )
    try:
        return options_from_tables(path, data)
    except ConfigError as exc:
        detail = exc.detail or str(exc)
        raise ConfigError(detail if detail.startswith(str(path)) else f"{path}: {detail}") from None


def load_sweep(config: str | os.PathLike[str]) -> SweepConfig:
    """Read and check a sweep file (see the module docstring)."""
    path = Path(config)
    data = read_toml(path)
    unknown = sorted(set(data) - set(_TABLES))
    if unknown:
        raise ConfigError(f"{path}: unknown table [{unknown[0]}] (known: {', '.join(_TABLES)})")
    section = data.get("sweep")
    if not isinstance(section, dict):
        raise ConfigError(f"{path}: a sweep file needs a [sweep] table with workloads")
    for key in section:
        if key not in _SWEEP_KEYS:
            raise ConfigError(
                f"{path}: [sweep] unknown key {key!r} (known: {', '.join(_SWEEP_KEYS)})"
            )
    for key in ("workloads", "malleable_fractions"):
        if key not in section:
            raise ConfigError(f"{path}: [sweep] {key} is missing")
    options = _options(path, data)
    fractions = _list(path, section, "malleable_fractions", (int, float))
    for i, f in enumerate(fractions):
        if not 0.0 <= f <= 1.0:
            raise ConfigError(f"{path}: [sweep] malleable_fractions[{i}] must be in 0..1, not {f}")
    drivers = _list(path, {"drivers": section.get("drivers", ["grow-shrink"])}, "drivers", (str,))
    for i, d in enumerate(drivers):
        if d not in DRIVERS:
            raise ConfigError(
                f"{path}: [sweep] drivers[{i}]: unknown driver {d!r} (known: {', '.join(DRIVERS)})"
            )
    texts: Sequence[str] = _list(path, section, "workloads", (str,))
    seeds = _seeds(path, section)
    # Before any trace is read or any key hashed: the count needs only the lists.
    cells = len(texts) * len(fractions) * len(seeds) * len(drivers)
    if cells > MAX_CELLS:
        raise ConfigError(
            f"{path}: [sweep] the grid has {cells:,} cells ({len(texts)} workloads x "
            f"{len(fractions)} fractions x {len(seeds)} seeds x {len(drivers)} drivers), "
            f"more than {MAX_CELLS:,}: split it into several sweeps"
        )
    workloads = tuple(_workload(path, i, t, options) for i, t in enumerate(texts))
    _refuse_repeats(path, workloads)
    return SweepConfig(
        path=path,
        workloads=workloads,
        # + 0.0: -0.0 is the fraction 0.0, and is shown as 0.
        fractions=tuple(float(f) + 0.0 for f in fractions),
        seeds=seeds,
        drivers=tuple(drivers),
        options=options,
    )
