"""Process containment by the worker agent: a task is every process it started, even
one that left its session (``setsid``) or whose parent exited; stopping the task, or
its own end, stops them all before the task is reported gone (docs/live-controller.md,
"Process containment"): with the ``/proc`` tracking alone, and with a cgroup per task
where this machine lets the agent make them (the default, ``auto``)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from xce_resize_plugin.testing.live import LiveCluster, alive, wait_until


@pytest.fixture(params=["proc", "auto"])
def worker_toml(request: pytest.FixtureRequest) -> str:
    """The agents' ``[worker]`` section: each way of containing tasks."""
    return f'[worker]\ncontainment = "{request.param}"\n'


def _pid_in(path: Path) -> int:
    """The pid a task wrote to ``path`` (waits for it)."""
    text = wait_until(lambda: path.exists() and path.read_text().strip(), 15, f"pid in {path}")
    return int(text)


def _kill(pids: list[int]) -> None:
    """The test's own clean-up, by pid, whatever the outcome."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_killing_a_job_kills_what_its_task_started_in_another_session(
    resize_live_factory: Any, tmp_path: Path, worker_toml: str
) -> None:
    """A task's child that called setsid is in neither the task's session nor its
    process group; killing the job still kills it, before the job is reported ended."""
    live: LiveCluster = resize_live_factory({"h1": 1}, limits=worker_toml)
    live.start()
    pidfile = tmp_path / "escaped.pid"
    script = f'setsid sleep 1000 & echo $! > "{pidfile}"; exec sleep 600'
    job_id = live.submit(command=["/bin/sh", "-c", script], tasks=1)
    escaped: list[int] = []
    try:
        live.running(job_id, 1)
        escaped.append(_pid_in(pidfile))
        assert alive(escaped[0])
        assert os.getsid(escaped[0]) == escaped[0]  # it did leave the task's session
        assert live.call("DELETE", f"/v1/jobs/{job_id}").status_code == 202
        job = wait_until(lambda: (j := live.job(job_id))["state"] == "EXIT" and j, 15, "EXIT")
        assert job["held"] == []
        assert not alive(escaped[0]), "a process of the killed job survives"
    finally:
        _kill(escaped)


def test_a_task_that_exits_leaves_nothing_behind(
    resize_live_factory: Any, tmp_path: Path, worker_toml: str
) -> None:
    """Task 0 exits 0 after starting a process in a new session, and another that left
    even the task's environment; the agent (their subreaper) stops both before the job
    is DONE."""
    live: LiveCluster = resize_live_factory({"h1": 1}, limits=worker_toml)
    live.start()
    first, second = tmp_path / "first.pid", tmp_path / "second.pid"
    script = (
        f'setsid sleep 1000 & echo $! > "{first}"; '
        # A double fork whose middle process exits at once, with an empty environment.
        f'(env -i setsid sleep 1001 & echo $! > "{second}") ; '
        f'while [ ! -s "{second}" ]; do sleep 0.01; done; exit 0'
    )
    job_id = live.submit(command=["/bin/sh", "-c", script], tasks=1)
    escaped: list[int] = []
    try:
        escaped += [_pid_in(first), _pid_in(second)]
        job = wait_until(lambda: (j := live.job(job_id))["state"] != "RUN" and j, 20, "job end")
        assert job["state"] == "DONE", job
        assert [p for p in escaped if alive(p)] == [], "processes of the ended job survive"
    finally:
        _kill(escaped)


def test_a_new_agent_kills_what_a_dead_one_knew_of(
    resize_live_factory: Any, tmp_path: Path, worker_toml: str
) -> None:
    """The agent dies (SIGKILL) while its task has a process in another session: the
    agent's successor kills it too (the processes each task had are in tasks.json)."""
    live: LiveCluster = resize_live_factory({"h1": 1, "h2": 1}, limits=worker_toml)
    live.start()
    pidfile = tmp_path / "escaped.pid"
    script = (
        f'if [ "$XCE_TASK_ID" = 1 ]; then setsid sleep 1000 & echo $! > "{pidfile}"; fi; '
        "exec sleep 600"
    )
    job_id = live.submit(command=["/bin/sh", "-c", script], tasks=2, ptile=1)
    escaped: list[int] = []
    try:
        live.running(job_id, 2)
        escaped.append(_pid_in(pidfile))
        tasks_json = live.state / "workers" / "h2" / "tasks.json"
        wait_until(lambda: str(escaped[0]) in tasks_json.read_text(), 15, "the process recorded")
        agent = int(live.cluster()["hosts"]["h2"]["worker"]["pid"])
        os.kill(agent, signal.SIGKILL)
        wait_until(lambda: not alive(escaped[0]), 20, "the dead agent's task process killed")
        # A rigid job does not survive its host's failure.
        job = wait_until(lambda: (j := live.job(job_id))["state"] == "EXIT" and j, 15, "EXIT")
        assert job["exit_reason"] == "host failure"
        assert job["tasks"][1]["reason"] == "host failure"
    finally:
        _kill(escaped)


def test_a_new_agent_kills_a_task_started_just_before_its_predecessor_died(
    tmp_path: Path,
) -> None:
    """An agent killed after it started a task's process but before it recorded the
    pid leaves the launch as an intent in tasks.json; its successor finds the process
    by the marks in its environment and kills it (the soak test found such orphans)."""
    import subprocess
    import sys

    from xce_resize_plugin.controllers.live.proc import Account, account_json
    from xce_resize_plugin.controllers.live.worker import WorkerAgent, worker_dir

    state = tmp_path / "state"
    worker_dir(state, "h1").mkdir(parents=True)
    marks = {"XCE_JOB_ID": "7", "XCE_TASK_ID": "3", "XCE_HOSTNAME": "h1"}
    launch = {"op": "launch", "job": "7", "task": 3, "argv": ["sleep", "600"]}
    launch |= {"env": {**os.environ, **marks}, "cwd": str(tmp_path)}
    launch |= {"stdout": str(tmp_path / "o"), "stderr": str(tmp_path / "e")}
    launch["user"] = account_json(Account.of_uid(os.geteuid()))
    # The dying agent: its launch is written as an intent, then the process starts,
    # then the agent dies before anything else (here: the child exits at the spawn).
    dying = (
        "import os, sys, json\n"
        "from pathlib import Path\n"
        "from xce_resize_plugin.controllers.live.worker import WorkerAgent\n"
        f"agent = WorkerAgent('h1', Path({str(state)!r}))\n"
        "real = agent.spawn\n"
        "def spawn(argv, **kw):\n"
        "    p = real(argv, **kw)\n"
        "    print(p.pid, flush=True)\n"
        "    os._exit(9)\n"
        "agent.spawn = spawn\n"
        f"agent.execute(0, agent.instance, [json.loads({json.dumps(json.dumps(launch))})])\n"
    )
    out = subprocess.run([sys.executable, "-c", dying], capture_output=True, text=True, timeout=60)
    assert out.returncode == 9, out.stderr
    orphan = int(out.stdout.split()[0])
    try:
        assert alive(orphan)
        assert '"pid": null' in (worker_dir(state, "h1") / "tasks.json").read_text()
        assert WorkerAgent("h1", state).kill_orphans() == 1
        wait_until(lambda: not alive(orphan), 10, "the orphan killed")
    finally:
        _kill([orphan])
