"""The collector is paused while a workload is built (simulation/gc_pause.py)."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from pathlib import Path

import pytest

from xce_resize_plugin.simulation import swf
from xce_resize_plugin.simulation.comparison import simulate
from xce_resize_plugin.simulation.gc_pause import gc_paused
from xce_resize_plugin.simulation.simulate import SimOptions, load_workload
from xce_resize_plugin.simulation.trace_types import TraceError


@pytest.fixture
def collector_on() -> Iterator[None]:
    was = gc.isenabled()
    gc.enable()
    yield
    (gc.enable if was else gc.disable)()


@gc_paused
def _state() -> bool:
    return gc.isenabled()


@gc_paused
def _nested() -> tuple[bool, bool]:
    inner = _state()
    return inner, gc.isenabled()


@gc_paused
def _fails() -> None:
    raise ValueError("boom")


def test_paused_during_the_call_and_running_after(collector_on: None) -> None:
    assert _state() is False
    assert gc.isenabled()


def test_nested_calls_resume_once_at_the_outermost(collector_on: None) -> None:
    assert _nested() == (False, False)
    assert gc.isenabled()


def test_an_exception_passes_with_the_collector_resumed(collector_on: None) -> None:
    with pytest.raises(ValueError, match="boom"):
        _fails()
    assert gc.isenabled()


def test_a_collector_turned_off_by_the_caller_stays_off(collector_on: None) -> None:
    gc.disable()
    assert _state() is False
    assert not gc.isenabled()


def test_reading_a_trace_runs_paused_and_resumes(
    collector_on: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    seen: list[bool] = []
    real = swf._read_swf_jobs

    def spy(*args: object, **kwargs: object) -> float:
        seen.append(gc.isenabled())
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(swf, "_read_swf_jobs", spy)
    path = tmp_path / "t.swf"
    path.write_text("1 0 0 10 2 -1 -1 2 20 -1 1 1 -1 -1 -1 -1 -1 -1\n")
    workload = load_workload(path, SimOptions())
    assert seen == [False] and len(workload.jobs) == 1
    assert gc.isenabled()
    path.write_text("1 0 0 10 2 -1 -1 2 20 -1 1 1 -1 -1 -1 -1 -1\n")  # 17 fields
    with pytest.raises(TraceError, match="17 fields"):
        load_workload(path, SimOptions())
    assert gc.isenabled()


def test_the_parent_unfreezes_after_forking_both_runs(collector_on: None, tmp_path: Path) -> None:
    """simulate() freezes the heap for its forks only: the caller's objects are
    collectable again once the children are started."""
    path = tmp_path / "t.swf"
    path.write_text(
        "1 0 0 10 2 -1 -1 2 20 -1 1 1 -1 -1 -1 -1 -1 -1\n"
        "2 5 0 10 2 -1 -1 2 20 -1 1 1 -1 -1 -1 -1 -1 -1\n"
    )
    assert gc.get_freeze_count() == 0
    result = simulate(path, SimOptions(malleable_fraction=1.0), parallel=True)
    assert result.problems == [] and result.elastic.metrics.jobs == 2
    assert gc.get_freeze_count() == 0
