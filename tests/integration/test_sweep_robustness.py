"""``xce-resize sweep`` when things go wrong: a killed sweep's workers, a resumed one's
broken cache files, the cache key's exact inputs, identical values' interval, and the
inputs refused before any run (a cache directory, a plot format, a Dask address,
one workload named twice)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from attrs import evolve

from xce_resize_plugin.cli.main import main
from xce_resize_plugin.errors import ConfigError
from xce_resize_plugin.simulation import sweep as sweep_mod
from xce_resize_plugin.simulation.failures import parse as parse_host_failures
from xce_resize_plugin.simulation.simulate import SimOptions, SimulationError
from xce_resize_plugin.simulation.sweep import CellCache, run_key, run_sweep, tree_hash
from xce_resize_plugin.simulation.sweep_cache import run_doc_ok
from xce_resize_plugin.simulation.sweep_config import Cell, WorkloadRef, load_sweep
from xce_resize_plugin.simulation.sweep_report import mean_ci

DATA = Path(__file__).resolve().parents[1] / "data"
KTH = DATA / "KTH-SP2-1996-2.1-cln-first200.swf.gz"
SMALL = f"[sweep]\nworkloads = ['{KTH}']\nmalleable_fractions = [0.5]\n[simulate]\nlimit = 40\n"
#: Runs of a few seconds each: still running when the sweep is killed.
SLOW = (
    "[sweep]\nworkloads = ['lublin:jobs=20000,procs=128,load=0.9']\n"
    "malleable_fractions = [0.3, 0.6]\nseeds = [0, 1]\n"
)

linux_only = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")


def _config(tmp_path: Path, body: str, name: str = "sweep.toml") -> Path:
    path = tmp_path / name
    path.write_text(body, encoding="utf-8")
    return path


def _group(pgid: int) -> dict[int, tuple[int, str]]:
    """The live processes of a process group: pid -> (parent pid, state)."""
    out = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        fields = text[text.rindex(")") + 2 :].split()  # after "pid (comm) "
        state, ppid, group = fields[0], int(fields[1]), int(fields[2])
        if group == pgid and state != "Z":
            out[int(stat.parent.name)] = (ppid, state)
    return out


def _start_sweep(config: Path, cache: Path, stderr: Path | None = None) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-m", "xce_resize_plugin.cli.main", "sweep", str(config)]
    # Its runs' temporary directories under the test's own (a killed run leaves its).
    scratch = cache.parent / "tmp"
    scratch.mkdir(exist_ok=True)
    with contextlib.ExitStack() as files:
        err = subprocess.DEVNULL if stderr is None else files.enter_context(stderr.open("wb"))
        return subprocess.Popen(
            [*argv, "--cache", str(cache), "--workers", "2", "-q"],
            stdout=subprocess.DEVNULL,
            stderr=err,  # the child has its own copy: ours is closed on return
            start_new_session=True,  # its own group: the test finds and ends all of it
            # A terminal's Ctrl-C, not the SIG_IGN a background job may inherit.
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
            env={**os.environ, "TMPDIR": str(scratch)},
        )


def _wait_for(check: Callable[[], bool], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.05)
    return False


@linux_only
@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGTERM, signal.SIGINT])
def test_the_workers_end_with_a_sweep_killed_mid_run(tmp_path: Path, how: int) -> None:
    """Before, a sweep killed (SIGKILL, SIGTERM, a lost session's SIGHUP) left its
    workers computing runs nobody would read, and then waiting for work forever; a
    Ctrl-C to the sweep's process waited for the running runs to end."""
    errors = tmp_path / "stderr"
    proc = _start_sweep(_config(tmp_path, SLOW), tmp_path / "cache", errors)
    try:

        def workers() -> list[int]:
            # The pool's workers are the forkserver's children, not the sweep's.
            group = _group(proc.pid)
            return [pid for pid, (ppid, _) in group.items() if group.get(ppid, (0,))[0] == proc.pid]

        assert _wait_for(lambda: len(workers()) == 2, 30), _group(proc.pid)
        time.sleep(0.5)  # inside their runs
        os.kill(proc.pid, how)
        proc.wait(timeout=5)  # Ctrl-C: at once, not when the runs (of 8 s or more) end
        assert _wait_for(lambda: not _group(proc.pid), 5), _group(proc.pid)
    finally:
        for pid in _group(proc.pid):
            os.kill(pid, signal.SIGKILL)
        proc.kill()
        proc.wait()
    assert not list((tmp_path / "cache").glob("*.json"))  # no run had finished
    if how != signal.SIGKILL:
        # The killed runs' temporary directories (their journals) went with the sweep's
        # scratch directory; a SIGKILL leaves it, as it leaves anything.
        assert list((tmp_path / "tmp").iterdir()) == []
        # One line, and nothing from the pool's thread or the resource tracker (a
        # traceback of a cancelled run failed, semaphores leaked by a SIGTERM).
        said = errors.read_text(encoding="utf-8", errors="replace")
        assert proc.returncode == (130 if how == signal.SIGINT else 143), said
        assert said == (
            "xce-resize: interrupted\n" if how == signal.SIGINT else "xce-resize: terminated\n"
        ), said


@linux_only
def test_a_sweep_killed_then_resumed_remakes_only_missing_and_broken_runs(
    tmp_path: Path,
) -> None:
    """A real kill -9 after some runs were kept; then one kept file cut short and one
    overwritten with garbage (as a crash of the machine may leave them): the resumed
    sweep makes those two and the missing runs again, and takes the rest."""
    body = SLOW.replace("jobs=20000", "jobs=1000").replace("[0, 1]", "[0, 1, 2]")
    config, cache = _config(tmp_path, body), tmp_path / "cache"
    proc = _start_sweep(config, cache)
    try:
        assert _wait_for(lambda: len(list(cache.glob("*.json"))) >= 3, 60)
        proc.kill()
        proc.wait()
        assert _wait_for(lambda: not _group(proc.pid), 5), _group(proc.pid)
    finally:
        for pid in _group(proc.pid):
            os.kill(pid, signal.SIGKILL)
    kept = sorted(cache.glob("*.json"))
    total = 9  # 6 cells: 3 rigid runs (the seed is the workload's) + 6 elastic
    assert 3 <= len(kept) < total
    kept[0].write_bytes(kept[0].read_bytes()[:100])
    kept[1].write_bytes(b"\0\0\xffgarbage")
    resumed = run_sweep(load_sweep(config), workers=2, cache=CellCache(cache))
    assert (resumed.ran, resumed.cached) == (total - len(kept) + 2, len(kept) - 2)
    fresh = run_sweep(load_sweep(config), workers=2)
    assert resumed.cells == fresh.cells


def test_the_cache_key_sees_the_exact_host_failures() -> None:
    """The options' JSON wrote them with %g (6 digits): 2 and 2.0000004 hours gave one
    key, so a cached run of the one was taken for the other, whose results differ. (The
    JSON is exact now too, tests/unit/test_failures_spec.py; the key keeps the values.)"""
    options = SimOptions(limit=40, host_failures=parse_host_failures("2"))
    close = evolve(options, host_failures=parse_host_failures("2.0000004"))
    cell = Cell(WorkloadRef(str(KTH), str(KTH), "trace x", 40), 0.2, 0, "grow-shrink")
    assert run_key(cell, options, "elastic") != run_key(cell, close, "elastic")
    one = sweep_mod.run_one(str(KTH), options, "elastic")["run"]
    other = sweep_mod.run_one(str(KTH), close, "elastic")["run"]
    assert one != other


def test_the_cache_key_sees_the_package_code(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The version stays 0.1.0 while the simulator changes: the key holds the code's
    hash, which changes with any file's name or content."""
    cell = Cell(WorkloadRef("w", "w", "trace x", 1), 0.2, 0, "grow-shrink")
    options = SimOptions()
    before = run_key(cell, options, "rigid")
    monkeypatch.setattr(sweep_mod, "code_hash", lambda: "another simulator")
    assert run_key(cell, options, "rigid") != before
    (tmp_path / "a.py").write_text("x = 1\n")
    (tmp_path / "b.py").write_text("y = 2\n")
    first = tree_hash(tmp_path)
    assert tree_hash(tmp_path) == first
    (tmp_path / "b.py").write_text("y = 3\n")
    second = tree_hash(tmp_path)
    assert second != first
    # The same bytes split otherwise between the files are another tree.
    (tmp_path / "a.py").write_text("x = 1\ny")
    (tmp_path / "b.py").write_text(" = 3\n")
    assert tree_hash(tmp_path) not in (first, second)


def test_identical_values_have_that_value_as_mean_and_a_zero_interval() -> None:
    """Every seed of a trace's rigid row is the same run: fsum / n rounded 0.1 x 3 to
    0.10000000000000002 and left an interval of 4e-17."""
    stat = mean_ci([0.1, 0.1, 0.1])
    assert (stat.mean, stat.ci95) == (0.1, 0.0)
    assert (mean_ci([6188.26] * 3).mean, mean_ci([6188.26] * 3).ci95) == (6188.26, 0.0)
    assert mean_ci([0.1]).ci95 is None
    assert mean_ci([1.0, 2.0]).ci95 == pytest.approx(12.706205 * 0.5, rel=1e-6)


def _no_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object) -> object:
        raise AssertionError("a run was made")

    monkeypatch.setattr(sweep_mod, "run_one", refuse)


def test_a_plot_format_matplotlib_lacks_is_refused_before_any_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("matplotlib")
    _no_runs(monkeypatch)
    config = _config(tmp_path, SMALL)
    out = tmp_path / "plot.xyz"
    argv = ["sweep", str(config), "--no-cache", "--workers", "1", "--plot", str(out)]
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1, captured.err
    assert f"--plot {out}: matplotlib writes no 'xyz' image" in captured.err


@pytest.mark.parametrize("where", ["option", "environment"])
def test_a_cache_directory_that_cannot_be_written_is_refused_before_any_run(
    tmp_path: Path,
    where: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    _no_runs(monkeypatch)
    config = _config(tmp_path, SMALL)
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    argv = ["sweep", str(config), "--workers", "1", "-q"]
    if where == "option":
        argv += ["--cache", str(blocker / "cache")]
        says = f"--cache {blocker / 'cache'}: cannot write there"
    else:
        monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))
        says = f"the cache directory {blocker / 'xce-resize' / 'sweep'}: cannot write there"
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1, captured.err
    assert says in captured.err and "--no-cache" in captured.err


