"""An administrator's host commands on the live controller: ``xce-resize hosts``, ``host
close [--evacuate]`` and ``host open`` through the real command line and REST, with real
agents and processes (docs/admin-guide.md, "Host states")."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.e2e.live.test_live_clients import cli
from xce_resize_plugin.testing.live import ALICE, BOB, ROOT, LiveCluster, wait_until


def test_close_evacuate_and_open_a_host(resize_live_factory: Any) -> None:
    live: LiveCluster = resize_live_factory({"h1": 2, "h2": 2})
    live.start()
    elastic = live.submit(command=["sleep", "600"], tasks="2,4", resizable=True)
    live.running(elastic, 4)  # h1 2, h2 2
    bob = live.submit(token=BOB, command=["sleep", "600"], tasks=1)

    # Alice sees every host and only her own job on it; root sees all.
    hosts = json.loads(cli(live, "hosts", "--json").stdout)["hosts"]
    assert [(h["name"], h["state"], h["used"], h["jobs"]) for h in hosts] == [
        ("h1", "ok", 2, {elastic: 2}),
        ("h2", "ok", 2, {elastic: 2}),
    ]
    assert bob not in json.dumps(hosts)

    # Only an administrator may close a host (403, nothing changes).
    proc = cli(live, "host", "close", "h2")
    assert proc.returncode == 255 and "only administrators" in proc.stderr, proc.stderr
    assert live.call("POST", "/v1/hosts/h2/close", ALICE).status_code == 403
    proc = cli(live, "host", "close", "--evacuate", "h2", token=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("Host <h2> is closed")
    assert f"job {elastic}: asked to release task(s) 2, 3" in proc.stdout
    job = live.idle(elastic, 1)
    assert job["hosts"] == {"h1": 2}  # released h2's tasks through the normal path
    # Bob's queued job cannot go to the closed host; it starts once h2 opens.
    assert live.job(bob)["state"] == "PEND"
    table = cli(live, "hosts").stdout
    assert "h2" in table and "closed" in table.splitlines()[2]

    for path, status, code in [
        ("/v1/hosts/h2/close", 409, "XCE_HOST_STATE"),
        ("/v1/hosts/hZ/open", 404, "XCE_NO_SUCH_HOST"),
        ("/v1/hosts/h2/reboot", 400, "XCE_RESIZE_INVALID_REQUEST"),
    ]:
        r = live.call("POST", path, ROOT)
        assert (r.status_code, r.json()["code"]) == (status, code), r.text
    r = live.call("POST", "/v1/hosts/h2/open", ROOT, {"evacuate": True})
    assert r.status_code == 400 and live.job(bob)["state"] == "PEND"  # nothing changed
    proc = cli(live, "host", "close", "h2", token=ROOT)
    assert proc.returncode == 255 and "already closed" in proc.stderr
    assert cli(live, "host", "open", "--evacuate", "h2", token=ROOT).returncode == 2

    assert cli(live, "host", "open", "h2", token=ROOT).returncode == 0
    wait_until(lambda: live.job(bob)["state"] == "RUN", 15, "bob's job starts on h2")
    assert live.cluster()["problems"] == []
    assert live.call("GET", "/v1/hosts", ALICE).status_code == 200


def test_a_recorded_drain_replays_to_the_same_facts(tmp_path: Path) -> None:
    """A live run with an evacuating close is recorded (a host line, then the
    evacuation's releases as request lines) and replays identically."""
    from tests.e2e.live.test_live_recording import recording_cluster, stop
    from xce_resize_plugin.recording.replay import replay

    live = recording_cluster(tmp_path, {"h1": 2, "h2": 2})
    try:
        proc = live.start()
        job = live.submit(command=["sleep", "600"], tasks="2,4", resizable=True)
        live.running(job, 4)
        r = live.call("POST", "/v1/hosts/h2/close", ROOT, {"evacuate": True})
        assert r.status_code == 200 and r.json()["asked"] == {job: [2, 3]}
        live.idle(job, 1)
        assert live.call("POST", "/v1/hosts/h2/open", ROOT).status_code == 200
        assert stop(proc) == 0
    finally:
        live.cleanup()
    path = tmp_path / "run.jsonl"
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(x["host"], x["state"]) for x in lines if x["kind"] == "host"] == [
        ("h2", "closed"),
        ("h2", "open"),
    ]
    result = replay(path)
    assert result.ok, result.problems
