"""Notification commands run for real with /bin/sh and report through xce_notify_done."""

from __future__ import annotations

import time

import pytest

from tests.conftest import CtlFactory, Recorder
from xce_resize_plugin import hookimpl
from xce_resize_plugin.controllers.sim import (
    NotificationResult,
    ScriptedNotificationRunner,
)
from xce_resize_plugin.host import Controller


class Notifier:
    """Runs the queued commands in the next dispatch cycle."""

    def __init__(self) -> None:
        self.todo: list[tuple[str, int, str, dict[str, str], float]] = []
        self.done: list[tuple[str, int, int | None, str, float]] = []
        self.in_dispatch = False
        self.reentered = False

    @hookimpl
    def xce_dispatch_cycle(self, controller: Controller) -> None:
        self.in_dispatch = True
        while self.todo:
            job_id, attempt, cmd, env, timeout = self.todo.pop(0)
            controller.run_notification(job_id, attempt, "h1", cmd, env, timeout)
        self.in_dispatch = False

    @hookimpl
    def xce_notify_done(
        self, controller: Controller, job_id: str, attempt: int, status: int | None, reason: str
    ) -> None:
        self.reentered |= self.in_dispatch
        self.done.append((job_id, attempt, status, reason, controller.now()))


def test_real_commands_exit_status_timeout_and_env(make_ctl: CtlFactory) -> None:
    notifier = Notifier()
    ctl = make_ctl(notifier)
    job_id = ctl.submit("u", 1, runtime=100)
    ctl.advance(7)
    notifier.todo = [
        (job_id, 1, "exit 0", {}, 5.0),
        (
            job_id,
            2,
            'echo "$LSB_RESIZE_EVENT:$PWD" ; echo oops >&2; exit 3',
            {"LSB_RESIZE_EVENT": "grow"},
            5.0,
        ),
        (job_id, 3, "sleep 5; echo never", {}, 0.2),
        (job_id, 4, 'test -n "$PATH" && kill -TERM $$', {}, 5.0),
    ]
    began = time.monotonic()
    ctl.settle()
    assert time.monotonic() - began < 3.0  # the timeout killed the sleep
    assert not notifier.reentered
    assert notifier.done == [
        (job_id, 1, 0, "exit 0", 7.0),
        (job_id, 2, 3, "exit 3", 7.0),
        (job_id, 3, None, "timeout", 7.0),
        (job_id, 4, 143, "signal 15", 7.0),
    ]
    logs = ctl.notifications(job_id)
    assert [(n.attempt, n.status) for n in logs] == [(1, 0), (2, 3), (3, None), (4, 143)]
    assert logs[1].stdout.startswith("grow:") and logs[1].stdout.strip().endswith(job_id)
    assert logs[1].stderr == "oops\n"
    assert logs[2].stdout == ""
    assert logs[1].host == "h1" and logs[1].time == 7.0
    assert ctl.notifications() == logs


def test_notification_env_is_not_the_controllers(
    make_ctl: CtlFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XCE_SECRET_FOR_TEST", "leak")
    notifier = Notifier()
    ctl = make_ctl(notifier)
    job_id = ctl.submit("u", 1, runtime=100)
    ctl.settle()
    notifier.todo = [(job_id, 1, 'echo "[$XCE_SECRET_FOR_TEST][$MINE]"', {"MINE": "x"}, 5.0)]
    ctl.settle()
    assert ctl.notifications(job_id)[0].stdout == "[][x]\n"


def test_unrunnable_shell_reports_none(make_ctl: CtlFactory) -> None:
    from xce_resize_plugin.controllers.sim import SubprocessNotificationRunner

    notifier = Notifier()
    ctl = make_ctl(notifier, notification_runner=SubprocessNotificationRunner(shell="/nonexistent"))
    job_id = ctl.submit("u", 1, runtime=100)
    ctl.settle()
    notifier.todo = [(job_id, 1, "exit 0", {}, 5.0)]
    ctl.settle()
    (done,) = notifier.done
    assert done[2] is None and done[3].startswith("cannot run")


@pytest.mark.parametrize(
    ("command", "env"), [("echo a\0b", {}), ("exit 0", {"BAD": "a\0b"}), ("exit 0", {"B\0AD": "a"})]
)
def test_a_command_no_process_can_take_is_a_failed_notification(
    make_ctl: CtlFactory, command: str, env: dict[str, str]
) -> None:
    """A NUL byte in the command or its environment fails the notification, reported
    like any other failure: a runner that raised instead left the change waiting."""
    from xce_resize_plugin.controllers.sim import SubprocessNotificationRunner

    notifier = Notifier()
    ctl = make_ctl(notifier, notification_runner=SubprocessNotificationRunner())
    job_id = ctl.submit("u", 1, runtime=100)
    ctl.settle()
    notifier.todo = [(job_id, 1, command, env, 5.0)]
    ctl.settle()
    (done,) = notifier.done
    assert done[2] is None and "null byte" in done[3] and done[3].startswith("cannot run")


def test_scripted_runner_and_changes_counted(make_ctl: CtlFactory, recorder: Recorder) -> None:
    notifier = Notifier()
    runner = ScriptedNotificationRunner(
        lambda req: NotificationResult(1 if "fail" in req.command else 0, "scripted")
    )
    ctl = make_ctl(notifier, recorder, notification_runner=runner)
    job_id = ctl.submit("u", 1, runtime=100)
    ctl.settle()
    notifier.todo = [(job_id, 1, "ok", {}, 1.0), (job_id, 2, "fail", {}, 1.0)]
    before = ctl.changes
    ctl.settle()
    # started + finished + delivered, per notification
    assert ctl.changes - before == 6
    assert [d[2] for d in notifier.done] == [0, 1]
    assert [r.command for r in runner.requests] == ["ok", "fail"]
    # delivered after the dispatch hook that ran them returned
    names = recorder.names("validate", "start")
    assert names[-4:] == ["notify", "notify", "sched", "dispatch"]
