"""Hostile inputs to ``simulate`` and ``sweep`` (the review of docs/simulation.md's
"Limits on inputs"): each is one line naming the file or option, exit 2, no traceback,
nothing written."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from pathlib import Path

import pytest

from xce_resize_plugin.cli.main import main
from xce_resize_plugin.controllers import tomlfile
from xce_resize_plugin.simulation import sweep_cache, sweep_config

DATA = Path(__file__).resolve().parents[1] / "data"
KTH = DATA / "KTH-SP2-1996-2.1-cln-first200.swf.gz"


def _one_line(capsys: pytest.CaptureFixture[str], *says: str) -> str:
    captured = capsys.readouterr()
    err = captured.err
    assert captured.out == "" and err.count("\n") == 1, err
    assert "Traceback" not in err
    for s in says:
        assert s in err, err
    return err


def _sweep_file(tmp_path: Path, body: str = "") -> Path:
    path = tmp_path / "sweep.toml"
    path.write_text(f'[sweep]\nworkloads = ["{KTH}"]\nmalleable_fractions = [0.5]\n{body}')
    return path


@pytest.mark.parametrize("command", ["simulate", "sweep"])
def test_deeply_nested_toml_is_one_line_exit_2(
    tmp_path: Path, command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    deep = tmp_path / "deep.toml"
    table = "simulate" if command == "simulate" else "sweep"
    deep.write_text(f"[{table}]\nseed = " + "[" * 100_000 + "]" * 100_000 + "\n")
    if command == "simulate":
        assert main(["simulate", str(KTH), "--config", str(deep)]) == 2
    else:
        assert main(["sweep", str(deep), "--no-cache"]) == 2
    _one_line(capsys, f"{deep}: not valid TOML: nested too deeply")


@pytest.mark.parametrize("command", ["simulate", "sweep"])
def test_a_fifo_or_device_behind_a_toml_name_is_refused_without_waiting(
    tmp_path: Path, command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    fifo = tmp_path / "fifo.toml"
    os.mkfifo(fifo)  # no writer: an open that waits for one would hang the test
    zero = tmp_path / "zero.toml"
    zero.symlink_to("/dev/zero")
    for path, kind in ((fifo, "a FIFO"), (zero, "a device")):
        if command == "simulate":
            assert main(["simulate", str(KTH), "--config", str(path)]) == 2
        else:
            assert main(["sweep", str(path), "--no-cache"]) == 2
        _one_line(capsys, f"{path}: cannot read: {kind}, not a regular file")


def test_a_toml_file_above_the_limit_is_refused_before_parsing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tomlfile, "MAX_TOML_BYTES", 1000)
    big = _sweep_file(tmp_path, "#" + "x" * 1000 + "\n")
    assert main(["sweep", str(big), "--no-cache"]) == 2
    _one_line(capsys, f"{big}: cannot read: the file is larger than 1,000 bytes")
    config = tmp_path / "sim.toml"
    config.write_text("[simulate]\n#" + "x" * 1000 + "\n")
    assert main(["simulate", str(KTH), "--config", str(config)]) == 2
    _one_line(capsys, f"{config}: cannot read: the file is larger than 1,000 bytes")


# --- the sweep cache: a file that is not a run's result is made again --------------------

SMALL = "seeds = [0, 1]\n[simulate]\nlimit = 40\n"


def _cached(tmp_path: Path) -> tuple[Path, Path, list[Path], str]:
    """A sweep of one trace at 0.5 with two seeds, run once: its config, cache, the
    cache's files and the table it prints."""
    config, cache = _sweep_file(tmp_path, SMALL), tmp_path / "cache"
    args = ["sweep", str(config), "--cache", str(cache), "--workers", "1", "-q"]
    assert main(args) == 0
    return config, cache, sorted(cache.glob("*.json")), json.dumps(_table(config, cache))


def _table(config: Path, cache: Path) -> object:
    from xce_resize_plugin.simulation.sweep import CellCache, run_sweep
    from xce_resize_plugin.simulation.sweep_config import load_sweep
    from xce_resize_plugin.simulation.sweep_report import sweep_json

    return sweep_json(run_sweep(load_sweep(config), workers=1, cache=CellCache(cache)))


