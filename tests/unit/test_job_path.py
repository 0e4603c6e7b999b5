"""The ``PATH`` of a job's tasks and notification commands (docs/live-controller.md,
"Jobs and tasks"): the controller's own only for a job of its own user, a fixed default
for another user's, never an empty or relative entry (each is looked up from the
command's working directory); a ``PATH`` the job sets is the job's, as it gave it. And
the rest of a notification command's environment: another user's gets nothing of its
agent's own (root's ``TMPDIR``, ``LANG``, ``LC_*``, ``TZ``), and its job's scratch as
``TMPDIR``.

The environment builders are those of a live controller that is constructed, not
opened: nothing starts, and the accounts need not exist."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from xce_resize_plugin.controllers.jobs import JobRecord
from xce_resize_plugin.controllers.live import settings as live_config
from xce_resize_plugin.controllers.live.live_controller import LiveController
from xce_resize_plugin.controllers.live.proc import Account
from xce_resize_plugin.controllers.live.task_env import SCRATCH, make_scratch
from xce_resize_plugin.controllers.runners import (
    WHOLE_ENV,
    NotificationRequest,
    SubprocessNotificationRunner,
)
from xce_resize_plugin.core.models import Task
from xce_resize_plugin.manager import get_plugin_manager

#: The controller's own PATH, as root's often is: its home's tool directories, and an
#: empty and two relative entries (the task's working directory, whoever owns it).
CONTROLLER_PATH = "/root/.cargo/bin::bin:/usr/local/sbin:.:/usr/bin:"
#: The default the documentation names for another user's job.
DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"
CONFIG = """
[controller]
listen = "127.0.0.1:7001"
state_dir = "state"
single_user = {single}

[cluster]
hosts = {{ h1 = 2 }}

