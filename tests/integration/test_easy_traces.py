"""The rigid run of ``xce-resize simulate`` is textbook EASY on real traces.

Every job's start time in the rigid run equals the reference's (tests/easy_reference.py),
whether the machine is one-slot hosts (the default), hosts of 8 slots or one host
holding every slot: a trace's jobs have no span rules, so hosts must not matter. The
KTH and CTC excerpts in tests/data always run; the shared traces (../shared/traces)
are read up to a few thousand jobs and skipped when absent.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.easy_reference import RefJob, textbook_easy
from tests.unit.embedded.test_easy_textbook import Starts
from xce_resize_plugin.simulation.simulate import SimOptions, load_workload, run_mode

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data"
SAMPLES = ["KTH-SP2-1996-2.1-cln-first200.swf.gz", "CTC-SP2-1996-3.1-cln-first1000.swf.gz"]
SHARED = ROOT.parent / "shared" / "traces"


def _compare(trace: Path, limit: int | None, slots_per_host: int | None) -> None:
    options = SimOptions(malleable_fraction=0.0, limit=limit)
    workload = load_workload(trace, options)
    jobs = [RefJob(j.id, j.submit, j.procs, j.runtime, j.estimate) for j in workload.jobs]
    expected = textbook_easy(workload.capacity, jobs)
    if slots_per_host is None:  # one host holding every slot
        slots_per_host = workload.capacity
    options = SimOptions(malleable_fraction=0.0, limit=limit, slots_per_host=slots_per_host)
    workload = load_workload(trace, options)
    seen = Starts()
    run = run_mode(workload, options, "rigid", observers=[seen])
    assert run.problems == ()
    differ = {j: (seen.starts.get(j), t) for j, t in expected.items() if seen.starts.get(j) != t}
    assert not differ, f"{len(differ)} of {len(expected)} start times differ: {differ}"


@pytest.mark.parametrize("sample", SAMPLES)
@pytest.mark.parametrize("slots_per_host", [1, 8, None])
def test_trace_samples_are_textbook_easy(sample: str, slots_per_host: int | None) -> None:
    _compare(DATA / sample, None, slots_per_host)


@pytest.mark.parametrize(
    ("name", "limit"),
    [
        ("KTH-SP2-1996-2.1-cln.swf.gz", 3000),
        ("CTC-SP2-1996-3.1-cln.swf.gz", 3000),
        ("HPC2N-2002-2.2-cln.swf.gz", 3000),
    ],
)
@pytest.mark.parametrize("slots_per_host", [1, 8, None])
def test_shared_traces_are_textbook_easy(name: str, limit: int, slots_per_host: int | None) -> None:
    trace = SHARED / name
    if not trace.exists():
        pytest.skip(f"needs ../shared/traces/{name}")
    _compare(trace, limit, slots_per_host)


def test_elastic_run_does_not_depend_on_how_slots_are_grouped() -> None:
    """Grows are offered and placed on counts too: the elastic run of a trace measures
    the same on one-slot hosts, on hosts of 8 slots and on one host holding every slot."""
    runs = []
    capacity = load_workload(DATA / SAMPLES[1], SimOptions()).capacity
    for slots_per_host in (1, 8, capacity):
        options = SimOptions(malleable_fraction=0.5, slots_per_host=slots_per_host)
        run = run_mode(load_workload(DATA / SAMPLES[1], options), options, "elastic")
        assert run.problems == ()
        runs.append((run.metrics, run.events, run.requests, dict(run.refused)))
    assert runs[0][0].resizes > 0
    assert runs[0] == runs[1] == runs[2]
