"""The speedup model, its command-line form, and the malleable conversion rule."""

from __future__ import annotations

import math
from pathlib import Path

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from xce_resize_plugin.errors import ConfigError
from xce_resize_plugin.simulation.malleable import (
    MalleableRule,
    SimJob,
    SpeedupModel,
    choice_value,
    convert,
    convert_job,
    parse_speedup,
)
from xce_resize_plugin.simulation.traces import TraceJob, read_elastisim, read_swf

DATA = Path(__file__).resolve().parents[1] / "data"


def job(job_id: str | int, procs: int, runtime: float = 100.0, **extra: object) -> TraceJob:
    return TraceJob(id=str(job_id), submit=0.0, runtime=runtime, procs=procs, **extra)  # type: ignore[arg-type]


def synthetic(n: int, procs: int = 8) -> list[TraceJob]:
    return [job(i, procs) for i in range(n)]


def chosen(jobs: list[SimJob]) -> set[str]:
    return {j.id for j in jobs if j.malleable}


# ----------------------------------------------------------------------- speedup model


def test_defaults() -> None:
    assert SpeedupModel() == SpeedupModel("amdahl", 0.05, 10.0)
    assert SpeedupModel(kind="linear").serial_fraction == 0.0
    assert SpeedupModel(kind="linear").reconfig_cost == 10.0


@pytest.mark.parametrize("s", [0.0, 0.05, 0.3, 1.0])
@pytest.mark.parametrize("ref", [1, 3, 64, 1000])
def test_reference_size_gives_the_recorded_time(s: float, ref: int) -> None:
    model = SpeedupModel(serial_fraction=s)
    for t_ref in (1.0, 3477.0, 0.1 + 0.2):
        assert model.time_for(t_ref, ref, ref) == t_ref
        assert model.rate(t_ref, ref, ref) == 1.0 / t_ref
        assert model.relative_speed(ref, ref) == 1.0


def test_amdahl_values() -> None:
    model = SpeedupModel(serial_fraction=0.1)
    # From one proc: T(10) = 100 * (0.1 + 0.9 / 10) = 19.
    assert model.time_for(100.0, 1, 10) == pytest.approx(19.0)
    # T1 = T_ref * S(p_ref): a 4-proc, 100 s job needs 100 * S(4) alone.
    s4 = 1 / (0.1 + 0.9 / 4)
    assert model.speedup(4) == pytest.approx(s4)
    assert model.time_for(100.0, 4, 1) == pytest.approx(100.0 * s4)
    assert model.time_for(100.0, 4, 8) == pytest.approx(100.0 * s4 / model.speedup(8))
    assert model.relative_speed(4, 8) == pytest.approx(model.speedup(8) / s4)
    # Amdahl's limit: never faster than the serial part.
    assert model.time_for(100.0, 1, 10**9) == pytest.approx(10.0, rel=1e-6)


def test_serial_fraction_one_never_speeds_up() -> None:
    model = SpeedupModel(serial_fraction=1.0)
    assert {model.time_for(50.0, 4, p) for p in (1, 2, 4, 1000)} == {50.0}


@pytest.mark.parametrize("p", [1, 2, 3, 7, 64, 1000])
def test_linear_model_is_exact(p: int) -> None:
    model = SpeedupModel(kind="linear")
    assert model.time_for(300.0, 6, p) == pytest.approx(300.0 * 6 / p, rel=1e-15)
    # Work (procs x time) is conserved.
    assert p * model.time_for(300.0, 6, p) == pytest.approx(6 * 300.0, rel=1e-15)
    assert model.speedup(p) == pytest.approx(p)


def test_work_is_conserved_across_resizes() -> None:
    """Integrating the rate over a changing size finishes exactly the job's work."""
    model = SpeedupModel(serial_fraction=0.2)
    t_ref, ref = 1000.0, 8
    # 200 s at 8 procs, then 300 s at 16, then the rest at 4.
    done = 200 * model.rate(t_ref, ref, 8) + 300 * model.rate(t_ref, ref, 16)
    rest = (1.0 - done) / model.rate(t_ref, ref, 4)
    assert rest > 0
    assert done + rest * model.rate(t_ref, ref, 4) == pytest.approx(1.0)
    # The same job never resized takes T_ref; the 16-proc stretch made it faster than
    # running at 4 procs throughout, slower than at 16 throughout.
    total = 500 + rest
    assert model.time_for(t_ref, ref, 16) < total < model.time_for(t_ref, ref, 4)


