"""The worker agent's scans of ``/proc`` never hold up its answers
(controllers/live/worker.py, docs/performance.md "The worker agent and many processes").

A scan costs a read per process on the host, and any user chooses how many there are
(8,000 sleeping processes made a scan last a second): a batch of K stops scanned K
times while it held the lock that the controller's snapshot and long poll wait for,
and an agent silent for ``agent_timeout`` has its host failed with every other user's
job on it. Here a scan is made slow on purpose; a batch of stops takes one, outside
the lock, and the snapshot, the long poll and the tracker's records never wait for it.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from xce_resize_plugin.controllers.live import worker
from xce_resize_plugin.controllers.live.proc import (
    Account,
    ProcessTable,
    account_json,
    pid_alive,
)
from xce_resize_plugin.controllers.live.worker import WorkerAgent, worker_dir
from xce_resize_plugin.testing.live import wait_until

SLOW = 0.4
TASKS = 5


def _launch(tmp_path: Path, task: int) -> dict[str, Any]:
    launch: dict[str, Any] = {"op": "launch", "job": "7", "task": task}
    launch |= {"argv": ["sleep", "60"], "cwd": str(tmp_path)}
    launch |= {"env": {"PATH": os.defpath, "XCE_JOB_ID": "7", "XCE_TASK_ID": str(task)}}
    launch |= {"stdout": str(tmp_path / f"o{task}"), "stderr": str(tmp_path / f"e{task}")}
    launch["user"] = account_json(Account.of_uid(os.geteuid()))
    return launch


class SlowTable(ProcessTable):
    """A scan of a host that runs many processes."""

    #: The threads that scanned, one entry a scan.
    by: list[str] = []

    def __init__(self) -> None:
        type(self).by.append(threading.current_thread().name)
        time.sleep(SLOW)
        super().__init__()


def test_a_batch_of_stops_scans_once_and_outside_the_lock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = tmp_path / "state"
    worker_dir(state, "h1").mkdir(parents=True)
    agent = WorkerAgent("h1", state)
    agent.execute(0, agent.instance, [_launch(tmp_path, i) for i in range(TASKS)])
    try:
        monkeypatch.setattr(worker, "ProcessTable", SlowTable)
        stops = [{"op": "stop", "job": "7", "task": i, "grace": 5.0} for i in range(TASKS)]
        args = (0, agent.instance, stops)
        batch = threading.Thread(target=agent.execute, args=args, name="batch")
        batch.start()
        time.sleep(SLOW / 4)  # the batch is scanning
        waited: list[float] = []
        while batch.is_alive():
            begin = time.monotonic()
            agent.snapshot(0)
            agent.wait_events(10**9, 0.0, 0)
            waited.append(time.monotonic() - begin)
            time.sleep(0.02)
        batch.join()
        # One scan for the batch, not one per stop (the tasks' supervisors scan on
        # their own once their processes exit).
        assert SlowTable.by.count("batch") == 1, SlowTable.by
        assert max(waited) < SLOW / 2, f"the snapshot waited {max(waited):.2f}s for a scan"
        # The tracker's pass scans before it takes the lock as well.
        tracker = threading.Thread(target=agent.track)
        tracker.start()
        time.sleep(SLOW / 4)
        begin = time.monotonic()
        with agent._lock:
            pass
        assert time.monotonic() - begin < SLOW / 2, "the tracker held the lock while it scanned"
        tracker.join()
        assert all(agent.tasks[("7", i)].state in ("stopping", "exited") for i in range(TASKS))
    finally:
        monkeypatch.undo()
        for t in agent.tasks.values():
            if t.timer is not None:
                t.timer.cancel()
        agent.shutdown(0.0)


def test_a_stop_in_the_batch_that_launched_the_task_stops_it(tmp_path: Path) -> None:
    """The batch's scan is taken before its launches: a task launched and stopped in
    one batch is not in it, and is stopped all the same (by its process group)."""
    state = tmp_path / "state"
    worker_dir(state, "h1").mkdir(parents=True)
    agent = WorkerAgent("h1", state)
    launch = _launch(tmp_path, 0) | {"argv": ["/bin/sh", "-c", 'trap "" TERM; sleep 60 & wait']}
    stop = {"op": "stop", "job": "7", "task": 0, "grace": 0.0}
    try:
        agent.execute(0, agent.instance, [launch, stop])
        task = agent.tasks[("7", 0)]
        assert task.killed
        members = list(task.members)
        wait_until(lambda: task.state == "exited", 20, "the task's end")
        assert not any(pid_alive(pid) for pid in members), "a process of the task survives"
    finally:
        agent.shutdown(0.0)


def test_a_tables_groups_and_children_are_what_a_walk_finds() -> None:
    """The indexes that make a task's processes cost what the task has."""
    table = ProcessTable()
    for pgid in {p.pgid for p in table.procs.values()}:
        walked = [p.pid for p in table.procs.values() if p.pgid == pgid and not p.zombie]
        assert sorted(table.group(pgid)) == sorted(walked)
    me = os.getpid()
    assert sorted(table.children.get(me, [])) == sorted(
        p.pid for p in table.procs.values() if p.ppid == me
    )
