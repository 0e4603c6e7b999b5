"""``xce-resize sweep``: the grid, parallel equal to serial, the cache, the intervals,
Dask, and the configuration errors."""

from __future__ import annotations

import contextlib
import json
import os
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from attrs import evolve

from xce_resize_plugin.cli.main import main
from xce_resize_plugin.controllers.sim.speedup import parse_speedup
from xce_resize_plugin.errors import ConfigError
from xce_resize_plugin.simulation import sweep as sweep_mod
from xce_resize_plugin.simulation import sweep_config as sweep_config_mod
from xce_resize_plugin.simulation.comparison import simulate
from xce_resize_plugin.simulation.failures import parse as parse_host_failures
from xce_resize_plugin.simulation.simulate import Mode, SimOptions, SimulationError
from xce_resize_plugin.simulation.sweep import CellCache, run_sweep
from xce_resize_plugin.simulation.sweep_config import check_loads, load_sweep
from xce_resize_plugin.simulation.sweep_report import format_sweep, groups, mean_ci, sweep_json

DATA = Path(__file__).resolve().parents[1] / "data"
KTH = DATA / "KTH-SP2-1996-2.1-cln-first200.swf.gz"
CTC = DATA / "CTC-SP2-1996-3.1-cln-first1000.swf.gz"


def _config(tmp_path: Path, body: str, name: str = "sweep.toml") -> Path:
    path = tmp_path / name
    path.write_text(body, encoding="utf-8")
    return path


def _grid(tmp_path: Path) -> Path:
    return _config(
        tmp_path,
        f"""
[sweep]
workloads = ["{KTH}", "{CTC}", "lublin:jobs=120,procs=64,load=0.8"]
malleable_fractions = [0.0, 0.5]
seeds = [0, 1]

[simulate]
limit = 120
""",
    )


def test_two_workers_give_the_numbers_of_the_cells_run_serially(tmp_path: Path) -> None:
    config = load_sweep(_grid(tmp_path))
    parallel = run_sweep(config, workers=2)
    serial = run_sweep(config, workers=1)
    # 12 cells, 14 runs: per trace one rigid run, one elastic run at fraction 0 for
    # both seeds, one per seed at 0.5; the synthetic workload's seed changes its jobs.
    assert parallel.ran == serial.ran == 14 and parallel.cached == 0
    assert [c for c, _ in parallel.cells] == [c for c, _ in serial.cells]
    assert [r for _, r in parallel.cells] == [r for _, r in serial.cells]
    assert json.dumps(sweep_json(parallel)) == json.dumps(sweep_json(serial))
    # The cells are real runs: the malleable ones resize, every check passed.
    elastic = [r["elastic"] for c, r in serial.cells if c.fraction == 0.5]
    assert sum(e["resizes"] for e in elastic) > 0
    assert all(not r["problems"] for _, r in serial.cells)
    # The synthetic workload without seed= changes with the cell's seed.
    synthetic = [r for c, r in serial.cells if c.workload.name.startswith("lublin:")]
    assert synthetic[0]["rigid"] != synthetic[1]["rigid"]  # seeds 0 and 1 at fraction 0
    assert synthetic[0]["rigid"] == synthetic[2]["rigid"]  # seed 0 at both fractions