def test_bad_arguments() -> None:
    model = SpeedupModel()
    with pytest.raises(ValueError, match="sizes"):
        model.time_for(10.0, 0, 4)
    with pytest.raises(ValueError, match="sizes"):
        model.time_for(10.0, 4, 0)
    with pytest.raises(ValueError, match="run time"):
        model.time_for(0.0, 4, 4)
    with pytest.raises(ValueError, match="procs"):
        model.speedup(0)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"kind": "gustafson"}, "must be 'amdahl' or 'linear'"),
        ({"serial_fraction": -0.1}, "between 0 and 1"),
        ({"serial_fraction": 1.5}, "between 0 and 1"),
        ({"serial_fraction": math.nan}, "between 0 and 1"),
        ({"kind": "linear", "serial_fraction": 0.1}, "no serial fraction"),
        ({"reconfig_cost": -1.0}, "reconfiguration cost"),
        ({"reconfig_cost": math.inf}, "reconfiguration cost"),
    ],
)
def test_model_validation(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        SpeedupModel(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("amdahl", SpeedupModel("amdahl", 0.05, 10.0)),
        ("amdahl:0.1", SpeedupModel("amdahl", 0.1, 10.0)),
        ("AMDAHL : 0.1 : cost = 5", SpeedupModel("amdahl", 0.1, 5.0)),
        ("amdahl:cost=0", SpeedupModel("amdahl", 0.05, 0.0)),
        ("amdahl:s=0.2:cost=3", SpeedupModel("amdahl", 0.2, 3.0)),
        ("amdahl:cost=3:s=0.2", SpeedupModel("amdahl", 0.2, 3.0)),
        ("amdahl:0", SpeedupModel("amdahl", 0.0, 10.0)),
        ("linear", SpeedupModel("linear", 0.0, 10.0)),
        ("linear:cost=2.5", SpeedupModel("linear", 0.0, 2.5)),
    ],
)
def test_parse_speedup(text: str, expected: SpeedupModel) -> None:
    model = parse_speedup(text)
    assert model == expected
    assert parse_speedup(model.spec()) == model


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "empty"),
        ("  ", "empty"),
        ("gustafson", "unknown speedup model 'gustafson'"),
        ("amdahl:x", "not a number: 'x'"),
        ("amdahl:1.5", "between 0 and 1"),
        ("amdahl:nan", "must be finite"),
        ("amdahl:0.1:0.2", "expected key=value"),
        ("amdahl:cost=-1", "reconfiguration cost"),
        ("amdahl:cost=inf", "must be finite"),
        ("amdahl:cost=1:cost=2", "given twice"),
        ("amdahl:0.1:s=0.2", "given twice"),
        ("amdahl:speed=1", "unknown speedup option 'speed'"),
        ("linear:0.1", "takes no serial fraction"),
        ("amdahl:", "not a number"),
    ],
)
def test_parse_speedup_errors(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_speedup(text)


@settings(max_examples=200, deadline=None)
@given(
    s=st.floats(min_value=0.0, max_value=1.0),
    t_ref=st.floats(min_value=1e-3, max_value=1e9),
    ref=st.integers(min_value=1, max_value=100_000),
    p=st.integers(min_value=1, max_value=100_000),
)
def test_time_is_positive_and_monotone(s: float, t_ref: float, ref: int, p: int) -> None:
    model = SpeedupModel(serial_fraction=s)
    t = model.time_for(t_ref, ref, p)
    assert t > 0 and math.isfinite(t)
    assert model.time_for(t_ref, ref, p + 1) <= t
    assert model.time_for(t_ref, ref, ref) == t_ref
    assert model.rate(t_ref, ref, p) > 0


# ---------------------------------------------------------------------------- the rule


def rule(fraction: float = 0.5, seed: int = 1, machine: int = 1000, **kw: float) -> MalleableRule:
    return MalleableRule(fraction=fraction, seed=seed, machine_procs=machine, **kw)


def test_rule_validation() -> None:
    for bad in (
        {"fraction": -0.1},
        {"fraction": 1.01},
        {"fraction": math.nan},
        {"machine_procs": 0},
        {"min_factor": 0.0},
        {"min_factor": 1.5},
        {"max_factor": 0.9},
        {"max_factor": math.inf},
        {"seed": 1.5},
    ):
        kwargs: dict[str, object] = {"fraction": 0.5, "seed": 1, "machine_procs": 10}
        kwargs.update(bad)
        with pytest.raises(ConfigError):
            MalleableRule(**kwargs)  # type: ignore[arg-type]


def test_choice_value_is_stable() -> None:
    """Pinned: the same seed and id choose the same jobs on every machine and version."""
    assert choice_value(1, "15") == 0.5385420113107756
    assert choice_value(2, "15") == 0.5499785902557175
    assert all(0.0 <= choice_value(7, str(i)) < 1.0 for i in range(1000))


def test_same_seed_same_choice_different_seed_different() -> None:
    jobs = synthetic(2000)
    a = chosen(list(convert(jobs, rule(seed=1))))
    assert a == chosen(list(convert(jobs, rule(seed=1))))
    b = chosen(list(convert(jobs, rule(seed=2))))
    assert a != b
    # Independent seeds: the overlap is about a quarter of the jobs, not half.
    assert abs(len(a & b) / len(jobs) - 0.25) < 0.05


def test_fraction_zero_and_one() -> None:
    jobs = [job(i, size) for i, size in enumerate([1, 2, 3, 1, 64, 1, 7] * 50)]
    none = list(convert(jobs, rule(fraction=0.0)))
    assert not any(j.malleable for j in none)
    assert all(j.kind == "rigid" and j.min_procs == j.procs == j.max_procs for j in none)
    every = list(convert(jobs, rule(fraction=1.0)))
    assert all(j.malleable == (j.procs > 1) for j in every)
    assert all(j.kind == ("malleable" if j.procs > 1 else "rigid") for j in every)


@pytest.mark.parametrize("fraction", [0.1, 0.3, 0.5, 0.9])
def test_chosen_share(fraction: float) -> None:
    jobs = synthetic(10_000)
    share = len(chosen(list(convert(jobs, rule(fraction=fraction, seed=42))))) / len(jobs)
    assert share == pytest.approx(fraction, abs=0.02)  # binomial sd < 0.005


def test_larger_fraction_only_adds_jobs() -> None:
    jobs = synthetic(3000)
    sets = [chosen(list(convert(jobs, rule(fraction=f)))) for f in (0.1, 0.4, 0.7)]
    assert sets[0] < sets[1] < sets[2]


def test_limit_prefix_property() -> None:
    trace = read_swf(DATA / "KTH-SP2-1996-2.1-cln-first200.swf.gz")
    r = rule(fraction=0.5, seed=9, machine=100)
    everything = list(convert(trace, r))
    for n in (0, 1, 50, 137):
        prefix = read_swf(DATA / "KTH-SP2-1996-2.1-cln-first200.swf.gz", limit=n)
        assert list(convert(prefix, r)) == everything[:n]
    # Pinned on the sample (158 jobs of size >= 2): a change of the rule shows up here.
    assert sum(j.malleable for j in everything) == 82
    assert [j.id for j in everything if j.malleable][:5] == ["19", "24", "29", "33", "34"]


def test_ranges() -> None:
    r = rule(fraction=1.0, machine=100)
    sim = convert_job(job(1, 10), r)
    assert (sim.min_procs, sim.procs, sim.max_procs, sim.malleable) == (5, 10, 20, True)
    assert convert_job(job(2, 7), r).min_procs == 3  # floor(3.5)
    assert convert_job(job(3, 2), r).min_procs == 1
    assert convert_job(job(4, 60), r).max_procs == 100  # capped by the machine
    assert convert_job(job(5, 100), r).max_procs == 100
    # 10 x 1.1 is 11.000000000000002 in floating point: still 11.
    assert convert_job(job(6, 10), rule(1.0, max_factor=1.1)).max_procs == 11
    assert convert_job(job(7, 10), rule(1.0, min_factor=0.7)).min_procs == 7
    # A size-1 job stays rigid.
    one = convert_job(job(8, 1), r)
    assert (one.min_procs, one.max_procs, one.malleable, one.kind) == (1, 1, False, "rigid")
    # A range that collapses to the job's size is no range.
    flat = convert_job(job(9, 10), rule(1.0, min_factor=1.0, max_factor=1.0))
    assert (flat.min_procs, flat.max_procs, flat.malleable, flat.kind) == (10, 10, False, "rigid")


def test_jobs_above_the_machine_are_capped() -> None:
    sim = convert_job(job(1, 500), rule(fraction=1.0, machine=64))
    assert (sim.min_procs, sim.procs, sim.max_procs) == (32, 64, 64)
    rigid = convert_job(job(1, 500), rule(fraction=0.0, machine=64))
    assert (rigid.min_procs, rigid.procs, rigid.max_procs) == (64, 64, 64)


def test_other_fields_are_kept() -> None:
    src = TraceJob("x", 3.0, 77.0, 4, 99.0, "u", "rigid", None, None, 5.0, 0)
    sim = convert_job(src, rule(fraction=1.0))
    as_trace = {f.name: getattr(sim, f.name) for f in attrs.fields(TraceJob)}
    assert as_trace == {**attrs.asdict(src), "kind": "malleable", "min_procs": 2, "max_procs": 8}


def test_elastisim_jobs_keep_their_ranges() -> None:
    trace = read_elastisim(DATA / "elastisim-sample" / "jobs.json")
    for fraction in (0.0, 1.0):
        for src, sim in zip(
            trace, convert(trace, rule(fraction=fraction, machine=128)), strict=True
        ):
            assert (sim.min_procs, sim.procs, sim.max_procs) == (
                src.min_procs,
                src.procs,
                src.max_procs,
            )
            assert sim.kind == src.kind
            assert sim.malleable == (src.kind == "malleable")
    # The machine still caps them.
    small = list(convert(trace, rule(fraction=1.0, machine=8)))
    assert all(1 <= j.min_procs <= j.procs <= j.max_procs <= 8 for j in small)


@settings(max_examples=300, deadline=None)
@given(
    procs=st.integers(min_value=1, max_value=100_000),
    machine=st.integers(min_value=1, max_value=100_000),
    fraction=st.floats(min_value=0.0, max_value=1.0),
    seed=st.integers(min_value=0, max_value=2**63),
    min_factor=st.floats(min_value=1e-3, max_value=1.0),
    max_factor=st.floats(min_value=1.0, max_value=100.0),
    job_id=st.text(min_size=1, max_size=12),
)
def test_range_invariant(
    procs: int,
    machine: int,
    fraction: float,
    seed: int,
    min_factor: float,
    max_factor: float,
    job_id: str,
) -> None:
    r = MalleableRule(
        fraction=fraction,
        seed=seed,
        machine_procs=machine,
        min_factor=min_factor,
        max_factor=max_factor,
    )
    sim = convert_job(job(job_id, procs), r)
    assert 1 <= sim.min_procs <= sim.procs <= sim.max_procs <= machine
    assert sim.malleable == (sim.min_procs < sim.max_procs)
    if sim.malleable:
        assert r.chooses(job_id) and procs >= 2
        assert sim.min_procs == max(1, math.floor(min(procs, machine) * min_factor + 1e-9))
    else:
        assert sim.min_procs == sim.procs == sim.max_procs == min(procs, machine)


@given(
    procs=st.integers(min_value=2, max_value=10**6),
    machine=st.integers(min_value=1, max_value=10**6),
    max_factor=st.floats(min_value=1.0, max_value=1.7e308),
)
@settings(max_examples=200, deadline=None)
def test_any_finite_max_factor_gives_a_range_within_the_machine(
    procs: int, machine: int, max_factor: float
) -> None:
    sim = convert_job(job(1, procs), rule(fraction=1.0, machine=machine, max_factor=max_factor))
    assert 1 <= sim.min_procs <= sim.procs <= sim.max_procs <= machine
    if sim.procs * max_factor >= machine:  # an infinite product included
        assert sim.max_procs == machine
