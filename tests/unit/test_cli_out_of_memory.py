"""A command that runs out of memory (a workload, a grid or an input larger than the
machine, or than ``ulimit -v``) says so in one line, exit 1, instead of a traceback."""

from __future__ import annotations

from typing import Any

import pytest

from xce_resize_plugin.cli import main as cli


def test_out_of_memory_is_one_line_and_status_1(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def dispatch(args: Any, out: Any) -> int:
        raise MemoryError

    monkeypatch.setattr(cli, "_dispatch", dispatch)
    assert cli.main(["demo"]) == cli.EXIT_PROBLEMS
    err = capsys.readouterr().err
    assert err == "xce-resize: out of memory (the input or the run is too large for this machine)\n"
