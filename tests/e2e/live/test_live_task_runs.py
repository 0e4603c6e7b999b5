"""A requeued job runs again from task 0, and an agent that missed the ``forget`` after
the requeue still knows the earlier run's task 0 (controllers/live/worker.py
``_launch``). A controller that restarts before the new run's launch reached the agent
reconciles with that agent (controllers/live/agents.py ``_reconcile``): the ended task
of the earlier run is not the new run's, whose launch is sent again. In-process, with
real agents: the restart is a controller that never sent the launch it recorded."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import httpx

from xce_resize_plugin.controllers.live import settings as live_config
from xce_resize_plugin.controllers.live.agent_client import AgentAuth
from xce_resize_plugin.controllers.live.live_controller import LiveController
from xce_resize_plugin.controllers.live.proc import Account, account_json
from xce_resize_plugin.host import Principal
from xce_resize_plugin.manager import get_plugin_manager
from xce_resize_plugin.testing.live import kill_marked, wait_until

CONFIG = """
[controller]
listen = "127.0.0.1:7001"
state_dir = "state"
single_user = true

[cluster]
hosts = { h1 = 2 }

[users]
admins = ["root"]
tokens = { alice = "alice-secret-1" }

[resize]
stop_grace = 1
"""


def _controller(cfg: live_config.LiveConfig) -> LiveController:
    ctl = LiveController(get_plugin_manager(cfg.resize), cfg)
    ctl.open()
    return ctl


def _agent_tasks(ctl: LiveController) -> dict[tuple[str, int], dict[str, Any]]:
    channel = ctl.fleet.channels["h1"]
    snapshot = httpx.get(
        f"http://127.0.0.1:{channel.port}/v1/snapshot",
        params={"epoch": ctl.fleet.epoch},
        auth=AgentAuth(ctl.fleet.secret),
        timeout=5,
    ).json()
    return {(str(t["job"]), int(t["task"])): t for t in snapshot["tasks"]}


def _earlier_run(tmp_path: Path) -> dict[str, Any]:
    """Task 0 of job 101's earlier run, as its launch named it; it ended (status 3)."""
    return {
        "op": "launch",
        "job": "101",
        "task": 0,
        "run": "1.0",
        "argv": ["/bin/sh", "-c", "exit 3"],
        "user": account_json(Account.of_uid(os.geteuid())),
        "env": {"PATH": os.defpath, "XCE_JOB_ID": "101", "XCE_TASK_ID": "0"},
        "cwd": str(tmp_path),
        "stdout": str(tmp_path / "earlier.out"),
        "stderr": str(tmp_path / "earlier.err"),
    }


def test_a_new_runs_launch_lost_with_a_restart_is_not_an_earlier_runs_end(
    tmp_path: Path,
) -> None:
    (tmp_path / "c.toml").write_text(CONFIG)
    cfg = live_config.load(tmp_path / "c.toml")
    first = _controller(cfg)
    second = None
    try:
        channel = first.fleet.channels["h1"]
        channel.enqueue(_earlier_run(tmp_path))
        wait_until(
            lambda: _agent_tasks(first).get(("101", 0), {}).get("state") == "exited",
            15,
            "the earlier run's task 0 ended",
        )
        wait_until(lambda: channel.seq >= 2, 10, "its events seen (no job of that id yet)")
        # The new run's launch is recorded, and the controller stops before sending it
        # (as a crash right after the write would).
        with channel.send_lock:
            job_id = first.submit_job(
                Principal("alice"), {"command": ["sleep", "600"], "alloc": {"h1": 1}}
            )["id"]
            assert job_id == "101"
            wait_until(lambda: ("launch", job_id, 0) in channel.queued(), 10, "the launch")
            first.shutdown()
        second = _controller(cfg)
        wait_until(lambda: second.job_json(job_id)["tasks"][0]["pid"], 15, "the new run's task 0")
        job = second.job_json(job_id)
        assert job["state"] == "RUN", job
        assert _agent_tasks(second)[(job_id, 0)]["state"] == "running"
    finally:
        if second is not None:
            second.shutdown()
        kill_marked(str(tmp_path))
