"""Time-parallel simulation (simulation/segments.py, simulation/parallel.py): both runs
on worker processes, each run split in time when a worker is free, give exactly the
results one process gives: every metric, every check, every per-job row.

The splits are made small here (a split past 200 jobs left, probes some tens of jobs
after the cut) so that the sample traces and small synthetic workloads split, meet,
fail to meet and split again; ``history`` says which happened, and the tests require
each to have happened somewhere.
"""

from __future__ import annotations

import multiprocessing
from pathlib import Path
from typing import Any

import attrs
import pytest

from tests.integration.test_pause_state import CTC
from xce_resize_plugin.simulation import parallel
from xce_resize_plugin.simulation.failures import HostFailures
from xce_resize_plugin.simulation.lublin import LublinSpec, generate
from xce_resize_plugin.simulation.parallel import can_split, run_both
from xce_resize_plugin.simulation.simulate import (
    MODES,
    SimOptions,
    SimulationError,
    Workload,
    load_workload,
    run_mode,
    workload_of,
)

SMALL = {
    "min_split": 200,
    "chunk": 40,
    "offsets": (16, 32, 48, 64, 96, 128, 192, 256),
    "meeting": 0,  # cut half way through what is left
}


def _same_as_one_process(
    workload: Workload, options: SimOptions, workers: int
) -> list[tuple[Any, ...]]:
    history: list[tuple[Any, ...]] = []
    split = run_both(workload, options, None, True, workers, history=history, **SMALL)
    for mode in MODES:
        alone = run_mode(workload, options, mode, job_rows=True)
        assert alone.problems == ()
        assert split[mode].to_json() == alone.to_json(), mode
        assert split[mode].jobs == alone.jobs, mode
    return history


@pytest.mark.parametrize("fraction", [0.2, 1.0])
@pytest.mark.parametrize("workers", [2, 3])
def test_the_ctc_sample_split_in_time(fraction: float, workers: int) -> None:
    options = SimOptions(malleable_fraction=fraction)
    history = _same_as_one_process(load_workload(CTC, options), options, workers)
    if workers == 3:  # idle from the start: a split whatever the timing
        assert any(e[0] == "split-ok" for e in history)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_synthetic_workloads_split_in_time(seed: int) -> None:
    options = SimOptions(malleable_fraction=0.3, slots_per_host=4)
    trace = generate(LublinSpec(jobs=1500, procs=128, load=0.7), seed=seed)
    _same_as_one_process(workload_of(trace, "lublin", options), options, 3)


def test_splits_meetings_and_misses_all_happen() -> None:
    """The cases above are not vacuous: runs are split, some segments meet their
    successors, some go on alone, and the results stay those of one process all the
    same. With three workers for two runs, the third is idle from the start and the
    rigid run is split first, half way through its jobs: that split, unlike the later
    ones, does not depend on how fast the workers go."""
    options = SimOptions(malleable_fraction=0.2)
    workload = load_workload(CTC, options)
    # The first job made to run past the trace's end holds its slots in the run from
    # the start, and is never in its successor's: they cannot meet. (Later splits, if
    # a worker is free again, depend on timing: only the first one's is checked.)
    held = attrs.evolve(workload.jobs[0], runtime=1e8, requested_time=1e8)
    workload = attrs.evolve(workload, jobs=(held, *workload.jobs[1:]))
    history = _same_as_one_process(workload, options, 3)
    rigid = [e[0] for e in history if e[1] == "rigid" and e[0] != "done"]
    assert rigid[:2] == ["split-ok", "no-meet"], history
    # As read, CTC's end from job 500 meets the run from the start.
    history = _same_as_one_process(load_workload(CTC, options), options, 3)
    rigid = [e[0] for e in history if e[1] == "rigid" and e[0] != "done"]
    assert rigid[:2] == ["split-ok", "met"], history
    options = SimOptions(malleable_fraction=0.3, slots_per_host=4)
    trace = generate(LublinSpec(jobs=1500, procs=128, load=0.7), seed=2)
    history = _same_as_one_process(workload_of(trace, "lublin", options), options, 3)
    rigid = [e[0] for e in history if e[1] == "rigid" and e[0] != "done"]
    assert rigid[:2] == ["split-ok", "met"], history


HOOKS = Path(__file__).resolve().parents[2] / "hooks"


def test_runs_with_policy_files_host_failures_or_repeated_ids_are_not_split() -> None:
    options = SimOptions(malleable_fraction=0.2)
    workload = load_workload(CTC, options)
    assert can_split(workload, options, False)
    # A site policy may keep state in its module, which no digest sees.
    policed = attrs.evolve(options, resize={"policy_files": [str(HOOKS / "power_of_two.py")]})
    assert not can_split(workload, policed, False)
    failing = attrs.evolve(options, host_failures=HostFailures(mtbf_hours=200.0, repair_hours=2.0))
    assert not can_split(workload, failing, False)
    twice = attrs.evolve(workload, jobs=(*workload.jobs, workload.jobs[-1]))
    assert not can_split(twice, options, False)
    history: list[tuple[Any, ...]] = []
    split = run_both(workload, failing, None, False, 3, history=history, **SMALL)
    assert [e[0] for e in history] == ["done", "done"]  # one segment per run
    for mode in MODES:
        assert split[mode].to_json() == run_mode(workload, failing, mode).to_json()


def test_a_failed_run_ends_every_worker_even_one_blocked_on_a_large_result(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The rigid run fails at once; the elastic one then sends its result (per-job
    rows: more than a pipe holds) to a coordinator that has stopped reading. The
    coordinator reads and drops it while the workers quit: the call returns with the
    failure, and no worker is left."""
    real = parallel.gather_run

    def failing(workload: Workload, options: SimOptions, mode: str, *a: Any, **k: Any) -> Any:
        if mode == "rigid":
            raise RuntimeError("the rigid run failed")
        return real(workload, options, mode, *a, **k)

    monkeypatch.setattr(parallel, "gather_run", failing)  # the forked workers inherit it
    options = SimOptions(malleable_fraction=0.3, slots_per_host=4)
    trace = generate(LublinSpec(jobs=6000, procs=128, load=0.7), seed=2)
    workload = workload_of(trace, "lublin", options)
    with pytest.raises(SimulationError, match="the rigid run failed"):
        run_both(workload, options, None, True, 2, chunk=10**9)
    assert multiprocessing.active_children() == []


def test_both_runs_need_a_worker_each() -> None:
    options = SimOptions(malleable_fraction=0.2)
    with pytest.raises(ValueError, match="a worker per run at least, not 1"):
        run_both(load_workload(CTC, options), options, None, False, 1)
    assert multiprocessing.active_children() == []


def test_progress_goes_forward_to_the_end_of_each_run() -> None:
    options = SimOptions(malleable_fraction=0.3, slots_per_host=4)
    trace = generate(LublinSpec(jobs=1500, procs=128, load=0.7), seed=2)
    workload = workload_of(trace, "lublin", options)
    seen: dict[str, list[int]] = {mode: [] for mode in MODES}

    def progress(mode: str, done: int, total: int) -> None:
        assert total == len(workload.jobs)
        seen[mode].append(done)

    history: list[tuple[Any, ...]] = []
    run_both(workload, options, progress, False, 3, history=history, **SMALL)
    assert any(e[0] == "split-ok" for e in history)
    for mode, values in seen.items():
        assert values == sorted(values), mode
        assert values[-1] == len(workload.jobs) and values[:-1], mode
        assert all(v < len(workload.jobs) for v in values[:-1]), mode
