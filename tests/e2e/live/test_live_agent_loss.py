"""A lost agent is a failed host on the live controller, with real agents and
processes: an agent killed with SIGKILL, or stopped (SIGSTOP) past ``agent_timeout``,
fails its host (``unavail``: nothing is placed there); a resizable job shrinks, a rigid
one ends EXIT once its processes on the other hosts are gone; the host is back once its
agent registers again. ``xce-resize host down|up`` fences a host by hand
(docs/live-controller.md, "Lost agents and failed hosts"; docs/admin-guide.md)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from xce_resize_plugin.controllers.live.tasks import ensure_secret
from xce_resize_plugin.controllers.live.worker import worker_dir
from xce_resize_plugin.journal.lmdb_env import private_dir
from xce_resize_plugin.testing.live import ALICE, BOB, ROOT, LiveCluster, alive, wait_until

from .test_live_autoresize import _settled
from .test_live_clients import cli

StartAgent = Callable[[LiveCluster, str], subprocess.Popen[bytes]]


@pytest.fixture
def start_agent() -> Iterator[StartAgent]:
    """Start a host's agent by hand (``manage_workers = false``); every agent started
    is killed by its pid and waited for at the end."""
    agents: list[subprocess.Popen[bytes]] = []

    def start(live: LiveCluster, host: str) -> subprocess.Popen[bytes]:
        private_dir(live.state / "workers")
        ensure_secret(live.state)  # what the controller would create
        wdir = worker_dir(live.state, host)
        wdir.mkdir(parents=True, exist_ok=True)
        argv = [sys.executable, "-m", "xce_resize_plugin", "worker", "--host", host]
        with open(wdir / "worker.log", "ab") as log:
            agent = subprocess.Popen(
                [*argv, "--state-dir", str(live.state)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                cwd=str(live.state),
            )
        agents.append(agent)
        return agent

    try:
        yield start
    finally:
        for agent in agents:
            if agent.poll() is None:
                os.kill(agent.pid, signal.SIGCONT)
                agent.kill()
            agent.wait(10)


def _host_states(live: LiveCluster) -> dict[str, str]:
    return {h["name"]: h["state"] for h in live.ok("GET", "/v1/hosts", ROOT)["hosts"]}


def _records(live: LiveCluster, job_id: str) -> list[tuple[str, str | None]]:
    history = live.ok("GET", f"/v1/jobs/{job_id}/resize/history", ALICE)
    return [(r["type"], r.get("reason")) for r in history["records"]]


def _pids(job: dict[str, Any]) -> dict[int, int]:
    return {t["id"]: t["pid"] for t in job["tasks"] if t["pid"]}


def _agent_pid(live: LiveCluster, host: str) -> int:
    return int(live.cluster()["hosts"][host]["worker"]["pid"])


def test_a_killed_agent_fails_its_host_until_it_registers_again(
    resize_live_factory: Any, start_agent: StartAgent
) -> None:
    live: LiveCluster = resize_live_factory(
        {"h1": 2, "h2": 2, "h3": 1}, controller="manage_workers = false"
    )
    agents = {h: start_agent(live, h) for h in ("h1", "h2", "h3")}
    live.start()
    # Task 0 of each job is elsewhere than h2; both have a task on h2.
    rigid = live.submit(tasks=2, alloc={"h3": 1, "h2": 1})
    elastic = live.submit(tasks="1,3", alloc={"h1": 2, "h2": 1}, autoresize=True)
    rigid_pids = _pids(live.running(rigid, 2))
    elastic_pids = _pids(live.running(elastic, 3))
    queued = live.submit(token=BOB, tasks=1)  # the cluster is full: it waits
    assert live.job(queued)["state"] == "PEND"

    os.kill(agents["h2"].pid, signal.SIGKILL)
    agents["h2"].wait(10)
    wait_until(lambda: _host_states(live)["h2"] == "unavail", 15, "h2 unavail")
    # The resizable job lost its task there as an involuntary shrink.
    job = _settled(live, elastic, 1)
    assert [t["host"] for t in job["allocation"]] == ["h1", "h1"]
    assert _records(live, elastic) == [("shrink", "host_failure")]
    # The rigid job ends EXIT, its process on h3 stopped before its end.
    job = wait_until(lambda: (j := live.job(rigid))["state"] == "EXIT" and j, 15, "rigid EXIT")
    assert job["exit_reason"] == "host failure" and job["held"] == []
    assert not alive(rigid_pids[0])
    # Its slot on h3 goes to the queued job; nothing is placed on h2, not even the
    # elastic job's demand for one more task.
    wait_until(lambda: live.job(queued)["state"] == "RUN", 15, "the queued job starts")
    assert live.job(queued)["hosts"] == {"h3": 1}
    assert live.job(elastic)["resize"]["demand"]["max"] == 1
    hosts = json.loads(cli(live, "hosts", "--json", token=ROOT).stdout)["hosts"]
    assert [(h["name"], h["state"], h["used"]) for h in hosts if h["name"] == "h2"] == [
        ("h2", "unavail", 0)
    ]
    assert live.cluster()["problems"] == []

    # The agent registers again: its predecessor's tasks are killed, the host takes
    # tasks again, and the autoresizable job grows back there.
    start_agent(live, "h2")
    wait_until(lambda: _host_states(live)["h2"] == "ok", 15, "h2 ok")
    wait_until(lambda: not alive(rigid_pids[1]) and not alive(elastic_pids[2]), 15, "orphans")
    job = _settled(live, elastic, 2)
    assert job["hosts"] == {"h1": 2, "h2": 1}
    live.running(elastic, 3)
    assert _records(live, elastic) == [("shrink", "host_failure"), ("grow", None)]
    live.check_consistent(elastic)


def test_host_down_and_up_by_hand(resize_live_factory: Any) -> None:
    live: LiveCluster = resize_live_factory({"h1": 2, "h2": 2})
    live.start()
    elastic = live.submit(tasks="1,3", alloc={"h1": 1, "h2": 2}, resizable=True)
    pids = _pids(live.running(elastic, 3))

    # Bad input: refused with a clear error, nothing changes.
    proc = cli(live, "host", "down", "h2")
    assert proc.returncode == 255 and "only administrators" in proc.stderr, proc.stderr
    assert live.call("POST", "/v1/hosts/h2/down", ALICE).status_code == 403
    assert live.call("POST", "/v1/hosts/h2/up", BOB).status_code == 403
    proc = cli(live, "host", "down", "hZ", token=ROOT)
    assert proc.returncode == 255 and "hZ" in proc.stderr, proc.stderr
    for path, status, code in [
        ("/v1/hosts/hZ/down", 404, "XCE_NO_SUCH_HOST"),
        ("/v1/hosts/h2/up", 409, "XCE_HOST_STATE"),
    ]:
        r = live.call("POST", path, ROOT)
        assert (r.status_code, r.json()["code"]) == (status, code), r.text
    r = live.call("POST", "/v1/hosts/h2/down", ROOT, {"evacuate": True})
    assert r.status_code == 400
    assert _host_states(live) == {"h1": "ok", "h2": "ok"}
    assert live.job(elastic)["version"] == 0 and all(alive(p) for p in pids.values())

    proc = cli(live, "host", "down", "h2", token=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["Host <h2> is unavail", f"  job {elastic}: shrunk"]
    # The agent answers: the tasks there are killed at once.
    wait_until(lambda: not alive(pids[1]) and not alive(pids[2]), 10, "h2's tasks killed")
    job = live.idle(elastic, 1)
    assert job["hosts"] == {"h1": 1}
    assert _records(live, elastic) == [("shrink", "host_failure")]
    proc = cli(live, "host", "down", "h2", token=ROOT)
    assert proc.returncode == 255 and "already unavail" in proc.stderr, proc.stderr

    # Fenced by hand, the host stays unavail even when its agent registers again.
    bob = live.submit(token=BOB, tasks=2)
    os.kill(_agent_pid(live, "h2"), signal.SIGKILL)
    wait_until(lambda: live.cluster()["hosts"]["h2"]["worker"]["ready"], 15, "new agent")
    assert _host_states(live)["h2"] == "unavail"
    assert live.job(bob)["state"] == "PEND"

    proc = cli(live, "host", "up", "h2", token=ROOT)
    assert proc.returncode == 0 and proc.stdout == "Host <h2> is ok\n", proc.stdout
    wait_until(lambda: live.job(bob)["state"] == "RUN", 15, "bob's job starts")
    assert live.cluster()["problems"] == []
    live.check_consistent(elastic)


def test_an_unheard_agent_fails_its_host(resize_live_factory: Any) -> None:
    """A stopped agent (SIGSTOP) holds its lock but does not answer: past
    ``agent_timeout`` its host fails; SIGCONT, and it is back, its old task stopped."""
    live: LiveCluster = resize_live_factory({"h1": 2, "h2": 2}, controller="agent_timeout = 2")
    live.start()
    elastic = live.submit(tasks="1,2", alloc={"h1": 1, "h2": 1}, resizable=True)
    pids = _pids(live.running(elastic, 2))
    agent = _agent_pid(live, "h2")
    os.kill(agent, signal.SIGSTOP)
    try:
        wait_until(lambda: _host_states(live)["h2"] == "unavail", 30, "h2 unavail")
        job = live.idle(elastic, 1)
        assert job["hosts"] == {"h1": 1}
        assert alive(pids[1])  # its agent cannot stop it yet
    finally:
        os.kill(agent, signal.SIGCONT)
    wait_until(lambda: _host_states(live)["h2"] == "ok", 30, "h2 ok")
    assert _agent_pid(live, "h2") == agent  # the same agent, registered again
    wait_until(lambda: not alive(pids[1]), 15, "the lost task stopped")
    assert _records(live, elastic) == [("shrink", "host_failure")]
    live.check_consistent(elastic)


def test_a_recorded_host_failure_with_a_requeue_replays_identically(tmp_path: Path) -> None:
    """``host down`` by hand with the site's requeue policy: the rigid job's process on
    the other host is stopped, then it goes back to the queue and starts again from
    scratch elsewhere; the resizable job shrinks. The recording (host lines, the
    requeue as an end line with state PEND) replays to the same facts."""
    from tests.e2e.live.test_live_recording import RESIZE, stop
    from xce_resize_plugin.recording.format import read_recording
    from xce_resize_plugin.recording.replay import PolicyChoice, replay

    policy = Path(__file__).parents[3] / "hooks" / "requeue_on_host_failure.py"
    live = LiveCluster(
        tmp_path,
        {"h1": 2, "h2": 2, "h3": 1},
        {**RESIZE, "policy_files": [str(policy)]},
        controller='record = "run.jsonl"',
    )
    try:
        proc = live.start()
        elastic = live.submit(tasks="1,2", alloc={"h1": 1, "h2": 1}, resizable=True)
        rigid = live.submit(tasks=2, alloc={"h1": 1, "h2": 1})
        live.running(elastic, 2)
        first = _pids(live.running(rigid, 2))
        r = live.call("POST", "/v1/hosts/h2/down", ROOT)
        assert r.status_code == 200, r.text
        assert r.json() == {
            "host": "h2",
            "state": "unavail",
            "jobs": {elastic: "shrunk", rigid: "requeue"},
        }
        # Stopped everywhere first, then requeued: it runs again on the hosts left.
        job = wait_until(
            lambda: (
                (j := live.job(rigid))["state"] == "RUN" and j["hosts"] == {"h1": 1, "h3": 1} and j
            ),
            20,
            "the requeued job runs again",
        )
        assert not alive(first[0]) and not alive(first[1])
        assert not job["exit_reason"] and job["version"] == 0 and job["requeues"] == 1
        assert live.job(elastic)["requeues"] == 0
        live.running(rigid, 2)
        assert live.idle(elastic, 1)["hosts"] == {"h1": 1}
        assert live.call("POST", "/v1/hosts/h2/up", ROOT).json()["state"] == "ok"
        assert live.cluster()["problems"] == []
        assert stop(proc) == 0
    finally:
        live.cleanup()
    # Checked as replay reads it; the host commands and the requeue are input lines.
    _, lines = read_recording(tmp_path / "run.jsonl")
    inputs = [(x["kind"], x.get("host", x.get("job")), x["state"]) for x in lines if "state" in x]
    assert inputs == [
        ("host", "h2", "down"),
        ("ending", rigid, "PEND"),  # its task on h1 is stopped first
        ("end", rigid, "PEND"),
        ("host", "h2", "up"),
    ]
    # The run loaded the site's requeue policy: the replay is given it.
    result = replay(tmp_path / "run.jsonl", policies=PolicyChoice((policy,)))
    assert result.ok, result.problems


def test_unavail_after_a_restart_is_derived_from_the_agents(
    resize_live_factory: Any, start_agent: StartAgent
) -> None:
    """After a controller crash, a failed host whose agent answers is back, one whose
    agent does not answer fails, and a host set down by hand stays down until ``up``."""
    live: LiveCluster = resize_live_factory(
        {"h1": 1, "h2": 1, "h3": 1}, controller="manage_workers = false"
    )
    agents = {h: start_agent(live, h) for h in ("h1", "h2", "h3")}
    live.start()
    assert live.call("POST", "/v1/hosts/h3/down", ROOT).status_code == 200
    os.kill(agents["h2"].pid, signal.SIGKILL)
    agents["h2"].wait(10)
    wait_until(lambda: _host_states(live)["h2"] == "unavail", 15, "h2 unavail")

    live.crash()
    start_agent(live, "h2")  # h2's agent is back while no controller runs
    live.start()
    assert _host_states(live) == {"h1": "ok", "h2": "ok", "h3": "unavail"}

    live.crash()
    os.kill(agents["h1"].pid, signal.SIGKILL)  # h1's agent dies while no controller runs
    agents["h1"].wait(10)
    live.start()
    assert _host_states(live) == {"h1": "unavail", "h2": "ok", "h3": "unavail"}
    assert live.call("POST", "/v1/hosts/h3/up", ROOT).json() == {"host": "h3", "state": "ok"}
    job = live.submit(tasks=2)
    assert live.running(job, 2)["hosts"] == {"h2": 1, "h3": 1}
    assert live.cluster()["problems"] == []


def test_a_notification_for_a_host_failed_at_the_start_never_runs(
    resize_live_factory: Any, start_agent: StartAgent, tmp_path: Path
) -> None:
    """The job's first host is frozen while its grow's notification is on its way there,
    and the controller dies; that host's agent dies too. At the restart the plugin runs
    the notification again, towards an agent that does not answer: the host fails at
    the start, and the job, whose task 0 was there, ends. When the agent comes back,
    the notification queued for it is not run: a user's command never runs for a job
    that has ended."""
    live: LiveCluster = resize_live_factory({"h1": 2, "h2": 2}, controller="manage_workers = false")
    agents = {h: start_agent(live, h) for h in ("h1", "h2")}
    live.start()
    marker = tmp_path / "notified"
    job_id = live.submit(
        tasks="1,3", alloc={"h1": 1}, resizable=True, notify_cmd=f"echo ran >> {marker}"
    )
    task0 = _pids(live.running(job_id, 1))[0]
    os.kill(agents["h1"].pid, signal.SIGSTOP)
    try:
        assert live.grow(job_id, 2).status_code == 202
        wait_until(lambda: live.phase(job_id) == "GROW_NOTIFYING", 5, "notifying")
        live.crash()
    finally:
        os.kill(agents["h1"].pid, signal.SIGKILL)
        agents["h1"].wait(10)
    live.start()
    job = wait_until(lambda: (j := live.job(job_id))["state"] == "EXIT" and j, 15, "job ends")
    assert job["exit_reason"] == "host failure"
    start_agent(live, "h1")
    wait_until(lambda: _host_states(live)["h1"] == "ok", 15, "h1 ok")
    wait_until(lambda: not alive(task0), 15, "the lost task 0 stopped by the new agent")
    time.sleep(1.5)  # what the new agent was sent has had time to run
    assert not marker.exists(), marker.read_text()
    assert live.cluster()["problems"] == []