def test_cells_share_a_run_only_when_it_reads_none_of_their_differences() -> None:
    """The sharing of :func:`run_options` holds: a trace's rigid run is the same run
    whatever the malleable options, and at fraction 1 the seed chooses nothing."""
    source = str(KTH)
    varied = SimOptions(
        malleable_fraction=0.5,
        seed=3,
        driver="shrink-for-queue",
        speedup=parse_speedup("linear:cost=5"),
        min_factor=0.25,
        max_factor=4.0,
        grow_cooldown=60.0,
        grow_margin=2.0,
        grow_when_queue_empty=False,
        shrink_min_delay=30.0,
        limit=150,
    )
    shared = sweep_mod.run_options(source, varied, "rigid")
    assert shared.malleable_fraction == 0.0 and shared.seed == 0
    as_given = sweep_mod.run_one(source, varied, "rigid")
    assert as_given["malleable_jobs"] > 0  # the options do mark jobs malleable
    as_shared = sweep_mod.run_one(source, shared, "rigid")
    assert (as_given["run"], as_given["problems"]) == (as_shared["run"], as_shared["problems"])
    everyone = evolve(varied, malleable_fraction=1.0)
    assert sweep_mod.run_options(source, everyone, "elastic").seed == 0
    assert sweep_mod.run_one(source, everyone, "elastic") == sweep_mod.run_one(
        source, evolve(everyone, seed=0), "elastic"
    )
    # Where the seed changes the jobs (synthetic, no seed=) or the failures, it stays.
    synthetic = "lublin:jobs=50,procs=32"
    assert sweep_mod.run_options(synthetic, varied, "rigid").seed == 3
    failing = evolve(varied, host_failures=parse_host_failures("100"))
    assert sweep_mod.run_options(source, failing, "rigid").seed == 3
    assert (
        sweep_mod.run_options(source, evolve(failing, malleable_fraction=1.0), "elastic").seed == 3
    )


def test_the_cache_makes_a_second_run_do_no_work_and_resumes_an_interrupted_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = load_sweep(_grid(tmp_path))
    cache = CellCache(tmp_path / "cache")
    calls: list[str] = []
    real = sweep_mod.run_one

    def counting(
        source: str, options: sweep_mod.SimOptions, mode: sweep_mod.Mode, identity: str | None
    ) -> sweep_mod.RunResultDoc:
        calls.append(source)
        if len(calls) == 5 and broken:
            raise RuntimeError("killed")
        return real(source, options, mode, identity)

    monkeypatch.setattr(sweep_mod, "run_one", counting)
    broken = True
    with pytest.raises(SimulationError, match=r"cell .* seed .* run\): RuntimeError: killed"):
        run_sweep(config, workers=1, cache=cache)
    assert len(list((tmp_path / "cache").glob("*.json"))) == 4  # finished before the failure
    broken = False
    calls.clear()
    resumed = run_sweep(config, workers=1, cache=cache)
    assert (resumed.ran, resumed.cached, len(calls)) == (10, 4, 10)
    calls.clear()
    again = run_sweep(config, workers=1, cache=cache)
    assert (again.ran, again.cached, calls) == (0, 14, [])
    assert again.cells == resumed.cells
    # A changed input is a new cell: one more seed makes only its own new runs (an
    # elastic run at 0.5 per trace; the synthetic workload's rigid run and two elastic).
    more = load_sweep(_config(tmp_path, _grid(tmp_path).read_text().replace("[0, 1]", "[0, 1, 2]")))
    grown = run_sweep(more, workers=1, cache=cache)
    assert (grown.ran, grown.cached) == (5, 14)


def test_confidence_interval_against_a_hand_computation() -> None:
    # x = 1..5: mean 3, s^2 = (4+1+0+1+4)/4 = 2.5, s/sqrt(5) = sqrt(0.5) = 0.70711,
    # t(0.975, 4) = 2.776445 (tables), half-width 2.776445 x 0.70711 = 1.963243.
    stat = mean_ci([1.0, 2.0, 3.0, 4.0, 5.0])
    assert stat.mean == 3.0
    assert stat.ci95 == pytest.approx(1.963243, abs=1e-6)
    # Two values 10 and 14: mean 12, s = 2.828427, se = 2, t(0.975, 1) = 12.706205.
    assert mean_ci([10.0, 14.0]).ci95 == pytest.approx(25.41241, abs=1e-5)
    assert mean_ci([7.0]).ci95 is None
    assert mean_ci([2.0, 2.0, 2.0]).ci95 == 0.0


