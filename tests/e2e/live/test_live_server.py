"""The live controller's server as a site runs it (a real `xce-resize controller`
process): what ``GET /v1/cluster`` shows to whom."""

from __future__ import annotations

from typing import Any

from xce_resize_plugin.testing.live import ALICE, BOB, LiveCluster, wait_until


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
