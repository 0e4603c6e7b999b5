"""A client command pointed at another service (``XCE_CONTROLLER_URL`` wrong) that
answers JSON of another shape says so in one line, exit 255 as for no answer, instead
of a traceback (a ``KeyError`` from ``hosts`` and ``submit``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.http_stub import answering
from xce_resize_plugin.cli.main import main


@pytest.fixture
def other_service(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    with answering(b'{"status": "ok"}') as stub:
        monkeypatch.setenv("XCE_CONTROLLER_URL", stub.url)
        monkeypatch.setenv("XCE_TOKEN", "tok")
        yield stub.url


@pytest.mark.parametrize(
    ("argv", "missing"),
    [(["hosts"], "'hosts'"), (["submit", "--", "sleep", "1"], "'id'")],
)
def test_an_answer_of_another_shape_is_one_line(
    other_service: str, argv: list[str], missing: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 255
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert f"{other_service}: the answer is not one an xce-resize controller gives" in err
    assert f"KeyError: {missing}" in err and "is XCE_CONTROLLER_URL right?" in err
