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
from xce_resize_plugin.controllers.live.worker import (
    NOTIFY_OUTPUT_REPORTED,
    NOTIFY_RESULTS_KEPT,
    WorkerAgent,
    worker_dir,
)
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


def _notify(
    agent: WorkerAgent, tmp_path: Path, command: str, timeout: float, attempt: int = 1
) -> dict[str, Any]:
    """Run ``command`` as the job's notification command; its ``notify_done`` event."""
    jdir = tmp_path / "job"
    jdir.mkdir(exist_ok=True)
    notify = {"op": "notify", "job": "7", "attempt": attempt, "command": command}
    notify |= {"timeout": timeout, "env": {"PATH": os.defpath}, "cwd": str(jdir)}
    notify |= {"log": str(jdir / f"notify-{attempt}.log"), "user": account_json(_owner())}
    agent.execute(0, agent.instance, [notify])

    def done() -> dict[str, Any] | None:
        found = [e for e in agent.events if e["kind"] == "notify_done"]
        return next((e for e in found if e["attempt"] == attempt), None)

    return dict(wait_until(done, 60, "done"))


def test_a_jobs_notification_results_kept_to_answer_again_are_bounded(
    tmp_path: Path,
) -> None:
    """The agent keeps a job's newest results, to report again a command sent again
    (a failover re-sends its latest change's), not every result of a job resized for
    days; the one sent again is reported again, not run again."""
    agent = _agent(tmp_path)
    try:
        for attempt in range(1, NOTIFY_RESULTS_KEPT + 5):
            _notify(agent, tmp_path, f"echo run {attempt}", 30.0, attempt)
        kept = sorted(a for (job, a), v in agent.notifications.items() if v is not None)
        assert kept == list(range(5, NOTIFY_RESULTS_KEPT + 5))
        latest = NOTIFY_RESULTS_KEPT + 4
        before = len(agent.events)
        _notify(agent, tmp_path, "echo again", 30.0, latest)
        again = agent.events[before:]
        assert [(e["attempt"], e["stdout"]) for e in again] == [(latest, f"run {latest}\n")]
    finally:
        agent.closing = True


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
    # Reported: the first NOTIFY_OUTPUT_REPORTED characters; the log has max_output.
    shown = "\0" * NOTIFY_OUTPUT_REPORTED + "\n[output truncated: notify-N.log has more]\n"
    assert done["stdout"] == shown
    if status is not None:
        assert done["stderr"] == shown
    logged = (tmp_path / "job" / "notify-1.log").read_text()
    assert "# stdout\n" + "\0" * agent.max_output + "\n[output truncated]\n# stderr" in logged