def _elastic(files: list[Path]) -> Path:
    """A cached elastic run (one with malleable jobs: its seed changes its numbers)."""
    return next(f for f in files if json.loads(f.read_text())["malleable_jobs"] > 0)


@pytest.mark.parametrize(
    "damage",
    [
        "nested",
        "utilization 1e308",
        "mean_wait Infinity",
        "mean_wait NaN",
        "makespan -1",
        "resizes 1e400",
        "grows huge",
        "problems",
        "warning of the other run",
        "too large",
    ],
)
def test_a_cache_file_that_is_no_run_result_is_made_again_and_replaced(
    tmp_path: Path,
    damage: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    config, cache, files, table = _cached(tmp_path)
    capsys.readouterr()  # the first sweep's table
    target = _elastic(files)
    good = target.read_text()
    doc = json.loads(good)
    run = doc["run"]
    if damage == "nested":
        target.write_text("[" * 100_000 + "]" * 100_000)
    elif damage == "too large":
        # Every run's file fits the limit; this one is padded beyond it (JSON takes
        # trailing blanks, so the content alone would be read).
        limit = max(f.stat().st_size for f in files)
        monkeypatch.setattr(sweep_cache, "MAX_ENTRY_BYTES", limit, raising=False)
        target.write_text(good + " " * limit)
    else:
        if damage == "problems":
            doc["problems"] = ["elastic: job 3 did 0.1 of its work (forged)"]
        elif damage == "warning of the other run":
            doc["warnings"] = [{"run": "rigid", "count": 1, "first": "forged"}]
        elif damage == "grows huge":
            run["grows"] = 10**30
        else:
            key, value = damage.split()
            run[key] = float(value)
        # json.dumps writes inf and nan as Infinity and NaN, which json.loads reads.
        target.write_text(json.dumps(doc))
    args = ["sweep", str(config), "--cache", str(cache), "--workers", "1", "--json", "-"]
    assert main(args) == 0
    out, err = capsys.readouterr()
    assert "Traceback" not in err and "check failed" not in err, err
    assert "1 runs made, 2 from the cache" in err, err
    assert json.dumps(json.loads(out)) == table
    assert target.read_text() == good  # the bad file replaced by the run's result


def test_a_fifo_in_the_cache_neither_blocks_nor_is_trusted(tmp_path: Path) -> None:
    config, cache, files, table = _cached(tmp_path)
    target = _elastic(files)
    good = target.read_text()
    target.unlink()
    os.mkfifo(target)  # no writer: a plain open would wait for one forever
    assert json.dumps(_table(config, cache)) == table
    assert target.is_file() and target.read_text() == good


def test_no_default_cache_under_a_home_that_does_not_exist(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "nonexistent"
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    config = _sweep_file(tmp_path, SMALL)
    assert main(["sweep", str(config), "--workers", "1"]) == 2
    _one_line(capsys, f"the home directory {home} does not exist", "--cache DIR or --no-cache")
    assert not home.exists()
    xdg = tmp_path / "xdg"
    monkeypatch.setenv("XDG_CACHE_HOME", str(xdg))  # the user's own choice: made
    out = str(tmp_path / "o.json")
    assert main(["sweep", str(config), "--workers", "1", "-q", "--json", out]) == 0
    assert len(list((xdg / "xce-resize" / "sweep").glob("*.json"))) == 3


# --- bounds on what is generated or planned -------------------------------------------


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("lublin:jobs=1000000000000,procs=8", "jobs must be at most 1,000,000"),
        ("lublin:jobs=10,procs=100000000000000000000", "procs must be at most 1,099,511,627,776"),
    ],
)
def test_a_synthetic_spec_beyond_the_bounds_is_refused_at_once(
    tmp_path: Path, spec: str, says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["simulate", "-q", "--synthetic", spec]) == 2
    _one_line(capsys, f"--synthetic {spec}: {says}")
    config = _sweep_file(tmp_path).read_text().replace(f'"{KTH}"', f'"{KTH}", "{spec}"')
    path = tmp_path / "s.toml"
    path.write_text(config)
    assert main(["sweep", str(path), "--no-cache"]) == 2
    _one_line(capsys, f"{path}: [sweep] workloads[1]: {spec}: {says}")


