"""The worker agent tells a launch sent again from a new run's task of the same id
(controllers/live/worker.py ``_launch``): a job requeued after a host failure runs
again from task 0, and when the agent did not hear the ``forget`` that followed the
requeue (its host was the one lost), it still knows the first run's tasks."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from xce_resize_plugin.controllers.live.proc import Account, account_json
from xce_resize_plugin.controllers.live.worker import WorkerAgent, worker_dir
from xce_resize_plugin.testing.live import wait_until


def _launch(tmp_path: Path, run: str | None, script: str) -> dict[str, Any]:
    launch: dict[str, Any] = {"op": "launch", "job": "7", "task": 0}
    launch |= {"argv": ["/bin/sh", "-c", script], "cwd": str(tmp_path)}
    launch |= {"env": {"PATH": os.defpath, "XCE_JOB_ID": "7", "XCE_TASK_ID": "0"}}
    launch |= {"stdout": str(tmp_path / "o"), "stderr": str(tmp_path / "e")}
    launch["user"] = account_json(Account.of_uid(os.geteuid()))
    if run is not None:
        launch["run"] = run
    return launch


def _kinds(agent: WorkerAgent, since: int) -> list[tuple[str, Any]]:
    return [(e["kind"], e.get("pid")) for e in agent.events[since:]]


def test_a_new_runs_task_starts_where_an_earlier_runs_ended(tmp_path: Path) -> None:
    state = tmp_path / "state"
    worker_dir(state, "h1").mkdir(parents=True)
    agent = WorkerAgent("h1", state)
    try:
        agent.execute(0, agent.instance, [_launch(tmp_path, "100.0", "exit 3")])
        first = agent.tasks[("7", 0)].pid
        wait_until(lambda: agent.tasks[("7", 0)].state == "exited", 20, "the first run's end")
        # The same run's launch sent again: reported, not run again.
        seen = len(agent.events)
        agent.execute(0, agent.instance, [_launch(tmp_path, "100.0", "exit 3")])
        assert _kinds(agent, seen) == [("started", first), ("exited", None)]
        # A launch that names no run (an older controller): reported as before.
        seen = len(agent.events)
        agent.execute(0, agent.instance, [_launch(tmp_path, None, "exit 3")])
        assert [k for k, _ in _kinds(agent, seen)] == ["started", "exited"]
        # The next run's task 0: started, a process of its own.
        seen = len(agent.events)
        agent.execute(0, agent.instance, [_launch(tmp_path, "250.0", "exec sleep 60")])
        task = agent.tasks[("7", 0)]
        assert task.state == "running" and task.pid not in (None, first)
        assert _kinds(agent, seen) == [("started", task.pid)]
        # While it runs, a third run's task of that id does not start beside it.
        seen = len(agent.events)
        agent.execute(0, agent.instance, [_launch(tmp_path, "400.0", "exit 0")])
        assert [k for k, _ in _kinds(agent, seen)] == ["start_failed"]
        assert agent.tasks[("7", 0)] is task
    finally:
        agent.closing = True
        for t in agent.tasks.values():
            if t.popen is not None and t.popen.poll() is None:
                t.popen.kill()
                t.popen.wait()
