"""Failover with real processes: the controller is SIGKILLed in the middle of a change
and a new one starts on the same state directory (docs/failover.md,
docs/live-controller.md). After every restart: the change completed (or rolled back as
documented), no task ran twice, none was lost, limits and accounting equal the
allocation (:meth:`LiveCluster.check_consistent`)."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import httpx
import pytest

from xce_resize_plugin.testing.live import ALICE, LiveCluster, alive, free_port, wait_until

STUBBORN = [
    "/bin/sh",
    "-c",
    'trap "" TERM; echo "start $XCE_TASK_ID"; while :; do sleep 0.05; done',
]


#: Alice may hold 3 slots: every change below stays within it, and the invariant check
#: (GET /v1/cluster) compares her counted slots with the limit and the allocation.
LIMITS = "[limits]\nuser_slots = { alice = 3 }"


def _agent_pid(live: LiveCluster, host: str) -> int:
    return int(live.cluster()["hosts"][host]["worker"]["pid"])


@pytest.mark.parametrize(
    ("kind", "point"),
    [
        # Grow notifying is covered by test_crash_while_notifying (the command running),
        # the commit by the shrink case (one code path).
        ("grow", "after-request"),
        ("grow", "after-reserve"),
        ("grow", "after-launch"),
        ("shrink", "after-notify"),
        ("shrink", "after-stop"),
        ("shrink", "after-commit"),
    ],
)
def test_crash_at_each_step(resize_live_factory: Any, kind: str, point: str) -> None:
    """SIGKILL at a precise step (``XCE_LIVE_CRASH``), restart, the change completes."""
    live: LiveCluster = resize_live_factory({"h1": 2, "h2": 2}, limits=LIMITS)
    live.start(env={"XCE_LIVE_CRASH": point})
    alloc = {"h1": 1} if kind == "grow" else {"h1": 1, "h2": 2}
    job_id = live.submit(tasks="1,3", alloc=alloc, resizable=True, notify_cmd="exit 0")
    live.running(job_id, sum(alloc.values()))
    try:
        response = live.grow(job_id, 2) if kind == "grow" else live.release(job_id, spec="h2")
        acknowledged = response.status_code == 202
        assert acknowledged or response.status_code >= 500, response.text
    except httpx.TransportError:
        # The controller died before answering: at "after-request" by construction (the
        # change is durable, the answer not sent), at a later point when the loop
        # thread got there first. Either way the change was durable.
        acknowledged = False
    live.procs[-1].wait(15)  # it crashed at the point
    assert live.procs[-1].returncode == -signal.SIGKILL, live.logs()
    live.start()
    job = live.idle(job_id, 1)
    expected = 3 if kind == "grow" else 1
    assert len(job["allocation"]) == expected, (acknowledged, job)
    job = live.running(job_id, expected)
    live.check_consistent(job_id)
    # The job still works after the failover: one more change goes through.
    if kind == "grow":
        assert live.release(job_id, task_ids=[2]).status_code == 202
    else:
        assert live.grow(job_id, 1).status_code == 202
    live.idle(job_id, 2)
    live.check_consistent(job_id)


def test_crash_while_grow_pending(resize_live_factory: Any) -> None:
    """An acknowledged grow that waits for slots survives the crash and is placed later."""
    live: LiveCluster = resize_live_factory({"h1": 2, "h2": 2})
    live.start()
    job_id = live.submit(tasks="1,3", alloc={"h1": 1}, resizable=True)
    blocker = live.submit(tasks=3, alloc={"h1": 1, "h2": 2})
    live.running(job_id, 1)
    live.running(blocker, 3)
    response = live.grow(job_id, 1)
    assert response.status_code == 202 and response.json()["phase"] == "GROW_PENDING"
    live.crash()
    live.start()
    assert live.phase(job_id) == "GROW_PENDING"
    live.check_consistent(job_id)
    assert live.call("DELETE", f"/v1/jobs/{blocker}").status_code == 202
    job = live.idle(job_id, 1)
    assert len(job["allocation"]) == 2
    live.check_consistent(job_id)


def test_crash_while_notifying(resize_live_factory: Any) -> None:
    """The notification command is running when the controller dies: the reserved slots
    stay reserved, the notification runs again (a new attempt), the grow commits."""
    live: LiveCluster = resize_live_factory({"h1": 2, "h2": 2})
    live.start()
    job_id = live.submit(
        tasks="1,3",
        alloc={"h1": 1},
        resizable=True,
        notify_cmd='echo "attempt at $(date +%s.%N)"; sleep 0.6; exit 0',
    )
    live.running(job_id, 1)
    assert live.grow(job_id, 2).status_code == 202
    wait_until(lambda: live.phase(job_id) == "GROW_NOTIFYING", 5, "notifying")
    live.crash()
    live.start()
    job = live.job(job_id)
    if job["resize"]["phase"] == "GROW_NOTIFYING":
        assert len(job["held"]) == 3  # the reservation survived the crash
    job = live.idle(job_id, 1)
    assert len(job["allocation"]) == 3
    assert [n["attempt"] for n in job["notifications"] if n["status"] == 0][-1] >= 2
    live.running(job_id, 3)
    live.check_consistent(job_id)


def test_crash_while_tasks_starting(resize_live_factory: Any) -> None:
    """The launch is on its way to a frozen agent (SIGSTOP) when the controller dies;
    the agent then wakes up: the new task runs exactly once."""
    live: LiveCluster = resize_live_factory({"h1": 2, "h2": 2})
    live.start()
    job_id = live.submit(tasks="1,3", alloc={"h1": 1}, resizable=True)
    live.running(job_id, 1)
    agent = _agent_pid(live, "h1")  # the grow prefers the job's host
    os.kill(agent, signal.SIGSTOP)
    try:
        assert live.grow(job_id, 1).status_code == 202
        wait_until(lambda: live.phase(job_id) == "GROW_STARTING", 5, "starting")
        time.sleep(0.2)  # let the launch reach the frozen agent's socket
        live.crash()
    finally:
        os.kill(agent, signal.SIGCONT)
    live.start()
    job = live.idle(job_id, 1)
    assert [t["host"] for t in job["allocation"]] == ["h1", "h1"]
    live.running(job_id, 2)
    live.check_consistent(job_id)


def test_crash_while_tasks_stopping(resize_live_factory: Any) -> None:
    """A released task ignores SIGTERM; the controller dies during the grace period.
    The agent kills the task at the deadline; its slot is freed only after that."""
    live: LiveCluster = resize_live_factory({"h1": 2, "h2": 2}, stop_grace=1.0)
    live.start()
    job_id = live.submit(command=STUBBORN, tasks="1,3", alloc={"h1": 1, "h2": 2}, resizable=True)
    job = live.running(job_id, 3)
    pids = {t["id"]: t["pid"] for t in job["tasks"]}
    begin = time.monotonic()
    assert live.release(job_id, spec="h2").status_code == 202
    wait_until(lambda: live.phase(job_id) == "SHRINK_STOPPING", 5, "stopping")
    live.crash()
    live.start()
    while {t["id"] for t in live.job(job_id)["held"]} & {1, 2}:
        assert time.monotonic() - begin < 15
        time.sleep(0.02)
    assert not alive(pids[1]) and not alive(pids[2])
    assert time.monotonic() - begin >= 0.95
    job = live.idle(job_id, 1)
    assert [t["host"] for t in job["allocation"]] == ["h1"]
    live.check_consistent(job_id)


def test_two_controllers_on_one_state_dir(resize_live_factory: Any) -> None:
    """A second controller fences the first: the first stops (exit 3) and the second
    carries on with the same jobs and tasks."""
    live: LiveCluster = resize_live_factory({"h1": 2, "h2": 2})
    first = live.start()
    job_id = live.submit(tasks="1,3", alloc={"h1": 1}, resizable=True)
    job = live.running(job_id, 1)
    other = free_port()
    live.start(listen_port=other)
    assert first.wait(10) == 3, live.logs()
    assert "fenced" in live.logs() or "epoch" in live.logs()
    second = live.call("GET", f"/v1/jobs/{job_id}", ALICE, port=other)
    assert second.status_code == 200
    assert second.json()["tasks"][0]["pid"] == job["tasks"][0]["pid"]
    live.port = other
    assert live.grow(job_id, 1).status_code == 202
    live.idle(job_id, 1)
    live.check_consistent(job_id)


def test_worker_agent_killed(resize_live_factory: Any) -> None:
    """An agent dies (SIGKILL): its host fails (docs/live-controller.md, "Lost agents
    and failed hosts"): the resizable job loses the tasks there as an involuntary
    shrink, a new agent kills the orphans and the host takes tasks again; an agent that
    dies during a grow's launch sends the grow back to pending; losing task 0's agent
    ends the job (EXIT, host failure)."""
    live: LiveCluster = resize_live_factory({"h1": 2, "h2": 2})
    live.start()
    job_id = live.submit(tasks="1,3", alloc={"h1": 1, "h2": 2}, resizable=True)
    job = live.running(job_id, 3)
    pids = {t["id"]: t["pid"] for t in job["tasks"]}
    os.kill(_agent_pid(live, "h2"), signal.SIGKILL)
    job = live.idle(job_id, 1)
    assert [t["host"] for t in job["allocation"]] == ["h1"] and len(job["held"]) == 1
    states = {t["id"]: (t["state"], t["reason"]) for t in job["tasks"]}
    assert states[1] == states[2] == ("EXITED", "host failure")
    wait_until(lambda: not alive(pids[1]) and not alive(pids[2]), 10, "orphans killed")
    wait_until(lambda: live.cluster()["hosts"]["h2"]["worker"]["ready"], 10, "new agent")
    assert live.cluster()["problems"] == []
    live.check_consistent(job_id)
    # Grow (onto the job's own host first).
    assert live.grow(job_id, 1).status_code == 202
    live.idle(job_id, 2)
    live.check_consistent(job_id)
    # An agent dies while a grow's launch is on its way to it (frozen, then killed):
    # the grow's task failed to start, the grow goes back to pending and is placed
    # again once the new agent is up (new task ids; none started twice).
    frozen = _agent_pid(live, "h2")
    os.kill(frozen, signal.SIGSTOP)
    assert live.grow(job_id, 1).status_code == 202  # h1 is full: it goes to h2
    wait_until(lambda: live.phase(job_id) == "GROW_STARTING", 5, "starting")
    os.kill(frozen, signal.SIGKILL)
    job = live.idle(job_id, 3)
    assert [t["host"] for t in job["allocation"]] == ["h1", "h1", "h2"]
    assert any(t["state"] == "EXITED" and t["reason"] == "host failure" for t in job["tasks"])
    live.check_consistent(job_id)
    # The head task's agent dies: the job ends once its task on h2 is stopped, and
    # nothing stays charged.
    os.kill(_agent_pid(live, "h1"), signal.SIGKILL)
    job = wait_until(lambda: (j := live.job(job_id))["state"] == "EXIT" and j, 10, "EXIT")
    assert job["exit_reason"] == "host failure" and job["held"] == []
    assert live.cluster()["problems"] == []
    wait_until(lambda: not live.task_processes(job_id), 10, "no process of the job left")
