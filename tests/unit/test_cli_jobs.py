"""`xce-resize jobs JOB`: the resize line says the phase, the pending grow (or the
autoresize demand) and the change in flight in words, from the REST status document;
`submit -ar` is autoresize and needs a range."""

from __future__ import annotations

import argparse
import io
from pathlib import Path

import pytest

from xce_resize_plugin.cli.answers import ResizeView, read
from xce_resize_plugin.cli.jobs import _auto, add_parsers, resize_summary, run
from xce_resize_plugin.core.converters import status_json
from xce_resize_plugin.core.models import ChangeKind, PendingGrow, Phase, Task
from xce_resize_plugin.core.status import ResizeStatus
from xce_resize_plugin.errors import UsageError

TASKS = (Task(0, "h1"), Task(1, "h1"))


def _view(status: ResizeStatus) -> ResizeView:
    """The status as the REST API answers it, as the command reads it."""
    return read(status_json(status), ResizeView)


def test_idle() -> None:
    status = ResizeStatus("7", Phase.IDLE, TASKS, 1, 8, 3)
    assert resize_summary(_view(status)) == "IDLE"


def test_pending_grow_range_and_exact() -> None:
    status = ResizeStatus("7", Phase.GROW_PENDING, TASKS, 1, 8, 3, PendingGrow(1, 4, None, 0.0))
    assert resize_summary(_view(status)) == "GROW_PENDING; pending grow of 1 to 4 task(s)"
    status = ResizeStatus("7", Phase.GROW_PENDING, TASKS, 1, 8, 3, PendingGrow(2, 2, None, 0.0))
    assert resize_summary(_view(status)) == "GROW_PENDING; pending grow of 2 task(s)"


def test_change_in_flight_names_its_tasks() -> None:
    status = ResizeStatus(
        "7",
        Phase.SHRINK_STOPPING,
        TASKS,
        1,
        8,
        3,
        None,
        ChangeKind.SHRINK,
        (Task(1, "h1"),),
    )
    assert resize_summary(_view(status)) == "SHRINK_STOPPING; shrink in flight (tasks 1)"


def test_autoresize_demand_and_flag() -> None:
    demand = PendingGrow(1, 3, None, 0.0, auto=True)
    status = ResizeStatus("7", Phase.GROW_PENDING, TASKS, 1, 5, 3, demand, autoresize=True)
    assert resize_summary(_view(status)) == (
        "GROW_PENDING; autoresize demand of 1 to 3 task(s); autoresize on"
    )
    assert _auto(_view(status)) == "+1-3"
    at_max = ResizeStatus("7", Phase.IDLE, TASKS, 1, 2, 3, autoresize=True)
    assert resize_summary(_view(at_max)) == "IDLE; autoresize on"
    assert _auto(_view(at_max)) == "on"
    assert _auto(_view(ResizeStatus("7", Phase.IDLE, TASKS, 1, 8, 3))) == "-"


def test_autoresize_needs_a_task_range_before_any_request() -> None:
    class NoCalls:
        def call(self, *args: object, **kw: object) -> None:
            raise AssertionError("nothing may be sent")

    for tasks in ("4", "3,3"):
        args = argparse.Namespace(
            command="submit", tasks=tasks, autoresize=True, argv=["--", "true"]
        )
        with pytest.raises(UsageError, match="--autoresize needs a task range -n MIN,MAX"):
            run(args, io.StringIO(), NoCalls())  # type: ignore[arg-type]


def test_release_exited_is_sent_only_when_asked() -> None:
    class Recorder:
        def __init__(self) -> None:
            self.bodies: list[object] = []

        def call(self, method: str, path: str, body: object = None) -> dict[str, str]:
            self.bodies.append(body)
            return {"id": "101"}

    parser = argparse.ArgumentParser()
    add_parsers(parser.add_subparsers(dest="command"))
    sent = Recorder()
    for extra in (["--release-exited"], []):
        args = parser.parse_args(["submit", "-n", "2,4", "--resizable", *extra, "--", "true"])
        run(args, io.StringIO(), sent)  # type: ignore[arg-type]
    with_option, without = sent.bodies
    assert isinstance(with_option, dict) and with_option["release_exited"] is True
    assert isinstance(without, dict) and "release_exited" not in without