def test_a_grid_of_too_many_cells_is_refused_before_any_trace_is_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sweep_config, "MAX_CELLS", 1000)
    # The trace does not exist: the count is refused before workloads are looked at.
    body = '[sweep]\nworkloads = ["nowhere.swf", "lublin:jobs=10,procs=8"]\nseeds = 501\n'
    path = tmp_path / "g.toml"
    path.write_text(body + "malleable_fractions = [0.5]\n")
    assert main(["sweep", str(path), "--no-cache"]) == 2
    _one_line(capsys, f"{path}: [sweep] the grid has 1,002 cells", "more than 1,000")


def test_preparing_a_grid_is_reported_as_it_goes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from xce_resize_plugin.simulation import sweep as sweep_mod
    from xce_resize_plugin.simulation.sweep import CellCache, run_sweep
    from xce_resize_plugin.simulation.sweep_config import load_sweep

    monkeypatch.setattr(sweep_mod, "_PREPARE_STEP", 1)
    config = load_sweep(_sweep_file(tmp_path, "seeds = 3\n[simulate]\nlimit = 20\n"))
    calls: list[tuple[int, int]] = []
    started: list[int] = []
    run_sweep(
        config,
        workers=1,
        cache=CellCache(tmp_path / "cache"),
        on_prepare=lambda done, total: calls.append((done, total)) and None,
        on_start=lambda total, cached: started.append(len(calls)) and None,
    )
    # 3 cells (one rigid run shared, three elastic): each cell, then each run's lookup.
    assert calls == [(1, 9), (2, 9), (3, 9), (4, 7), (5, 7), (6, 7), (7, 7)]
    assert started == [7]  # the runs' bar starts after the preparation


def test_a_seed_of_twenty_digits_names_the_file_and_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _sweep_file(tmp_path, "seeds = [1, 99999999999999999999]\n")
    assert main(["sweep", str(path), "--no-cache"]) == 2
    _one_line(capsys, f"{path}: [sweep] seeds[1]: seed must have at most 19 digits")


def test_a_reconfiguration_cost_beyond_the_bound_is_refused_at_parse_time(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["simulate", "-q", "--sequential", str(KTH), "--speedup", "amdahl:0.05:cost=1e300"]
    assert main(args) == 2
    _one_line(capsys, "--speedup: reconfiguration cost must be at most 1e+06 s, not 1e+300")
    path = _sweep_file(tmp_path, '[simulate]\nspeedup = "linear:cost=2e6"\n')
    assert main(["sweep", str(path), "--no-cache"]) == 2
    _one_line(capsys, f"{path}: [simulate] speedup: reconfiguration cost must be at most 1e+06")


def test_a_malleable_fraction_of_minus_zero_is_shown_as_zero(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = ["simulate", "--sequential", "--limit", "20", str(KTH), "--malleable-fraction", "-0.0"]
    assert main(args) == 0
    err_out = "".join(capsys.readouterr())
    assert "(0% chosen" in err_out and "-0%" not in err_out, err_out


# --- --dask ADDRESS where no scheduler answers ----------------------------------------


class _Listener:
    """A local TCP server that accepts connections and never answers, or answers
    each with an HTTP error; closed by the test."""

    def __init__(self, reply: bytes) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.reply = reply
        self.conns: list[socket.socket] = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    @property
    def address(self) -> str:
        return f"tcp://127.0.0.1:{self.sock.getsockname()[1]}"

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:  # closed
                return
            self.conns.append(conn)
            if self.reply:
                conn.sendall(self.reply)

    def close(self) -> None:
        self.sock.close()
        for conn in self.conns:
            conn.close()
        self.thread.join(5)


@pytest.mark.parametrize("reply", [b"", b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n"])
def test_a_dask_address_where_no_scheduler_answers_fails_fast_in_one_line(
    tmp_path: Path,
    reply: bytes,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pytest.importorskip("distributed")
    from xce_resize_plugin.simulation import sweep as sweep_mod

    monkeypatch.setattr(sweep_mod, "DASK_PROBE_SECONDS", 1.0, raising=False)
    config = _sweep_file(tmp_path, "[simulate]\nlimit = 20\n")
    server = _Listener(reply)
    address = server.address
    try:
        began = time.monotonic()
        assert main(["sweep", str(config), "--no-cache", "-q", "--dask", address]) == 2
        assert time.monotonic() - began < 15
    finally:
        server.close()
    _one_line(capsys, f"--dask {address}: no Dask scheduler answer")
