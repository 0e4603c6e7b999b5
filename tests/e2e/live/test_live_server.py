"""The live controller's server as a site runs it (a real `xce-resize controller`
process): what ``GET /v1/cluster`` shows to whom; listening on port 0."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from xce_resize_plugin.testing.live import ALICE, BOB, LiveCluster, controller_command, wait_until


def test_cluster_details_are_for_administrators(resize_live_factory: Any) -> None:
    """A user (or a job's token) sees the hosts' slots and use, whether each agent is
    ready, and their own usage; not bob's usage, not the agents' pids and ports, not
    the invariant check. The administrator sees all of it."""
    live: LiveCluster = resize_live_factory(
        {"h1": 2, "h2": 2}, limits="[limits]\nuser_slots = { carol = 3 }"
    )
    live.start()
    bobs = live.submit(BOB, tasks=2)
    mine = live.ok("POST", "/v1/jobs", ALICE, {"command": ["sleep", "600"], "tasks": 1})
    live.running(bobs, 2)
    live.running(mine["id"], 1)

    full = live.cluster()
    assert set(full["users"]) == {"alice", "bob", "carol"}
    assert all(isinstance(h["worker"]["pid"], int) for h in full["hosts"].values())
    assert all(isinstance(h["worker"]["port"], int) for h in full["hosts"].values())
    assert full["problems"] == []

    for token in (ALICE, mine["token"]):
        seen = live.ok("GET", "/v1/cluster", token)
        assert seen == {
            "epoch": full["epoch"],
            "hosts": {
                name: {"slots": h["slots"], "used": h["used"], "worker": {"ready": True}}
                for name, h in full["hosts"].items()
            },
            "users": {"alice": {"slots_in_use": 1, "limit": None}},
        }
    assert live.ok("GET", "/v1/cluster", BOB)["users"] == {
        "bob": {"slots_in_use": 2, "limit": None}
    }
    # A user who holds nothing and has no limit still sees their own (empty) entry.
    assert live.call("DELETE", f"/v1/jobs/{bobs}", BOB).status_code == 202
    wait_until(lambda: live.job(bobs)["state"] == "EXIT", 10, "bob's job killed")
    assert live.ok("GET", "/v1/cluster", BOB)["users"] == {
        "bob": {"slots_in_use": 0, "limit": None}
    }


def _start_on_port_0(live: LiveCluster, ready: Path) -> subprocess.Popen[bytes]:
    """The controller with ``listen = "127.0.0.1:0"`` in its configuration, started as a
    site starts it (cleaned up by the fixture, by pid)."""
    text = live.config.read_text()
    live.config.write_text(
        text.replace(f'listen = "127.0.0.1:{live.port}"', 'listen = "127.0.0.1:0"')
    )
    log = open(live.tmp / "controller-0.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen(
        [*controller_command(live.config), "--ready-file", str(ready)],
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    log.close()
    live.procs.append(proc)
    return proc


def test_listen_on_port_0_reports_the_bound_port(resize_live_factory: Any) -> None:
    """``listen = "127.0.0.1:0"`` is accepted; the port the system chose is in the
    start-up line and the ready file, serves, and is the URL the tasks get."""
    live: LiveCluster = resize_live_factory({"h1": 1})
    ready = live.tmp / "ready.json"
    proc = _start_on_port_0(live, ready)

    def written() -> dict[str, Any] | None:
        assert proc.poll() is None, (live.tmp / "controller-0.log").read_text()
        return json.loads(ready.read_text()) if ready.exists() else None

    info = wait_until(written, 20, "the ready file")
    port = info["port"]
    assert isinstance(port, int) and port > 0
    assert info["url"] == f"http://127.0.0.1:{port}" and info["listen"] == f"127.0.0.1:{port}"
    assert isinstance(info["epoch"], int) and isinstance(info["time"], float)
    log = (live.tmp / "controller-0.log").read_text()
    assert f"serving http://127.0.0.1:{port} " in log
    live.port = port
    assert live.ok("GET", "/v1/health")["status"] == "ok"
    job = live.submit(command=["/bin/sh", "-c", 'echo "$XCE_CONTROLLER_URL"; exec sleep 600'])
    out = live.state / "jobs" / job / "task-0.out"
    assert wait_until(lambda: out.exists() and out.read_text().strip()) == info["url"]
