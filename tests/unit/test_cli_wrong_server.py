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
    [
        (["hosts"], "required field missing @ $.hosts"),
        (["submit", "--", "sleep", "1"], "required field missing @ $.id"),
        (["jobs"], "required field missing @ $.jobs"),
        (["jobs", "101"], "required field missing @ $.id"),
        (["host", "close", "n1"], "required field missing @ $.host"),
        (["target", "101", "4"], "required field missing @ $.phase"),
        (["history", "101"], "required field missing @ $.segments"),
    ],
)
def test_an_answer_of_another_shape_is_one_line(
    other_service: str, argv: list[str], missing: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 255
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert f"{other_service}: the answer is not one an xce-resize controller gives" in err
    assert f"({missing}" in err and "is XCE_CONTROLLER_URL right?" in err


@pytest.mark.parametrize(
    ("body", "argv", "wrong"),
    [
        (b'{"jobs": [{"id": 7}]}', ["jobs"], "expected str, got int 7 @ $.jobs[0].id"),
        (b'[{"id": "7", "hosts": []}]', ["jobs"], "@ $.jobs[0].hosts"),
        (
            b'{"hosts": [{"name": "n1", "state": "ok", "slots": "4", "used": 0}]}',
            ["hosts"],
            "expected int, got str '4' @ $.hosts[0].slots",
        ),
        (
            b'{"segments": [{"start": 0, "end": true, "slots": 1}]}',
            ["history", "101"],
            "expected a number, got bool True @ $.segments[0].end",
        ),
        (b'"busy"', ["jobs", "101"], '(expected a JSON object, got a string "busy" @ $)'),
        (b"null", ["hosts"], "(expected a JSON object, got null @ $)"),
        (b"[1, 2]", ["history", "101"], "(expected a JSON object, got an array [1, 2] @ $)"),
    ],
)
def test_what_is_wrong_is_named_with_its_place(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    body: bytes,
    argv: list[str],
    wrong: str,
) -> None:
    with answering(body) as stub:
        monkeypatch.setenv("XCE_CONTROLLER_URL", stub.url)
        monkeypatch.setenv("XCE_TOKEN", "tok")
        assert main(argv) == 255
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and wrong in err, err


def test_a_bug_of_the_command_itself_is_not_blamed_on_the_server(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Only the shape of the answer is the server's: an error of the command's own code
    (here a KeyError while it writes a good answer) comes out as what it is."""
    from xce_resize_plugin.cli import hosts

    def broken(rows: object) -> str:
        raise KeyError("a bug of ours")

    monkeypatch.setattr(hosts, "render_hosts", broken)
    good = b'{"hosts": [{"name": "n1", "state": "ok", "slots": 4, "used": 0, "jobs": {}}]}'
    with answering(good) as stub:
        monkeypatch.setenv("XCE_CONTROLLER_URL", stub.url)
        monkeypatch.setenv("XCE_TOKEN", "tok")
        with pytest.raises(KeyError, match="a bug of ours"):
            main(["hosts"])
