"""``xce-resize grow`` and ``release`` read their counts and task ids as ``bresize``
does: ASCII digits, LSF's messages, exit 2 before anything is sent (docs/user-guide.md:
``xce-resize grow`` is ``bresize request`` with one option more)."""

from __future__ import annotations

import pytest

from xce_resize_plugin.cli.main import main
from xce_resize_plugin.cli.target import _ids, _range


@pytest.fixture(autouse=True)
def _nowhere(monkeypatch: pytest.MonkeyPatch) -> None:
    # Port 9 (discard): nothing listens. A test that reached the network would fail.
    monkeypatch.setenv("XCE_CONTROLLER_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("XCE_TOKEN", "tok")


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        # A superscript two is a digit to str.isdigit() and not to int(): a traceback.
        (["grow", "101", "\u00b2"], "request takes [min_task,]tasks: got '\u00b2'"),
        # A full-width 3 was sent as 3.
        (["grow", "101", "\uff13"], "request takes [min_task,]tasks"),
        # 5,000 digits: int() refuses them (a traceback); bresize's bound says so.
        (["grow", "101", "9" * 5000], "tasks must be at most 2147483647"),
        # Sent to the controller and refused as 667 (exit 255) before.
        (["grow", "101", "4,2"], "min_task 4 is greater than tasks 2"),
        (["grow", "101", "0"], "tasks must be a positive integer"),
        (["release", "101", "--task-ids", "1_0"], "--task-ids takes comma-separated task ids"),
        (["release", "101", "--task-ids", " 7"], "--task-ids takes comma-separated task ids"),
        (["release", "101", "--task-ids", "1,,2"], "--task-ids takes comma-separated task ids"),
        (["target", "101", "3", "--prefer", "-1"], "--prefer takes comma-separated task ids"),
    ],
)
def test_a_bad_count_or_task_id_is_one_line_exit_2(
    argv: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and says in err and "Traceback" not in err, err


def test_good_counts_and_ids_are_read() -> None:
    assert _range("3") == {"min_tasks": 3, "tasks": 3}
    assert _range("2,5") == {"min_tasks": 2, "tasks": 5}
    assert _range("2147483647") == {"min_tasks": 2147483647, "tasks": 2147483647}
    assert _ids("--task-ids", "0,7,12") == [0, 7, 12]


class _Recorder:
    """A controller that answers every change with an idle status and keeps the bodies."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, object]] = []

    def call(self, method: str, path: str, body: object = None) -> dict[str, object]:
        self.sent.append((path, body))
        return {"phase": "IDLE", "tasks": [{"id": 0, "host": "h1"}]}


@pytest.mark.parametrize(
    ("argv", "extra"),
    [
        (["grow", "101", "2"], {}),
        (["grow", "101", "2", "-rnc", "/bin/true"], {"notify_cmd": "/bin/true"}),
        (["grow", "101", "2", "-rncn"], {"no_notify": True}),
        (["release", "101", "--count", "1", "--grace", "5"], {"grace": 5.0}),
        (["release", "101", "--count", "1", "-rncn", "-c"], {"no_notify": True}),
    ],
)
def test_bresizes_notification_options_and_a_drain_time_are_sent(
    argv: list[str], extra: dict[str, object]
) -> None:
    """``xce-resize grow`` and ``release`` take ``bresize``'s ``-rnc``/``-rncn`` (and
    ``release`` its ``--grace``), so that they are ``bresize`` plus ``--if-version``."""
    import argparse
    import io

    from xce_resize_plugin.cli.target import add_parsers, run

    parser = argparse.ArgumentParser()
    add_parsers(parser.add_subparsers(dest="command"))
    server = _Recorder()
    out = io.StringIO()
    assert run(parser.parse_args(argv), out, server) == 0  # type: ignore[arg-type]
    [(path, body)] = server.sent
    assert path.endswith("/resize/" + argv[0])
    assert isinstance(body, dict)
    options = {k: v for k, v in body.items() if k in ("notify_cmd", "no_notify", "grace")}
    assert options == extra
    assert body["cancel_pending"] is ("-c" in argv)
    assert out.getvalue() == "Job <101>: 1 task(s), no target; IDLE\n"


def test_rnc_and_rncn_together_are_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["grow", "101", "2", "-rnc", "x", "-rncn"])
    assert info.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err