def test_ar_is_autoresize_not_resizable() -> None:
    parser = argparse.ArgumentParser()
    add_parsers(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["submit", "-n", "1,4", "-ar", "--", "true"])
    assert args.autoresize is True and args.resizable is False
    args = parser.parse_args(["modify", "101", "-arn"])
    assert args.autoresize is False
    with pytest.raises(SystemExit):
        parser.parse_args(["modify", "101"])  # on or off must be said


def test_what_a_job_wrote_reaches_the_terminal_escaped() -> None:
    """A job's command (and anything else of the job's shown) is its owner's to write:
    escape sequences (here one that sets the clipboard), a carriage return, a newline
    that forges a line, a bidirectional override reach the administrator's terminal as
    escapes, and ordinary text, accents and all, as it is."""
    hostile = ["sh", "-c", "x\x1b]52;c;aGk=\x07\r\nJob <1> is submitted.\u202e", "été"]

    class Server:
        def call(self, method: str, path: str, body: object = None) -> object:
            job = {"id": "101", "user": "bob\x1b[8m", "state": "RUN", "command": hostile}
            return job if path.endswith("/101") else {"jobs": [job]}

    parser = argparse.ArgumentParser()
    add_parsers(parser.add_subparsers(dest="command"))
    shown: dict[str, list[str]] = {}
    for argv in (["jobs", "101"], ["jobs"]):
        out = io.StringIO()
        assert run(parser.parse_args(argv), out, Server()) == 0  # type: ignore[arg-type]
        shown[argv[-1]] = out.getvalue().split("\n")[:-1]
        assert all(line.isprintable() for line in shown[argv[-1]]), shown
    assert (
        "   command: sh -c x\\x1b]52;c;aGk=\\x07\\r\\nJob <1> is submitted.\\u202e été"
        in (shown["101"])
    )
    assert "      user: bob\\x1b[8m" in shown["101"]
    assert shown["jobs"][1].startswith("101      bob\\x1b[8m RUN")


def test_a_requeued_job_says_how_often() -> None:
    class Server:
        def __init__(self, requeues: int | None) -> None:
            self.job: dict[str, object] = {"id": "101", "state": "RUN"}
            if requeues is not None:
                self.job["requeues"] = requeues

        def call(self, method: str, path: str, body: object = None) -> object:
            return self.job

    parser = argparse.ArgumentParser()
    add_parsers(parser.add_subparsers(dest="command"))
    lines = {}
    for requeues in (2, 0, None):
        out = io.StringIO()
        assert run(parser.parse_args(["jobs", "101"]), out, Server(requeues)) == 0  # type: ignore[arg-type]
        lines[requeues] = [line for line in out.getvalue().splitlines() if "requeues" in line]
    assert lines == {2: ["  requeues: 2"], 0: [], None: []}


def test_a_job_runs_where_it_is_submitted_from_unless_told(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As ``bsub``: the tasks' working directory is the submission directory by
    default; ``--cwd`` names another."""

    class Recorder:
        def __init__(self) -> None:
            self.bodies: list[dict[str, object]] = []

        def call(self, method: str, path: str, body: dict[str, object]) -> dict[str, str]:
            self.bodies.append(body)
            return {"id": "101"}

    monkeypatch.chdir(tmp_path)
    parser = argparse.ArgumentParser()
    add_parsers(parser.add_subparsers(dest="command"))
    sent = Recorder()
    for extra in ([], ["--cwd", "/srv/run"]):
        args = parser.parse_args(["submit", "-n", "2", *extra, "--", "./solver"])
        run(args, io.StringIO(), sent)  # type: ignore[arg-type]
    assert [b["cwd"] for b in sent.bodies] == [str(tmp_path), "/srv/run"]


def test_why_a_job_ended_is_shown() -> None:
    class Server:
        def call(self, method: str, path: str, body: object = None) -> object:
            return {"id": "101", "state": "EXIT", "exit_reason": "killed by alice"}

    parser = argparse.ArgumentParser()
    add_parsers(parser.add_subparsers(dest="command"))
    out = io.StringIO()
    assert run(parser.parse_args(["jobs", "101"]), out, Server()) == 0  # type: ignore[arg-type]
    assert out.getvalue().splitlines() == [
        "        id: 101",
        "     state: EXIT",
        "    reason: killed by alice",
    ]
