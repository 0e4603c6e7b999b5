"""The SWF reader's bounds on what it reads (docs/simulation.md, "Limits on inputs"):
header lines, line length, lines without a job, files that are not regular files.
The limits are lowered here, so that each case is a few KB."""

from __future__ import annotations

import gzip
import os
from pathlib import Path

import pytest

from xce_resize_plugin.cli.main import main
from xce_resize_plugin.simulation import swf
from xce_resize_plugin.simulation.swf import read_swf
from xce_resize_plugin.simulation.trace_types import TraceError


def _job(i: int, submit: str = "0") -> str:
    return f"{i} {submit} -1 100 4 -1 -1 4 600 -1 1 1 1 -1 -1 -1 -1 -1\n"


def _gz(path: Path, text: str) -> Path:
    path.write_bytes(gzip.compress(text.encode()))
    return path


def test_a_header_of_too_many_lines_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(swf, "MAX_HEADER_LINES", 100)
    ok = _gz(tmp_path / "ok.swf.gz", ";\n" * 100 + _job(1))
    assert len(read_swf(ok).jobs) == 1
    bomb = _gz(tmp_path / "hb.swf.gz", ";\n" * 5000 + _job(1))
    with pytest.raises(TraceError, match=r"hb\.swf\.gz:101: the header .* longer than 100 lines"):
        read_swf(bomb)


def test_a_header_of_too_many_characters_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(swf, "MAX_HEADER_CHARS", 1000)
    bomb = _gz(tmp_path / "hb.swf.gz", ("; Note: " + "x" * 90 + "\n") * 20 + _job(1))
    with pytest.raises(TraceError, match=r":11: the header .* or 1,000 characters"):
        read_swf(bomb)


@pytest.mark.parametrize("where", ["header", "data"])
def test_a_line_longer_than_the_limit_is_refused_once_that_much_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    monkeypatch.setattr(swf, "MAX_LINE_CHARS", 1000)
    start = "; MaxProcs: 8\n" if where == "header" else "; MaxProcs: 8\n" + _job(1)
    exact = _gz(tmp_path / "exact.swf.gz", start + "; " + "x" * 998 + "\n" + _job(2))
    assert len(read_swf(exact).jobs) == 2 - (where == "header")
    # No line end at all: the reader must stop at the limit, not read the whole line.
    endless = _gz(tmp_path / "line.swf.gz", start + "a" * 100_000)
    line = 2 if where == "header" else 3
    with pytest.raises(TraceError, match=rf"line\.swf\.gz:{line}: a line longer than 1,000"):
        read_swf(endless)


@pytest.mark.parametrize("kind", ["\n", ";\n", "; comment\n"])
def test_too_many_lines_without_a_job_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    monkeypatch.setattr(swf, "MAX_EMPTY_LINES", 100)
    ok = _gz(tmp_path / "ok.swf.gz", "; MaxProcs: 8\n" + _job(1) + kind * 100 + _job(2))
    assert len(read_swf(ok).jobs) == 2
    after = _gz(tmp_path / "after.swf.gz", "; MaxProcs: 8\n" + _job(1) + kind * 101 + _job(2))
    with pytest.raises(TraceError, match=r"more than 100 blank or comment lines"):
        read_swf(after)
    if kind == "\n":  # blank lines before the first job, too
        before = _gz(tmp_path / "before.swf.gz", "; MaxProcs: 8\n" + kind * 101 + _job(1))
        with pytest.raises(TraceError, match=r"before\.swf\.gz:102: more than 100 blank"):
            read_swf(before)


def test_a_submit_time_of_thousands_of_digits_is_beyond_the_clock(tmp_path: Path) -> None:
    path = tmp_path / "digits.swf"
    path.write_text("; MaxProcs: 8\n" + _job(1, "1" * 5000))
    with pytest.raises(TraceError, match=r"submit time of 5,000 digits is beyond 1e\+10 s"):
        read_swf(path)


def test_trailing_data_after_the_gzip_stream_is_said_so(tmp_path: Path) -> None:
    path = tmp_path / "tail.swf.gz"
    path.write_bytes(gzip.compress(("; MaxProcs: 8\n" + _job(1)).encode()) + b"garbage\n")
    with pytest.raises(TraceError, match="trailing data after the gzip stream is not gzip"):
        read_swf(path)
    plain = tmp_path / "plain.swf.gz"
    plain.write_text("; MaxProcs: 8\n" + _job(1))
    with pytest.raises(TraceError, match=r"not gzip data, though the name ends in \.gz"):
        read_swf(plain)


def test_a_fifo_or_device_named_as_a_trace_is_one_line_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fifo = tmp_path / "fifo.swf"
    os.mkfifo(fifo)  # no writer: an open that waits for one would hang here
    zero = tmp_path / "zero.swf.gz"
    zero.symlink_to("/dev/zero")
    for path, kind in ((fifo, "a FIFO"), (zero, "a device")):
        assert main(["simulate", "-q", str(path)]) == 2
        captured = capsys.readouterr()
        assert captured.out == "" and captured.err.count("\n") == 1, captured.err
        assert f"{path}: cannot read: {kind}, not a regular file" in captured.err
