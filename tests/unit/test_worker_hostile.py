"""The worker agent against what a hostile job controls (docs/live-controller.md,
"Worker agents", "Notification commands", "Logs"): the output of its notification
command, its scratch directory, the filesystem it shares with the agent.

The agent runs as root in a real install and serves every job of its host: nothing a
job does may take its memory, stop its threads or keep another job's task from being
reported. The job's processes here are real ones, run as ``nobody`` when the tests run
as root (as a root agent runs a job's), as the test's user otherwise.
"""

from __future__ import annotations

import os
import pwd
import tracemalloc
from pathlib import Path
from typing import Any

import pytest

from xce_resize_plugin.controllers.live.proc import Account, account_json
from xce_resize_plugin.controllers.live.worker import WorkerAgent, worker_dir
from xce_resize_plugin.testing.live import wait_until

MIB = 1 << 20


def _owner() -> Account:
    """Who the job's processes run as: ``nobody`` under root, else the test's user."""
    if os.geteuid() == 0:
        return Account.named(pwd.getpwuid(65534).pw_name)
    return Account.of_uid(os.geteuid())


def _agent(tmp_path: Path) -> WorkerAgent:
    state = tmp_path / "state"
    worker_dir(state, "h1").mkdir(parents=True)
    return WorkerAgent("h1", state)


def _notify(agent: WorkerAgent, tmp_path: Path, command: str, timeout: float) -> dict[str, Any]:
    """Run ``command`` as the job's notification command; its ``notify_done`` event."""
    jdir = tmp_path / "job"
    jdir.mkdir(exist_ok=True)
    notify = {"op": "notify", "job": "7", "attempt": 1, "command": command, "timeout": timeout}
    notify |= {"env": {"PATH": os.defpath}, "cwd": str(jdir), "log": str(jdir / "notify-1.log")}
    notify["user"] = account_json(_owner())
    agent.execute(0, agent.instance, [notify])
    event = wait_until(
        lambda: next((e for e in agent.events if e["kind"] == "notify_done"), None), 60, "done"
    )
    return dict(event)


@pytest.mark.parametrize(
    ("command", "timeout", "status"),
    [
        # Much output, then an exit of its own: kept up to the limit, and the status.
        ("head -c 67108864 /dev/zero; head -c 67108864 /dev/zero >&2; exit 3", 60.0, 3),
        # Output that never ends: until the timeout.
        ("exec cat /dev/zero", 1.0, None),
    ],
)
def test_a_notification_commands_output_takes_bounded_memory(
    tmp_path: Path, command: str, timeout: float, status: int | None
) -> None:
    """What the agent keeps of a notification command's output is bounded while it
    reads it, not only once the command ended: a command that writes 64 MiB, or writes
    without end until its timeout, must not take the agent's memory."""
    agent = _agent(tmp_path)
    tracemalloc.start()
    try:
        done = _notify(agent, tmp_path, command, timeout)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        agent.closing = True
    assert done["status"] == status, done
    assert peak < 16 * MIB, f"the agent held {peak / MIB:.0f} MiB of output"
    limit = agent.max_output
    assert done["stdout"] == "\0" * limit + "\n[output truncated]\n"
    if status is not None:
        assert done["stderr"] == "\0" * limit + "\n[output truncated]\n"
