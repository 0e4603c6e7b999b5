"""Hostile inputs to ``simulate`` and ``sweep`` (the review of docs/simulation.md's
"Limits on inputs"): each is one line naming the file or option, exit 2, no traceback,
nothing written."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from xce_resize_plugin.cli.main import main
from xce_resize_plugin.controllers import tomlfile

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