def test_a_malformed_dask_address_is_one_line_exit_2_at_once(tmp_path: Path) -> None:
    """Before, a traceback (exit 1), then a 20 s wait at exit for the half-made client."""
    pytest.importorskip("distributed")
    config = _config(tmp_path, SMALL)
    argv = [sys.executable, "-m", "xce_resize_plugin.cli.main", "sweep", str(config)]
    began = time.monotonic()
    proc = subprocess.run(
        [*argv, "--no-cache", "-q", "--dask", "no-port-here"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert time.monotonic() - began < 15
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1, proc.stderr
    assert "--dask no-port-here: not a scheduler address" in proc.stderr


@pytest.mark.parametrize(
    "entries",
    [
        [str(KTH), str(KTH.parent / ".." / "data" / KTH.name)],
        ["link.swf.gz", str(KTH)],
        ["lublin:jobs=30,procs=16", "lublin:procs=16, jobs=30"],
        ["es", "es/jobs.json"],
    ],
    ids=["dot-dot", "symlink", "spec-order", "elastisim-dir-and-file"],
)
def test_one_workload_named_twice_is_a_repeated_entry(
    tmp_path: Path, entries: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """Before, both names ran (the same runs) and the table showed the workload twice."""
    (tmp_path / "link.swf.gz").symlink_to(KTH)
    shutil.copytree(DATA / "elastisim-sample", tmp_path / "es")
    listed = ", ".join(f"'{e}'" for e in entries)
    config = _config(tmp_path, f"[sweep]\nworkloads = [{listed}]\nmalleable_fractions = [0.5]\n")
    with pytest.raises(ConfigError, match=r"\[sweep\] workloads\[1\] .* is the same workload"):
        load_sweep(config)
    assert main(["sweep", str(config), "--no-cache"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(config) in err and "workloads[1]" in err, err


def test_copies_of_one_trace_under_two_names_stay_two_workloads(tmp_path: Path) -> None:
    """The docs' tests stand one sample in for several traces: not a repeated entry."""
    (tmp_path / "a.swf.gz").write_bytes(KTH.read_bytes())
    (tmp_path / "b.swf.gz").write_bytes(KTH.read_bytes())
    body = "[sweep]\nworkloads = ['a.swf.gz', 'b.swf.gz']\nmalleable_fractions = [0.5]\n"
    assert len(load_sweep(_config(tmp_path, body)).workloads) == 2


# --- the cache holds only results, of the content its key names --------------------------


def test_a_cache_file_of_another_shape_is_made_again(tmp_path: Path) -> None:
    """Valid JSON that is not a run's result ({"run": {}} stopped the sweep with a
    KeyError): the run is made again, and its file replaced."""
    config, cache = _config(tmp_path, SMALL), tmp_path / "cache"
    first = run_sweep(load_sweep(config), workers=1, cache=CellCache(cache))
    files = sorted(cache.glob("*.json"))
    assert first.ran == len(files) == 2
    good = json.loads(files[0].read_text())
    assert run_doc_ok(good)
    for bad in (
        {"run": {}},
        {**good, "run": {**good["run"], "mean_wait": "1"}},
        {**good, "problems": "none"},
        {**good, "jobs": True},
        {k: v for k, v in good.items() if k != "malleable_jobs"},
        {**good, "run": {**good["run"], "host_failures": {"jobs_killed": 1}}},
        {**good, "warnings": [{"run": "rigid", "count": -1, "first": "x"}]},
    ):
        assert not run_doc_ok(bad)
        files[0].write_text(json.dumps(bad))
        again = run_sweep(load_sweep(config), workers=1, cache=CellCache(cache))
        assert (again.ran, again.cached) == (1, 1) and again.cells == first.cells
        assert json.loads(files[0].read_text()) == good


def test_a_result_the_cache_cannot_keep_is_still_used_and_said(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A directory where a result's file goes (os.replace failed with a traceback and
    left a temporary file): the sweep finishes, its table is whole, and it says so."""
    config, cache = _config(tmp_path, SMALL), tmp_path / "cache"
    keys = [f.stem for f in _fill(config, tmp_path / "probe")]
    for key in keys:
        (cache / f"{key}.json").mkdir(parents=True)
    assert main(["sweep", str(config), "--cache", str(cache), "--workers", "1", "--json", "-"]) == 0
    out, err = capsys.readouterr()
    assert len(json.loads(out)["cells"]) == 1
    assert "warning: 2 run(s) could not be kept in the cache" in err and "Traceback" not in err
    assert sorted(p.name for p in cache.iterdir()) == sorted(f"{k}.json" for k in keys)


def _fill(config: Path, cache: Path) -> list[Path]:
    run_sweep(load_sweep(config), workers=1, cache=CellCache(cache))
    return sorted(cache.glob("*.json"))


def test_a_trace_changed_during_the_sweep_stops_it_uncached(tmp_path: Path) -> None:
    """The trace is hashed when the sweep file is read; a run reads it later. Replaced
    in between, its results were cached under the first content's key."""
    trace = tmp_path / "t.swf.gz"
    trace.write_bytes(KTH.read_bytes())
    config = _config(tmp_path, SMALL.replace(str(KTH), "t.swf.gz"))
    loaded = load_sweep(config)
    ctc = DATA / "CTC-SP2-1996-3.1-cln-first1000.swf.gz"
    trace.write_bytes(ctc.read_bytes())
    cache = tmp_path / "cache"
    with pytest.raises(SimulationError, match=r"t\.swf\.gz: the trace changed since the sweep"):
        run_sweep(loaded, workers=1, cache=CellCache(cache))
    assert not list(cache.glob("*.json"))


def test_an_elastisim_platform_is_part_of_the_key(tmp_path: Path) -> None:
    """Only jobs.json was hashed: a slower platform was served from the cache."""
    project = tmp_path / "es"
    shutil.copytree(DATA / "elastisim-sample", project)
    body = "[sweep]\nworkloads = ['es/jobs.json']\nmalleable_fractions = [0.0]\n"
    config, cache = _config(tmp_path, body), CellCache(tmp_path / "cache")
    before = run_sweep(load_sweep(config), workers=1, cache=cache)
    platform = project / "crossbar.xml"
    platform.write_text(platform.read_text().replace('speed="100Gf"', 'speed="10Gf"'))
    after = run_sweep(load_sweep(config), workers=1, cache=cache)
    assert after.ran == 2 and after.cells != before.cells


def test_a_machine_too_large_is_refused_before_any_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Checked when the sweep file is read, not after the other workloads' runs."""
    big = tmp_path / "big.swf"
    big.write_text("; MaxProcs: 50000000\n1 0 -1 10 1 -1 -1 1 -1 -1 1 1 -1 -1 -1 -1 -1 -1\n")
    for second in ("big.swf", "lublin:jobs=10,procs=50000000"):
        body = f"[sweep]\nworkloads = ['{KTH}', '{second}']\nmalleable_fractions = [0.2]\n"
        config = _config(tmp_path, body)
        with pytest.raises(ConfigError, match=r"workloads\[1\]: 50,000,000 slots .* more than"):
            load_sweep(config)
        cache = tmp_path / "cache"
        assert main(["sweep", str(config), "--cache", str(cache), "--workers", "1"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "Traceback" not in err
        assert not cache.exists() or not list(cache.glob("*.json"))


def test_a_spec_with_its_own_seed_shares_its_runs_across_seeds(tmp_path: Path) -> None:
    """The seed then picks only the malleable jobs: one rigid run for every seed, and
    one elastic run at fractions 0 and 1 (9 runs were made instead of 5)."""
    body = (
        "[sweep]\nworkloads = ['lublin:jobs=50,procs=32,seed=7']\n"
        "malleable_fractions = [0.0, 0.5]\nseeds = 3\n"
    )
    result = run_sweep(load_sweep(_config(tmp_path, body)), workers=1)
    assert result.ran == 5