def test_summary_rows_hold_the_cells_values(tmp_path: Path) -> None:
    config = load_sweep(_grid(tmp_path))
    result = run_sweep(config, workers=1)
    rows = groups(result)
    # Per workload: one rigid row and one per fraction (one driver).
    assert [(g.run, g.fraction) for g in rows[:3]] == [
        ("rigid", None),
        ("elastic", 0.0),
        ("elastic", 0.5),
    ]
    half = next(g for g in rows if g.workload == str(KTH) and g.fraction == 0.5)
    waits = [
        r["elastic"]["mean_wait"]
        for c, r in result.cells
        if c.workload.name == str(KTH) and c.fraction == 0.5
    ]
    assert half.stats["mean_wait"].values == tuple(waits)
    assert half.stats["mean_wait"].mean == pytest.approx(sum(waits) / 2)
    spread = abs(waits[0] - waits[1]) / 2  # s / sqrt(n) = (|a - b| / sqrt(2)) / sqrt(2)
    assert half.stats["mean_wait"].ci95 == pytest.approx(12.706205 * spread, rel=1e-6)
    text = format_sweep(result)
    assert "12 cells, 14 runs (14 made, 0 from the cache)" in text and "checks: passed" in text


def test_dask_cluster_gives_the_numbers_of_local_workers(tmp_path: Path) -> None:
    distributed = pytest.importorskip("distributed")
    config = load_sweep(_grid(tmp_path))
    with distributed.LocalCluster(
        n_workers=1, threads_per_worker=2, processes=False, dashboard_address=None
    ) as cluster:
        on_dask = run_sweep(config, dask=cluster.scheduler_address)
    local = run_sweep(config, workers=1)
    assert on_dask.ran == 14
    assert [r for _, r in on_dask.cells] == [r for _, r in local.cells]


def _new_children(psutil: Any, before: set[int]) -> set[int]:
    """This process's live descendants not in ``before``, but multiprocessing's
    resource tracker: spawned worker processes start it, and it serves this whole
    process (it ends with it)."""
    found = set()
    for child in psutil.Process().children(recursive=True):
        try:
            if child.status() == psutil.STATUS_ZOMBIE:
                continue
            if "multiprocessing.resource_tracker" in " ".join(child.cmdline()):
                continue
        except psutil.NoSuchProcess:
            continue
        found.add(child.pid)
    return found - before


@pytest.fixture
def process_cluster() -> Iterator[str]:
    """The address of a Dask cluster of two worker processes, which import the package
    and unpickle the runs as workers on other machines do; closed after the test, and
    then none of the processes it started is left (checked, and killed, by PID)."""
    distributed = pytest.importorskip("distributed")
    import psutil  # a requirement of distributed

    before = {c.pid for c in psutil.Process().children(recursive=True)}
    cluster = None
    try:
        cluster = distributed.LocalCluster(
            n_workers=2, processes=True, threads_per_worker=1, dashboard_address=None
        )
        started = _new_children(psutil, before)
        with distributed.Client(cluster, set_as_default=False) as client:
            workers = set(client.run(os.getpid).values())
        # The runs are made in two processes of their own, ones this cluster started.
        assert len(workers) == 2 and workers <= started, (workers, started)
        yield cluster.scheduler_address
    finally:
        # Whatever failed (the start, the test, the close), the processes are looked
        # for and killed; a failed close is raised after that.
        closing: Exception | None = None
        if cluster is not None:
            try:
                cluster.close()
            except Exception as exc:
                closing = exc
        deadline = time.monotonic() + 10.0
        while (left := _new_children(psutil, before)) and time.monotonic() < deadline:
            time.sleep(0.1)
        for pid in left:
            with contextlib.suppress(psutil.NoSuchProcess):
                psutil.Process(pid).kill()
        assert not left, f"processes left by the Dask cluster: {sorted(left)}"
        if closing is not None:
            raise closing


