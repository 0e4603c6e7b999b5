"""The worker agent signals only a task's own processes, even once a pid of the task is
free again (controllers/live/worker.py, docs/live-controller.md "Process containment").

A task's process group has the id of its leader's pid. Once no process has that pid
(the leader reaped) or that group, the kernel gives the pid to the next new process;
one that then leads a group of its own (a session leader: another job's task, a login
shell) has a group with that id, and must not be taken for the task's. These tests give
the freed pid to such a process through ``/proc/sys/kernel/ns_last_pid`` (root only), as
a job's process that cycles pids while it holds its task's end open would.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from xce_resize_plugin.controllers.live.proc import (
    Account,
    ProcessTable,
    account_json,
    pid_alive,
    start_ticks,
)
from xce_resize_plugin.controllers.live.worker import WorkerAgent, worker_dir
from xce_resize_plugin.testing.live import wait_until

NS_LAST_PID = Path("/proc/sys/kernel/ns_last_pid")

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not NS_LAST_PID.exists(), reason="choosing a pid needs root"
)


def _group_leader_with_pid(pid: int) -> subprocess.Popen[bytes] | None:
    """A new process in a session (and group) of its own, given ``pid`` if that pid is
    free; ``None`` when it is not free (the kernel gives it to nobody)."""
    for _ in range(50):
        if Path(f"/proc/{pid}").exists():
            return None
        NS_LAST_PID.write_text(str(pid - 1))
        proc = subprocess.Popen(["sleep", "60"], start_new_session=True)
        if proc.pid == pid:
            return proc
        proc.kill()  # another process took the pid first: again
        proc.wait()
    return None


def _kill(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def test_a_new_group_with_an_ended_leaders_pid_is_not_the_tasks(tmp_path: Path) -> None:
    """Task 0's leader exits, leaving a process in a session of its own that ignores
    SIGTERM, so the task's end lasts its cleanup grace. Meanwhile a new process leads a
    group whose id is the leader's pid: the agent must not stop it with the task."""
    state = tmp_path / "state"
    worker_dir(state, "h1").mkdir(parents=True)
    agent = WorkerAgent("h1", state)
    left, go = tmp_path / "left", tmp_path / "go"
    script = (
        f"setsid sh -c 'trap \"\" TERM; echo $$ > {left}; exec sleep 60' & "
        f"while [ ! -e {go} ]; do sleep 0.02; done"
    )
    launch = {"op": "launch", "job": "7", "task": 0, "argv": ["/bin/sh", "-c", script]}
    launch |= {"env": {"PATH": os.defpath, "XCE_JOB_ID": "7", "XCE_TASK_ID": "0"}}
    launch |= {"cwd": str(tmp_path), "stdout": str(tmp_path / "o"), "stderr": str(tmp_path / "e")}
    launch["user"] = account_json(Account.of_uid(os.geteuid()))
    agent.execute(0, agent.instance, [launch])
    leader = agent.tasks[("7", 0)].pid
    assert leader is not None
    pids = [leader]
    victim = None
    try:
        pids.append(int(wait_until(lambda: left.exists() and left.read_text().strip(), 15, "")))
        agent.track()  # the leftover is known to be the task's
        go.touch()
        wait_until(lambda: not pid_alive(leader), 15, "the leader's exit")
        victim = _group_leader_with_pid(leader)
        if victim is not None:
            pids.append(victim.pid)
        wait_until(lambda: any(e["kind"] == "exited" for e in agent.events), 30, "exited")
        assert not pid_alive(pids[1]), "the task's leftover survives"
        if victim is not None:
            assert victim.poll() is None, "the agent killed a process that is not the task's"
    finally:
        agent.closing = True
        _kill(pids)
        if victim is not None:
            victim.wait()


def test_a_restarted_agent_leaves_a_new_group_with_a_dead_leaders_pid(tmp_path: Path) -> None:
    """A dead agent's task leader exited meanwhile (its new parent reaped it), and its
    pid now leads another process's group: the next agent must not kill that group when
    it kills what its predecessor left (``tasks.json``)."""
    for _ in range(20):  # another process may take the freed pid first: another one
        gone = subprocess.Popen(["true"])
        gone.wait()
        victim = _group_leader_with_pid(gone.pid)
        if victim is not None:
            break
    else:
        pytest.fail("no freed pid could be given to a new group leader")
    state = tmp_path / "state"
    wdir = worker_dir(state, "h1")
    wdir.mkdir(parents=True)
    entry = {"job": "7", "task": 0, "pid": gone.pid, "ticks": 1, "members": []}
    (wdir / "tasks.json").write_text(json.dumps([entry]))
    try:
        WorkerAgent("h1", state).kill_orphans()
        assert victim.poll() is None, "the agent killed a process that is not the task's"
    finally:
        _kill([victim.pid])
        victim.wait()


@pytest.mark.parametrize("leader_ends", [False, True])
def test_a_restarted_agent_kills_the_group_a_dead_agents_task_left(
    tmp_path: Path, leader_ends: bool
) -> None:
    """What a dead agent's task left in its process group, not its leader's child any
    more, is killed: by the group's id while its leader runs, and by the task's marks
    in the environment once the leader is gone."""
    marks = {"PATH": os.defpath, "XCE_JOB_ID": "7", "XCE_TASK_ID": "0", "XCE_HOSTNAME": "h1"}
    script = "(sleep 60 &); " + ("exit 0" if leader_ends else "exec sleep 60")
    leader = subprocess.Popen(["/bin/sh", "-c", script], env=marks, start_new_session=True)
    pids = [leader.pid]
    try:
        ticks = wait_until(lambda: start_ticks(leader.pid), 15, "the leader's start")
        members = wait_until(
            lambda: [p for p in ProcessTable().group(leader.pid) if p != leader.pid], 15, ""
        )
        pids += members
        if leader_ends:
            leader.wait()
        state = tmp_path / "state"
        wdir = worker_dir(state, "h1")
        wdir.mkdir(parents=True)
        entry = {"job": "7", "task": 0, "pid": leader.pid, "ticks": ticks, "members": []}
        (wdir / "tasks.json").write_text(json.dumps([entry]))
        assert WorkerAgent("h1", state).kill_orphans() == 1
        assert not any(pid_alive(pid) for pid in pids)
    finally:
        _kill(pids)
        leader.wait()


@pytest.mark.parametrize(("launched_for", "killed"), [("h1", True), ("h2", False)])
def test_a_restarted_agent_kills_by_its_intents_only_its_own_hosts_tasks(
    tmp_path: Path, launched_for: str, killed: bool
) -> None:
    """A dead agent's launch intent (no pid yet) names a job and task; the process
    with those marks is killed only when it was launched for this agent's host. Every
    agent of the machine sees every process: job 7's task 3, requeued to h2, was killed
    by h1's agent restarting with a stale intent for it."""
    marks = {"PATH": os.defpath, "XCE_JOB_ID": "7", "XCE_TASK_ID": "3"}
    task = subprocess.Popen(["sleep", "60"], env={**marks, "XCE_HOSTNAME": launched_for})
    try:
        state = tmp_path / "state"
        wdir = worker_dir(state, "h1")
        wdir.mkdir(parents=True)
        (wdir / "tasks.json").write_text(json.dumps([{"job": "7", "task": 3, "pid": None}]))
        WorkerAgent("h1", state).kill_orphans()
        if killed:
            assert task.wait(timeout=10) == -signal.SIGKILL
        else:
            assert task.poll() is None, "h1's agent killed a task of h2"
    finally:
        _kill([task.pid])
        task.wait()