[users]
tokens = {{ alice = "alice-secret-1" }}
"""


def _other() -> Account:
    """An account that is not the test's (the controller's) user."""
    uid = 65534 if os.geteuid() != 65534 else 65533
    return Account("other", uid, uid, (uid,), "/home/other")


def _entries(path: str) -> list[str]:
    return path.split(os.pathsep)


@pytest.fixture
def controller(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[LiveController]:
    """A live controller, constructed only, whose own environment has CONTROLLER_PATH."""
    monkeypatch.setenv("PATH", CONTROLLER_PATH)
    config = tmp_path / "c.toml"
    # A personal controller: its state directory may be private (pytest's is); who a job
    # runs as is given to the builders below.
    config.write_text(CONFIG.format(single="true"))
    cfg = live_config.load(config)
    ctl = LiveController(get_plugin_manager(cfg.resize), cfg)
    try:
        yield ctl
    finally:
        ctl.shutdown()


def _task_env(ctl: LiveController, account: Account, env: dict[str, str]) -> dict[str, str]:
    job = JobRecord("101", account.name, 1, 1, 0.0, env=env)
    ctl._make_job_dir(job.id, account)
    return ctl._task_env(job, {}, Task(0, "h1"), {"LSB_HOSTS": "h1"}, account)


def test_a_task_of_another_user_gets_the_default_path(controller: LiveController) -> None:
    path = _task_env(controller, _other(), {})["PATH"]
    assert path == DEFAULT_PATH
    assert all(p.startswith("/") and not p.startswith("/root") for p in _entries(path))


def test_a_task_of_the_controllers_user_gets_its_path_without_relative_entries(
    controller: LiveController,
) -> None:
    """A personal controller's jobs are its user's: they keep its PATH, less the
    entries that name no directory of their own."""
    me = Account.of_uid(os.geteuid())
    path = _task_env(controller, me, {})["PATH"]
    assert _entries(path) == ["/root/.cargo/bin", "/usr/local/sbin", "/usr/bin"]


def test_a_path_the_job_sets_is_kept_as_given(controller: LiveController) -> None:
    for account in (_other(), Account.of_uid(os.geteuid())):
        assert _task_env(controller, account, {"PATH": "bin::/opt/x"})["PATH"] == "bin::/opt/x"


def _notify_env(ctl: LiveController, account: Account, env: dict[str, str]) -> dict[str, Any]:
    """The environment of the notification command the controller sends the agent."""
    job = JobRecord("101", account.name, 1, 2, 0.0, env=env)
    ctl._make_job_dir(job.id, account)
    sent: list[dict[str, Any]] = []
    ctl._job = lambda job_id: job  # type: ignore[method-assign]
    ctl._account = lambda job, spec: account  # type: ignore[method-assign]
    ctl.fleet.send = lambda host, command: sent.append(command)  # type: ignore[method-assign]
    request = NotificationRequest("101", 1, "h1", "true", {**env, "LSB_HOSTS": "h1"}, 5, Path())
    ctl._runner_notify(request, lambda result: None)
    assert len(sent) == 1
    return dict(sent[0]["env"])


def test_a_notification_of_another_user_gets_the_default_path(
    controller: LiveController,
) -> None:
    """The agent runs it with its own (root's) PATH under what the controller sends:
    the controller sends the default for another user's command."""
    env = _notify_env(controller, _other(), {})
    assert env["PATH"] == DEFAULT_PATH
    runner = SubprocessNotificationRunner()
    request = NotificationRequest("101", 1, "h1", "true", env, 5, Path())
    assert runner.environment(request)["PATH"] == DEFAULT_PATH
    assert _notify_env(controller, _other(), {"PATH": "bin:/opt/x"})["PATH"] == "bin:/opt/x"


def test_a_notification_runner_drops_relative_path_entries(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A command of the runner's own user gets its PATH, less the empty and relative
    entries; one the request sets stays as given."""
    monkeypatch.setenv("PATH", CONTROLLER_PATH)
    runner = SubprocessNotificationRunner()
    request = NotificationRequest("101", 1, "h1", "true", {}, 5, Path())
    assert _entries(runner.environment(request)["PATH"]) == [
        "/root/.cargo/bin",
        "/usr/local/sbin",
        "/usr/bin",
    ]
    request = NotificationRequest("101", 1, "h1", "true", {"PATH": ":bin"}, 5, Path())
    assert runner.environment(request)["PATH"] == ":bin"
    monkeypatch.setenv("PATH", ".:")
    request = NotificationRequest("101", 1, "h1", "true", {}, 5, Path())
    assert runner.environment(request)["PATH"] == DEFAULT_PATH


#: The agent's own environment (root's, in a real install), as the review found it.
AGENTS = {
    "TMPDIR": "/root/agent-private-tmp",
    "LANG": "de_DE.UTF-8",
    "LC_ALL": "de_DE.UTF-8",
    "LC_CTYPE": "de_DE.UTF-8",
    "TZ": "Europe/Berlin",
}


def _notification_run_env(
    ctl: LiveController, account: Account, env: dict[str, str], scratch: bool
) -> dict[str, str]:
    """What the agent runs the notification command with: the controller's command,
    through the agent's runner, in an agent whose own environment has AGENTS."""
    if scratch:
        ctl._make_job_dir("101", account)
        make_scratch(ctl.job_dir("101"), account, os.geteuid() == 0)
    sent = _notify_env(ctl, account, env)
    request = NotificationRequest("101", 1, "h1", "true", sent, 5, Path())
    return SubprocessNotificationRunner().environment(request)


def test_another_users_notification_gets_nothing_of_the_agents_own(
    controller: LiveController, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review 29b, finding 5: another user's notification command got the agent's
    (root's) TMPDIR, LANG, LC_* and TZ. It gets its job's scratch as TMPDIR, as its
    tasks do, and none of the others unless its job sets them."""
    for key, value in AGENTS.items():
        monkeypatch.setenv(key, value)
    scratch = controller.job_dir("101") / SCRATCH
    env = _notification_run_env(controller, _other(), {}, scratch=True)
    assert env["TMPDIR"] == str(scratch / "tmp")
    assert not {"LANG", "LC_ALL", "LC_CTYPE", "TZ", WHOLE_ENV} & env.keys()
    assert env["PATH"] == DEFAULT_PATH and env["HOME"] == "/home/other"
    assert env["USER"] == env["LOGNAME"] == "other"
    mine = {"LANG": "C.UTF-8", "TZ": "UTC", "TMPDIR": "/var/tmp/mine"}
    assert _notification_run_env(controller, _other(), mine, scratch=True).items() >= mine.items()


def test_another_users_notification_without_a_scratch_gets_no_tmpdir(
    controller: LiveController, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key, value in AGENTS.items():
        monkeypatch.setenv(key, value)
    env = _notification_run_env(controller, _other(), {}, scratch=False)
    assert not {"TMPDIR", "LANG", "LC_ALL", "LC_CTYPE", "TZ"} & env.keys()


def test_a_notification_of_the_controllers_own_user_keeps_the_agents_environment(
    controller: LiveController, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A personal controller's job is its user's: its notification command gets the
    agent's TMPDIR, LANG, LC_* and TZ, as before."""
    for key, value in AGENTS.items():
        monkeypatch.setenv(key, value)
    me = Account.of_uid(os.geteuid())
    env = _notification_run_env(controller, me, {}, scratch=True)
    assert env.items() >= AGENTS.items() and WHOLE_ENV not in env


def test_another_users_task_gets_nothing_of_the_controllers_own(
    controller: LiveController, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review 29b, left open then: another user's tasks got the controller's (root's)
    LANG, LC_* and TZ, which its notification commands no longer got. Now neither
    does; what the job's env sets is kept, and its scratch is its TMPDIR."""
    for key, value in AGENTS.items():
        monkeypatch.setenv(key, value)
    env = _task_env(controller, _other(), {})
    assert not {"LANG", "LC_ALL", "LC_CTYPE", "TZ"} & env.keys()
    assert env["TMPDIR"] != AGENTS["TMPDIR"]
    assert env["TMPDIR"] == str(controller.job_dir("101") / SCRATCH / "tmp")
    assert env["HOME"] == "/home/other" and env["USER"] == env["LOGNAME"] == "other"
    mine = {"LANG": "C.UTF-8", "TZ": "UTC", "TMPDIR": "/var/tmp/mine"}
    assert _task_env(controller, _other(), mine).items() >= mine.items()


def test_a_task_of_the_controllers_own_user_keeps_its_environment(
    controller: LiveController, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A personal controller's job is its user's: its tasks get the controller's LANG,
    LC_* and TZ (TMPDIR is the job's scratch, as for every job)."""
    for key, value in AGENTS.items():
        monkeypatch.setenv(key, value)
    env = _task_env(controller, Account.of_uid(os.geteuid()), {})
    assert env.items() >= {k: v for k, v in AGENTS.items() if k != "TMPDIR"}.items()
