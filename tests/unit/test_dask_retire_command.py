"""``xce-dask-retire`` takes no arguments: ``--help`` answers and anything else is
refused, both before it reads the environment or reaches a controller."""

from __future__ import annotations

import pytest

pytest.importorskip("distributed", reason="the dask extra is not installed")

from xce_resize_plugin.integrations.dask import retire


def _must_not_act(environ: object) -> None:
    raise AssertionError("retired workers on a command line it should have refused")


def test_help_answers_and_does_not_act(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(retire, "retire", _must_not_act)
    with pytest.raises(SystemExit) as done:
        retire.main(["--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: xce-dask-retire") and "XCE_RESIZE_TASK_IDS" in out


@pytest.mark.parametrize("argv", [["--bogus"], ["12"]])
def test_arguments_are_refused(
    argv: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(retire, "retire", _must_not_act)
    with pytest.raises(SystemExit) as done:
        retire.main(argv)
    assert done.value.code == 2
    assert "unrecognized arguments" in capsys.readouterr().err


def test_an_emptied_scheduler_address_retires_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """After the cluster's close the key holds "": nothing to reach, nothing retired."""
    import asyncio

    class _Client:
        async def __aenter__(self) -> _Client:
            return self

        async def __aexit__(self, *exc: object) -> None:
            return None

        async def get(self, key: str) -> str:
            return ""

    monkeypatch.setattr(retire.AsyncResizeClient, "from_env", lambda environ: _Client())
    monkeypatch.setattr(retire, "rpc", _must_not_act)
    environ = {"LSB_RESIZE_EVENT": "shrink", "XCE_RESIZE_TASK_IDS": "2,3"}
    assert asyncio.run(retire.retire(environ)) == {}
