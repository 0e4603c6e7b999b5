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
