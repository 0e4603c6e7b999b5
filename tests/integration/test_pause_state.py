"""A simulated run paused between instants, and the digest of its state there
(simulation/pause_state.py, the ground of the time-parallel simulation).

- pausing changes nothing: a run made of pauses gives the result of a run made whole;
- a run of the workload's end from an empty machine reaches the state of the run from
  the start (equal digests) some jobs after its first, and stays there;
- the soundness of the digest: wherever the two digests are equal, every job that ends
  from then on ends alike in both runs (hypothesis, random workloads and cut points);
- the digest tells apart states that differ (the first probes after the cut).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from xce_resize_plugin.controllers.sim import EmbeddedController
from xce_resize_plugin.simulation.jobs_csv import JobRows
from xce_resize_plugin.simulation.lublin import LublinSpec, generate
from xce_resize_plugin.simulation.pause_state import digest
from xce_resize_plugin.simulation.segments import instant_start
from xce_resize_plugin.simulation.simulate import (
    Mode,
    RunParts,
    SimOptions,
    Workload,
    gather_run,
    load_workload,
    result_of,
    workload_of,
)

DATA = Path(__file__).resolve().parents[1] / "data"
CTC = DATA / "CTC-SP2-1996-3.1-cln-first1000.swf.gz"


def _probes(workload: Workload, cut: int, step: int) -> list[int]:
    jobs = workload.jobs
    return [p for p in range(cut + step, len(jobs), step) if jobs[p].submit > jobs[p - 1].submit]


def _paused(
    workload: Workload, probes: list[int], found: dict[int, bytes]
) -> Callable[[EmbeddedController, RunParts], None]:
    """A stepper that pauses before each probe's instant and keeps the digest there."""

    def step(ctl: EmbeddedController, parts: RunParts) -> None:
        first = True
        for p in probes:
            ctl.run_before(workload.jobs[p].submit, first=first)
            first = False
            found[p] = digest(ctl, parts.driver)
        ctl.run_before(math.inf, first=first)

    return step


def _both(
    workload: Workload, options: SimOptions, mode: Mode, cut: int, step: int, tmp: Path
) -> tuple[list[int], dict[int, bytes], dict[int, bytes], JobRows, JobRows]:
    """The run from the start and the run from ``cut``, paused at the same probes."""
    probes = _probes(workload, cut, step)
    whole: dict[int, bytes] = {}
    tail: dict[int, bytes] = {}
    rows_whole, rows_tail = JobRows(mode, set()), JobRows(mode, set())
    gather_run(
        workload, options, mode, tmp / "whole", observers=[rows_whole],
        stepper=_paused(workload, probes, whole),
    )  # fmt: skip
    gather_run(
        workload, options, mode, tmp / "tail", observers=[rows_tail], first=cut,
        stepper=_paused(workload, probes, tail),
    )  # fmt: skip
    return probes, whole, tail, rows_whole, rows_tail


def test_a_paused_run_is_the_run_made_whole(tmp_path: Path) -> None:
    options = SimOptions(malleable_fraction=0.5)
    workload = load_workload(CTC, options)
    for mode in ("rigid", "elastic"):
        whole = result_of(gather_run(workload, options, mode, tmp_path / f"{mode}-whole"))
        found: dict[int, bytes] = {}
        probes = _probes(workload, 0, 7)
        paused = result_of(
            gather_run(
                workload, options, mode, tmp_path / f"{mode}-paused",
                stepper=_paused(workload, probes, found),
            )
        )  # fmt: skip
        assert len(found) == len(probes) > 100
        assert paused.problems == whole.problems == ()
        assert paused.to_json() == whole.to_json()


def test_the_run_of_the_end_reaches_the_run_from_the_start(tmp_path: Path) -> None:
    options = SimOptions(malleable_fraction=0.2)
    workload = load_workload(CTC, options)
    cut = instant_start(workload, 300)
    probes, whole, tail, rows_whole, rows_tail = _both(
        workload, options, "elastic", cut, 10, tmp_path
    )
    same = [whole[p] == tail[p] for p in probes]
    # Different at first (the run from the start still has jobs from before the cut)...
    assert not same[0]
    # ... then the same state, and the same from there on.
    met = same.index(True)
    assert all(same[met:]), "once met, the runs must stay together"
    # What the tail gives from there is what the whole run gives.
    t_met = workload.jobs[probes[met]].submit
    after_whole = [r for r in rows_whole.sorted_rows() if r[5] >= t_met]
    after_tail = [r for r in rows_tail.sorted_rows() if r[5] >= t_met]
    assert after_whole and after_whole == after_tail


@st.composite
def _cases(draw: st.DrawFn) -> tuple[Workload, SimOptions, Mode, int]:
    jobs = draw(st.integers(60, 220))
    procs = draw(st.sampled_from([16, 32, 64]))
    seed = draw(st.integers(0, 2**16))
    load = draw(st.sampled_from([0.5, 0.8, 1.0]))
    options = SimOptions(
        malleable_fraction=draw(st.sampled_from([0.0, 0.3, 1.0])),
        slots_per_host=draw(st.sampled_from([1, 4])),
    )
    trace = generate(LublinSpec(jobs=jobs, procs=procs, load=load), seed=seed)
    workload = workload_of(trace, "lublin", options)
    cut = instant_start(workload, draw(st.integers(1, len(workload.jobs) // 2)))
    mode: Mode = draw(st.sampled_from(["rigid", "elastic"]))
    return workload, options, mode, cut


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=_cases())
def test_equal_digests_mean_equal_rests_of_the_runs(
    case: tuple[Workload, SimOptions, Mode, int], tmp_path_factory: pytest.TempPathFactory
) -> None:
    workload, options, mode, cut = case
    tmp = tmp_path_factory.mktemp("pause")
    probes, whole, tail, rows_whole, rows_tail = _both(workload, options, mode, cut, 3, tmp)
    for p in probes:
        if whole[p] != tail[p]:
            continue
        at = workload.jobs[p].submit
        ended_whole = [r for r in rows_whole.sorted_rows() if r[5] >= at]
        ended_tail = [r for r in rows_tail.sorted_rows() if r[5] >= at]
        assert ended_whole == ended_tail, f"digests equal at job {p} but the runs differ after"
