"""The worker agent when it cannot start a thread, and the limits its job processes
get (controllers/live/worker.py; docs/live-controller.md, "Worker agents").

Tasks share the agent's pids budget (a service's ``TasksMax``, the host's
``pid_max``): one user's task that takes it leaves the agent unable to start a thread.
A batch must still be carried out to its end: a launch whose supervisor cannot start
fails (its process killed), a notification that cannot start is reported failed, a
stop whose grace timer cannot start kills at once. And the agent's own raised limit
of open files is not its jobs' (``fd_limits.raise_nofile``).
"""

from __future__ import annotations

import os
import pwd
import resource
import threading
from pathlib import Path
from typing import Any

import pytest

from xce_resize_plugin.controllers.live import fd_limits
from xce_resize_plugin.controllers.live.proc import Account, account_json, pid_alive
from xce_resize_plugin.controllers.live.worker import WorkerAgent, worker_dir
from xce_resize_plugin.testing.live import wait_until


def _owner() -> Account:
    """Who the job's processes run as: ``nobody`` under root, else the test's user."""
    if os.geteuid() == 0:
        return Account.named(pwd.getpwuid(65534).pw_name)
    return Account.of_uid(os.geteuid())


def _launch(tmp_path: Path, task: int, script: str) -> dict[str, Any]:
    launch: dict[str, Any] = {"op": "launch", "job": "7", "task": task, "cwd": "/"}
    launch |= {"argv": ["/bin/sh", "-c", script], "user": account_json(_owner())}
    launch |= {"env": {"PATH": os.defpath, "XCE_JOB_ID": "7", "XCE_TASK_ID": str(task)}}
    launch |= {"stdout": str(tmp_path / f"o{task}"), "stderr": str(tmp_path / f"e{task}")}
    return launch


def _notify(tmp_path: Path, command: str) -> dict[str, Any]:
    notify = {"op": "notify", "job": "7", "attempt": 1, "command": command, "timeout": 20}
    notify |= {"env": {"PATH": os.defpath}, "cwd": "/", "user": account_json(_owner())}
    return notify | {"log": str(tmp_path / "notify-1.log")}


def _event(agent: WorkerAgent, kind: str, **fields: Any) -> dict[str, Any] | None:
    for e in agent.events:
        if e["kind"] == kind and all(e.get(k) == v for k, v in fields.items()):
            return e
    return None


def _agent(tmp_path: Path) -> WorkerAgent:
    state = tmp_path / "state"
    worker_dir(state, "h1").mkdir(parents=True)
    return WorkerAgent("h1", state)


@pytest.mark.parametrize("failing", ["launch", "notify", "stop"])
def test_a_thread_that_cannot_start_fails_its_command_not_the_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failing: str
) -> None:
    agent = _agent(tmp_path)
    # Task 1 ignores SIGTERM: its stop (grace 60 s) ends at once only by a SIGKILL.
    agent.execute(0, agent.instance, [_launch(tmp_path, 1, 'trap "" TERM; exec sleep 60')])
    stopped = agent.tasks[("7", 1)]
    assert stopped.pid is not None
    wait_until(lambda: Path(f"/proc/{stopped.pid}/comm").read_text() == "sleep\n", 15, "exec")
    batch = [_launch(tmp_path, 0, "exec sleep 60"), _notify(tmp_path, "echo hi")]
    batch.append({"op": "stop", "job": "7", "task": 1, "grace": 60.0})
    starts: list[str] = []
    real_start = threading.Thread.start
    me = threading.current_thread()

    def start(thread: threading.Thread) -> None:
        if threading.current_thread() is me:  # the batch's own starts, in its order
            starts.append(thread.name)
            if len(starts) == ["launch", "notify", "stop"].index(failing) + 1:
                raise RuntimeError("can't start new thread")
        real_start(thread)

    monkeypatch.setattr(threading.Thread, "start", start)
    try:
        agent.execute(0, agent.instance, batch)
        monkeypatch.undo()
        launched = agent.tasks[("7", 0)]
        if failing == "launch":
            failed = _event(agent, "start_failed", task=0)
            assert failed is not None and "can't start new thread" in failed["reason"]
            assert _event(agent, "started", task=0) is None
            assert launched.pid is not None and not pid_alive(launched.pid)
        else:
            assert launched.state == "running" and _event(agent, "started", task=0)
        done = wait_until(lambda: _event(agent, "notify_done"), 20, "notify_done")
        if failing == "notify":
            assert done["status"] is None and done["reason"].startswith("cannot run: ")
        else:
            assert (done["status"], done["stdout"]) == (0, "hi\n")
        if failing == "stop":
            wait_until(lambda: stopped.state == "exited", 20, "the killed task's end")
            assert stopped.reason == "SIGKILL after grace"
        else:
            assert stopped.state == "stopping"
    finally:
        monkeypatch.undo()
        agent.shutdown(0.0)


def test_job_processes_get_the_limit_of_open_files_the_agent_had(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    low = 512
    if hard != resource.RLIM_INFINITY and hard <= low:
        pytest.skip("the hard limit of open files leaves nothing to raise")
    resource.setrlimit(resource.RLIMIT_NOFILE, (low, hard))
    monkeypatch.delenv(fd_limits.NOFILE_BEFORE_ENV, raising=False)
    agent = _agent(tmp_path)
    try:
        # As the controller does at start; the agent it starts inherits the raised
        # limit and the environment.
        assert fd_limits.raise_nofile() > low
        batch = [_launch(tmp_path, 0, "ulimit -Sn; exec sleep 60"), _notify(tmp_path, "ulimit -Sn")]
        agent.execute(0, agent.instance, batch)
        task = agent.tasks[("7", 0)]
        out = tmp_path / "o0"
        wait_until(lambda: out.read_text() == f"{low}\n", 15, "the task's limit")
        limits = Path(f"/proc/{task.pid}/limits").read_text().splitlines()
        line = next(x for x in limits if x.startswith("Max open files"))
        assert line.split()[3] == str(low), line
        done = wait_until(lambda: _event(agent, "notify_done"), 20, "notify_done")
        assert done["stdout"] == f"{low}\n"
        assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] > low, "the agent's own was lowered"
    finally:
        agent.shutdown(0.0)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
