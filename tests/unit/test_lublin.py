"""The Lublin-Feitelson synthetic workload (``simulate --synthetic``) and its SWF output."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from xce_resize_plugin.cli.main import main
from xce_resize_plugin.errors import ConfigError
from xce_resize_plugin.simulation import lublin
from xce_resize_plugin.simulation.lublin import LublinSpec, generate, parse_spec
from xce_resize_plugin.simulation.swf_write import write_swf
from xce_resize_plugin.simulation.traces import read_swf, read_trace


def test_same_seed_same_jobs_other_seed_other_jobs() -> None:
    spec = parse_spec("lublin:jobs=500,procs=256,seed=7,load=0.8")
    a, b = generate(spec), generate(spec)
    assert a.jobs == b.jobs
    other = generate(parse_spec("lublin:jobs=500,procs=256,seed=8,load=0.8"))
    assert other.jobs != a.jobs
    # Without seed= in the spec the caller's seed is used.
    assert generate(LublinSpec(jobs=500, procs=256, load=0.8), seed=7).jobs == a.jobs


@pytest.mark.parametrize("procs", [1, 2, 3, 100, 1000, 65536])
def test_sizes_are_within_the_machine(procs: int) -> None:
    trace = generate(LublinSpec(jobs=2000, procs=procs, seed=1))
    sizes = [j.procs for j in trace.jobs]
    assert min(sizes) >= 1 and max(sizes) <= procs
    assert trace.header.max_procs == procs
    if procs >= 100:
        assert max(sizes) > procs // 4  # the second uniform stage reaches the top
    submits = [j.submit for j in trace.jobs]
    assert submits[0] == 0 and submits == sorted(submits)
    assert all(j.runtime >= 1 and j.runtime == int(j.runtime) for j in trace.jobs)


def test_statistics_match_the_model_over_many_jobs() -> None:
    jobs = generate(LublinSpec(jobs=20000, procs=1024, seed=3)).jobs
    n = len(jobs)
    serial = sum(1 for j in jobs if j.procs == 1) / n
    assert abs(serial - lublin.SERIAL_PROB) < 0.02
    parallel = [j for j in jobs if j.procs > 1]
    pow2 = sum(1 for j in parallel if j.procs & (j.procs - 1) == 0) / len(parallel)
    # At least the rounded share (POW2_PROB of all jobs); unrounded sizes hit a few more.
    expected = lublin.POW2_PROB / (1 - lublin.SERIAL_PROB)
    assert expected - 0.02 < pow2 < expected + 0.1

    def mean_log_runtime(group: list[lublin.TraceJob]) -> float:
        return sum(math.log(j.runtime) for j in group) / len(group)

    # The hyper-gamma's mix moves to the long jobs' gamma as jobs get larger.
    small = [j for j in jobs if j.procs == 1]
    large = [j for j in jobs if j.procs >= 128]
    assert mean_log_runtime(large) > mean_log_runtime(small) + 1.0
    # The daily cycle: the working day gets more arrivals than the night.
    hours = [int(j.submit % 86400 // 3600) for j in jobs]
    day = sum(1 for h in hours if 10 <= h < 18)
    night = sum(1 for h in hours if 0 <= h < 8)
    assert day > 2.5 * night


def _offered(trace: lublin.Trace) -> float:
    work = sum(j.runtime * j.procs for j in trace.jobs)
    assert trace.header.max_procs is not None
    return work / (trace.header.max_procs * trace.jobs[-1].submit)


def test_load_scales_the_arrivals() -> None:
    light = generate(parse_spec("lublin:jobs=3000,procs=512,seed=2,load=0.5"))
    heavy = generate(parse_spec("lublin:jobs=3000,procs=512,seed=2,load=0.9"))
    assert [j.procs for j in light.jobs] == [j.procs for j in heavy.jobs]
    assert [j.runtime for j in light.jobs] == [j.runtime for j in heavy.jobs]
    assert light.jobs[-1].submit > 1.6 * heavy.jobs[-1].submit
    assert _offered(light) == pytest.approx(0.5, rel=0.01)
    assert _offered(heavy) == pytest.approx(0.9, rel=0.01)


@pytest.mark.parametrize("name", ["synthetic.swf", "synthetic.swf.gz"])
def test_swf_written_reads_back_as_the_same_jobs(tmp_path: Path, name: str) -> None:
    trace = generate(parse_spec("lublin:jobs=400,procs=128,seed=5,load=0.7"))
    path = tmp_path / name
    write_swf(trace, path)
    back = read_trace(path)
    assert back.jobs == trace.jobs
    assert back.header.max_procs == 128 and back.header.version == "2.2"
    assert back.header.computer == trace.header.computer
    assert back.header.notes == trace.header.notes
    text = read_swf(path)
    assert text.stats["lines"] == 400


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("lublin:jobs=10", "missing procs"),
        ("lublin:procs=10", "missing jobs"),
        ("lublin:jobs=ten,procs=10", "jobs must be an integer"),
        ("lublin:jobs=10,procs=2.5", "procs must be an integer"),
        ("lublin:jobs=10,procs=0", "procs must be at least 1"),
        ("lublin:jobs=0,procs=4", "jobs must be at least 1"),
        ("lublin:jobs=10,procs=4,size=3", "unknown key 'size'"),
        ("lublin:jobs=10,procs=4,load=high", "load must be a number"),
        ("lublin:jobs=10,procs=4,seed=1,seed=2", "seed given twice"),
        ("feitelson:jobs=10,procs=4", "unknown synthetic model"),
        ("lublin", "the lublin model needs its parameters"),
    ],
)
def test_a_bad_spec_is_one_line_naming_the_option_exit_2(
    spec: str, says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(ConfigError, match=says):
        parse_spec(spec)
    assert main(["simulate", "--synthetic", spec]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"--synthetic {spec}: " in err and says in err
    assert "Traceback" not in err


def test_cli_synthetic_runs_and_saves_the_workload(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "w.swf"
    spec = "lublin:jobs=150,procs=64,load=0.7"
    status = main(["simulate", "--synthetic", spec, "--seed", "4", "--save-swf", str(out), "-q"])
    assert status == 0
    captured = capsys.readouterr()
    assert "checks: passed" in captured.out and captured.err == ""
    assert read_trace(out).jobs == generate(parse_spec(spec), seed=4).jobs
    assert main(["simulate", "--save-swf", str(out), "x.swf"]) == 2
    assert "--save-swf" in capsys.readouterr().err
    # A name the trace readers would not take back, a missing directory: nothing runs.
    bad_names = ("w.txt", "w.gz", "w.SWF.GZ", "none/w.swf")
    for bad in (tmp_path / name for name in bad_names):
        assert main(["simulate", "--synthetic", spec, "--save-swf", str(bad), "-q"]) == 2
        captured = capsys.readouterr()
        assert captured.out == "" and captured.err.count("\n") == 1
        assert f"--save-swf {bad}: " in captured.err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["w.swf"]


@given(load=st.floats(min_value=1e-3, max_value=1e6), seed=st.integers(0, 50))
@settings(max_examples=60, deadline=None)
def test_a_load_is_met_within_the_tolerance_or_refused(load: float, seed: int) -> None:
    spec = parse_spec(f"lublin:jobs=20,procs=16,seed={seed},load={load!r}")
    try:
        trace = generate(spec)
    except ConfigError as exc:
        assert "load=" in str(exc)
        return
    assert _offered(trace) == pytest.approx(load, rel=0.005)


@pytest.mark.parametrize(
    ("load", "says"),
    [("1e-300", "is too low: its arrivals would span"), ("1e300", "cannot be reached")],
)
def test_a_load_out_of_reach_is_one_line_exit_2(
    load: str, says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = f"lublin:jobs=5,procs=4,load={load}"
    with pytest.raises(ConfigError, match=says):
        generate(parse_spec(spec))
    assert main(["simulate", "--synthetic", spec, "-q"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"--synthetic {spec}: " in err and says in err


@settings(max_examples=200, deadline=None)
@given(st.floats(min_value=1e-6, max_value=1e6, allow_nan=False, allow_infinity=False))
def test_the_canonical_text_names_the_load_exactly(load: float) -> None:
    """The spec's text is the sweep cache's key: read back, it is the same spec, and two
    loads that differ in the seventh digit are two keys (``:g`` made them one)."""
    spec = LublinSpec(jobs=100, procs=64, seed=1, load=load)
    assert parse_spec(spec.text()) == spec
    assert LublinSpec(jobs=100, procs=64, load=0.85).text() == "lublin:jobs=100,procs=64,load=0.85"
    assert (
        LublinSpec(jobs=100, procs=64, load=0.8500001).text()
        != LublinSpec(jobs=100, procs=64, load=0.85).text()
    )