def test_a_dask_cluster_of_worker_processes_gives_the_numbers_of_a_local_run(
    tmp_path: Path, process_cluster: str
) -> None:
    """The other Dask test runs its workers as threads of this process: here each run
    is pickled to a worker process that imports the package itself."""
    config = load_sweep(
        _config(
            tmp_path,
            f"""
[sweep]
workloads = ["{KTH}", "lublin:jobs=60,procs=32,load=0.8"]
malleable_fractions = [0.0, 0.5]
seeds = [0, 1]

[simulate]
limit = 60
""",
        )
    )
    on_dask = run_sweep(config, dask=process_cluster)
    local = run_sweep(config, workers=1)
    # Per trace one rigid run, one elastic at 0, one per seed at 0.5; the synthetic
    # workload's seed changes its jobs: its rigid and elastic runs are per seed.
    assert on_dask.ran == local.ran == 10
    assert on_dask.cells == local.cells
    assert json.dumps(sweep_json(on_dask)) == json.dumps(sweep_json(local))
    assert sum(r["elastic"]["resizes"] for _, r in on_dask.cells) > 0


def test_cli_table_json_plot_and_cache(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = _config(
        tmp_path,
        f'[sweep]\nworkloads = ["{KTH.name}"]\nmalleable_fractions = [0.2]\nseeds = 2\n'
        "[simulate]\nlimit = 60\n",
    )
    (tmp_path / KTH.name).write_bytes(KTH.read_bytes())  # relative to the sweep file
    out, png, cache = tmp_path / "out.json", tmp_path / "p.png", tmp_path / "c"
    args = ["sweep", str(config), "--cache", str(cache), "--workers", "1"]
    assert main([*args, "--json", str(out), "--plot", str(png)]) == 0
    captured = capsys.readouterr()
    assert "2 cells, 3 runs (3 made, 0 from the cache)" in captured.out
    assert "sweep:" in captured.err and "3 runs made" in captured.err
    doc = json.loads(out.read_text())
    assert doc["format"] == "xce-resize-sweep" and len(doc["cells"]) == 2
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main([*args, "-q", "--json", "-"]) == 0
    captured = capsys.readouterr()
    assert captured.err == ""
    assert json.loads(captured.out)["summary"] == doc["summary"]


GRID = "[sweep]\nworkloads = ['{kth}']\nmalleable_fractions = [0.2]\n"


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (GRID + "[extra]\n", "unknown table [extra]"),
        (GRID + "repeat = 2\n", "[sweep] unknown key 'repeat'"),
        ("[sweep]\nmalleable_fractions = [0.2]\n", "[sweep] workloads is missing"),
        ("[simulate]\nlimit = 3\n", "needs a [sweep] table"),
        (GRID.replace("{kth}", "nope.swf"), "[sweep] workloads[0]: no such trace"),
        (GRID.replace("{kth}", "{bad}"), "[sweep] workloads[0]: "),
        (GRID.replace("{kth}", "lublin:jobs=5"), "workloads[0]: lublin:jobs=5: missing procs"),
        (GRID.replace("[0.2]", "[0.2, 1.5]"), "[sweep] malleable_fractions[1] must be in 0..1"),
        (GRID.replace("[0.2]", "['a']"), "[sweep] malleable_fractions[0] must be int or float"),
        (GRID.replace("[0.2]", "[]"), "[sweep] malleable_fractions must be a non-empty list"),
        (GRID + "seeds = [1, 1]\n", "[sweep] seeds lists an entry twice"),
        (GRID + "seeds = 0\n", "[sweep] seeds must be a count >= 1"),
        (GRID + "seeds = 100000000000\n", "[sweep] seeds = 100000000000 is too many"),
        (GRID + "drivers = ['fast']\n", "[sweep] drivers[0]: unknown driver 'fast'"),
        (GRID + "[simulate]\nseed = 3\n", "[simulate] seed is set by the grid"),
        (GRID + "[simulate]\nlimt = 3\n", "[simulate] unknown key 'limt'"),
        (GRID + "[simulate]\nslots_per_host = 0\n", "slots per host must be a positive integer"),
        (
            GRID.replace("{kth}", "lublin:jobs=3,procs=8") + "[simulate]\nlimit = 0\n",
            "[simulate] limit: limit must be a positive integer, not 0",
        ),
        ("[sweep\n", "not valid TOML"),
    ],
)
def test_bad_config_is_one_line_naming_file_and_key_exit_2(
    tmp_path: Path, body: str, says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.swf"
    bad.write_text("; MaxProcs: 4\n1 0 -1 10 2\n")
    config = _config(tmp_path, body.format(kth=KTH, bad=bad))
    with pytest.raises(ConfigError, match=str(config).replace(".", r"\.")):
        load_sweep(config)
    assert main(["sweep", str(config), "--no-cache"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(config) in err and says in err, err
    assert "Traceback" not in err


def test_a_sweep_file_that_is_not_utf8_is_one_line_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "latin1.toml"
    config.write_bytes(GRID.format(kth=KTH).encode() + b"# caf\xe9\n")
    assert main(["sweep", str(config), "--no-cache"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{config}: not UTF-8 text" in err, err


def test_a_load_error_only_a_cell_meets_stops_the_sweep_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Should a cell's generation still refuse its load (the check before the runs is
    skipped here), the line names the cell and says what is wrong once (not the
    error's class, then its kind, then the text)."""
    monkeypatch.setattr(sweep_config_mod, "check_load", lambda spec, seed: None)
    config = _config(tmp_path, GRID.replace("{kth}", "lublin:jobs=50,procs=64,load=1e300"))
    assert main(["sweep", str(config), "--no-cache", "--workers", "1", "-q"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "load=1e+300 cannot be reached" in err, err
    assert err.startswith("xce-resize: Simulation failed: cell lublin:jobs=50"), err
    assert "ConfigError" not in err and err.count("Configuration error") == 1, err


@pytest.mark.parametrize(
    ("spec", "seeds", "says"),
    [
        ("lublin:jobs=3,procs=8,load=1e300", "[0]", " (seed 0): load=1e+300 cannot be reached"),
        ("lublin:jobs=3,procs=8,load=1e-300", "[0]", " (seed 0): load=1e-300 is too low"),
        # The jobs of seeds 0 and 1 meet it, those of seed 2 cannot: each seed is checked.
        ("lublin:jobs=5,procs=8,load=500", "[0, 1, 2]", " (seed 2): load=500 cannot be reached"),
        # A spec's own seed= is its only workload, whatever the grid's seeds.
        ("lublin:jobs=5,procs=8,seed=2,load=500", "[0, 1]", ": load=500 cannot be reached"),
    ],
)
def test_a_load_the_workload_cannot_have_is_refused_before_any_run(
    tmp_path: Path,
    spec: str,
    seeds: str,
    says: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """It stopped the sweep when its cell ran (after the cells before it), in a line
    that named the cell, not the sweep file's entry."""
    body = f"[sweep]\nworkloads = ['{KTH}', '{spec}']\nmalleable_fractions = [0.2]\n"
    config = _config(tmp_path, f"{body}seeds = {seeds}\n[simulate]\nlimit = 20\n")
    where = f"{config}: [sweep] workloads[1]: {spec}{says}"
    read = load_sweep(config)
    with pytest.raises(ConfigError) as raised:
        check_loads(read, read.cells())
    assert str(raised.value).startswith(f"Configuration error: {where}"), raised.value

    def no_run(*args: object) -> object:
        raise AssertionError("a run was made")

    monkeypatch.setattr(sweep_mod, "run_one", no_run)
    cache = tmp_path / "cache"
    assert main(["sweep", str(config), "--cache", str(cache), "--workers", "1", "-q"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"xce-resize: Configuration error: {where}"), err
    assert not any(p.is_file() for p in cache.rglob("*"))  # nothing was kept


def test_a_load_every_seeds_workload_meets_is_taken(tmp_path: Path) -> None:
    """The load refused above at seed 2 is met at seeds 0 and 1, and by a spec whose
    own seed= is 1 whatever the grid's seeds: the check refuses no more than that."""
    for spec, seeds in (
        ("lublin:jobs=5,procs=8,load=500", [0, 1]),
        ("lublin:jobs=5,procs=8,seed=1,load=500", [0, 1, 2]),
    ):
        body = f"[sweep]\nworkloads = ['{spec}']\nmalleable_fractions = [0.2]\nseeds = {seeds}\n"
        read = load_sweep(_config(tmp_path, body))
        assert read.seeds == tuple(seeds)
        check_loads(read, read.cells())


def test_the_loads_of_cached_cells_are_not_checked_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sweep whose runs are all in its cache makes none and checks no load: those
    workloads were generated once already, and checking a large spec's load costs a
    good part of generating it."""
    spec = "lublin:jobs=40,procs=16,load=0.8"
    body = f"[sweep]\nworkloads = ['{spec}']\nmalleable_fractions = [0.2]\nseeds = [0, 1]\n"
    config = load_sweep(_config(tmp_path, body))
    cache = CellCache(tmp_path / "cache")
    checked: list[int] = []

    def counted(spec: object, seed: int) -> None:
        checked.append(seed)

    monkeypatch.setattr(sweep_config_mod, "check_load", counted)
    first = run_sweep(config, workers=1, cache=cache)
    assert first.ran == 4 and sorted(checked) == [0, 1]
    checked.clear()
    again = run_sweep(config, workers=1, cache=cache)
    assert again.ran == 0 and again.cells == first.cells
    assert checked == []


@pytest.mark.parametrize("option", ["--json", "--plot"])
def test_an_output_that_cannot_be_written_is_refused_before_any_cell_runs(
    tmp_path: Path, option: str, capsys: pytest.CaptureFixture[str]
) -> None:
    config = _config(tmp_path, GRID.format(kth=KTH) + "[simulate]\nlimit = 20\n")
    for target in (tmp_path / "none" / "out", tmp_path):
        assert main(["sweep", str(config), "--no-cache", option, str(target)]) == 2
        captured = capsys.readouterr()
        assert captured.out == "" and captured.err.count("\n") == 1
        assert f"{option} {target}: " in captured.err


def test_bad_options_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = _grid(tmp_path)
    assert main(["sweep", str(config), "--workers", "0"]) == 2
    assert "--workers" in capsys.readouterr().err
    assert main(["sweep", str(config), "--workers", "2", "--dask", "tcp://x:1"]) == 2
    assert "--dask" in capsys.readouterr().err


def test_the_documented_example_is_a_valid_sweep() -> None:
    example = Path(__file__).resolve().parents[2] / "docs" / "examples" / "sweep.toml"
    config = load_sweep(example)
    assert len(config.cells()) == 2 * 4 * 5 * 1
    assert config.workloads[0].source == str(KTH)


@pytest.mark.parametrize(
    "example",
    sorted((Path(__file__).resolve().parents[2] / "docs" / "examples").glob("sweep*.toml")),
    ids=lambda p: p.name,
)
def test_every_sweep_file_of_the_docs_is_a_valid_sweep(example: Path, tmp_path: Path) -> None:
    """The grids docs/simulation.md's tables were made with load as written: each
    trace they name is stood in for by the KTH sample (the real ones are not in the
    repository), so a misspelt key, a bad value or a wrong cell count fails here."""
    body = example.read_text(encoding="utf-8")
    sweep = tomllib.loads(body)["sweep"]
    copy = example
    if any(w.startswith("traces/") for w in sweep["workloads"]):
        copy = tmp_path / example.name
        copy.write_text(body, encoding="utf-8")
        (tmp_path / "traces").mkdir()
        for name in sweep["workloads"]:
            if name.startswith("traces/"):
                (tmp_path / name).write_bytes(KTH.read_bytes())
    config = load_sweep(copy)
    seeds = sweep["seeds"]
    expected = (
        len(sweep["workloads"])
        * len(sweep["malleable_fractions"])
        * (seeds if isinstance(seeds, int) else len(seeds))
        * len(sweep.get("drivers", ["grow-shrink"]))
    )
    assert len(config.cells()) == expected


def test_the_costliest_runs_are_made_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Longest first, so that no worker is left with a long run when the others idle:
    elastic runs by their malleable fraction, then the rigid ones (docs/performance.md,
    "Sweeps on local workers")."""
    config = load_sweep(
        _config(
            tmp_path,
            f'[sweep]\nworkloads = ["{KTH}", "{CTC}"]\nmalleable_fractions = [0.2, 1.0]\n'
            "seeds = [0]\n[simulate]\nlimit = 60\n",
        )
    )
    made: list[tuple[str, str, float]] = []
    real = sweep_mod.run_one

    def recording(
        source: str, options: SimOptions, mode: Mode, identity: str | None
    ) -> sweep_mod.RunResultDoc:
        made.append((Path(source).name[:3], mode, options.malleable_fraction))
        return real(source, options, mode, identity)

    monkeypatch.setattr(sweep_mod, "run_one", recording)
    result = run_sweep(config, workers=1)
    assert result.ran == 6
    # Both traces have 60 jobs here: the cell order (KTH's rigid run first) is not
    # the order the runs are made in.
    assert made == [
        ("KTH", "elastic", 1.0),
        ("CTC", "elastic", 1.0),
        ("KTH", "elastic", 0.2),
        ("CTC", "elastic", 0.2),
        ("KTH", "rigid", 0.0),
        ("CTC", "rigid", 0.0),
    ]


def test_the_plugins_warnings_are_shown_once_per_kind_per_cell(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A sweep's workers print no warnings (a refused requeue per job would scroll the
    progress away); each cell's are in its result and under the table, each kind once."""
    policy = Path(__file__).resolve().parents[2] / "hooks" / "requeue_on_host_failure.py"
    config = _config(
        tmp_path,
        f'[sweep]\nworkloads = ["{KTH}"]\nmalleable_fractions = [0.5]\nseeds = [0]\n'
        '[simulate]\nhost_failures = "500"\n'
        f'[resize]\npolicy_files = ["{policy}"]\nmax_requeue = 1\n',
    )
    args = ["sweep", str(config), "--cache", str(tmp_path / "c"), "--workers", "1", "-q"]
    assert main([*args, "--json", str(tmp_path / "out.json")]) == 0
    table = capsys.readouterr()
    assert table.err == ""
    (cell,) = json.loads((tmp_path / "out.json").read_text())["cells"]
    opts = SimOptions(
        malleable_fraction=0.5,
        host_failures=parse_host_failures("500"),
        resize={"policy_files": [str(policy)], "max_requeue": 1},
    )
    same = simulate(KTH, opts, parallel=False)
    expected = [
        {"run": mode, "count": w.count, "first": w.first}
        for mode in ("rigid", "elastic")
        for w in getattr(same, mode).warnings
    ]
    assert cell["warnings"] == expected and expected
    for w in expected:
        assert f" {w['run']}: {w['count']:,}  {w['first']}" in table.out
    # What the failures did, per run, as simulate --json gives it.
    for mode in ("rigid", "elastic"):
        assert cell[mode]["host_failures"] == same.to_json()["runs"][mode]["host_failures"]
    # From the cache, the same.
    assert main([*args, "--json", "-"]) == 0
    cached = json.loads(capsys.readouterr().out)["cells"][0]
    assert cached["warnings"] == expected
    assert cached["rigid"]["host_failures"] == cell["rigid"]["host_failures"]


def test_the_json_is_the_same_bytes_whether_runs_were_made_or_cached(tmp_path: Path) -> None:
    config = _config(
        tmp_path,
        f'[sweep]\nworkloads = ["{KTH}"]\nmalleable_fractions = [0.5]\nseeds = [0, 1]\n'
        "[simulate]\nlimit = 60\n",
    )
    cache = tmp_path / "c"
    args = ["sweep", str(config), "--cache", str(cache), "--workers", "1", "-q", "--json"]
    assert main([*args, str(tmp_path / "made.json")]) == 0
    # A cache file with its keys in another order (as an earlier version sorted them)
    # is read back in a fresh run's order.
    for path in cache.glob("*.json"):
        path.write_text(json.dumps(json.loads(path.read_text()), sort_keys=True), encoding="utf-8")
    assert main([*args, str(tmp_path / "cached.json")]) == 0
    made = (tmp_path / "made.json").read_bytes()
    assert made == (tmp_path / "cached.json").read_bytes()
