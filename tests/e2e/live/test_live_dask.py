"""Dask on a resizable job (docs/frameworks.md, "Dask"): an :class:`XCECluster` in this
process stands for task 0's program (it is given the job's environment), the job's
other tasks run the real ``xce-dask-worker`` under the live controller's agents.

- ``scale()`` sets the job's target, the job grows, and the workers register under
  their task ids;
- an outside ``bresize release --grace 30`` (the owner's command) takes two workers in
  the middle of a computation over persisted and scattered data: the cluster retires
  them on the ``release_coming`` event and acknowledges the drain, so the tasks stop
  before the deadline; nothing is recomputed, no future is lost, the result is right;
- with a cluster that does not follow the events, ``xce-dask-worker`` drains itself on
  the ``release_coming`` naming its task;
- ``scale()`` down retires the chosen workers (data moved) before it names exactly
  those tasks for release in the job's target.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow  # real Dask workers start in seconds each: ~1 min in all
distributed = pytest.importorskip("distributed")
import dask  # noqa: E402
import dask.array as da  # noqa: E402
import numpy as np  # noqa: E402

from tests.e2e.live.test_live_clients import cli  # noqa: E402
from xce_resize_plugin.injob import ResizeClient  # noqa: E402
from xce_resize_plugin.integrations.dask import RETIRE_STIMULUS, SCHEDULER_KEY, XCECluster  # noqa: E402
from xce_resize_plugin.integrations.dask.retire import NOTIFY_STIMULUS  # noqa: E402
from xce_resize_plugin.integrations.dask.sizing import RETRY  # noqa: E402
from xce_resize_plugin.rest.client import RemoteError  # noqa: E402
from xce_resize_plugin.testing.live import ALICE, LiveCluster, wait_until  # noqa: E402

#: Task 0 sleeps (this test process plays its program); every other task is a worker.
DASK_JOB = [
    "/bin/sh",
    "-c",
    'if [ "$XCE_TASK_ID" = 0 ]; then exec sleep 600; fi; '
    'exec "$0" -m xce_resize_plugin.integrations.dask.worker --nthreads 2',
    sys.executable,
]
#: Short: the data moves during a release's drain time (or before the cluster's own
#: releases), not between SIGTERM and SIGKILL.
STOP_GRACE = 1.0
#: The drain time of the outside release: far longer than moving the data takes.
DRAIN = 30.0


def job_env(live: LiveCluster, answer: dict[str, Any]) -> dict[str, str]:
    """The environment the job's task 0 has, as far as XCECluster reads it."""
    return {
        "XCE_JOB_ID": str(answer["id"]),
        "XCE_JOB_TOKEN": str(answer["token"]),
        "XCE_CONTROLLER_URL": live.url(),
        "XCE_HEAD_ADDR": "127.0.0.1",
        "XCE_TASK_ID": "0",
    }


@pytest.fixture(autouse=True)
def scratch(tmp_path: Path) -> Iterator[None]:
    """The scheduler in this process keeps its scratch directory in the test's own
    directory, not a ``dask-scratch-space`` left in the machine's ``/tmp``."""
    with dask.config.set({"temporary-directory": str(tmp_path / "scheduler")}):
        yield


def _running_dask_job(live: LiveCluster, tasks: str) -> dict[str, Any]:
    """Start ``live`` and a resizable Dask job of ``tasks`` on it, running on one task."""
    live.start()
    answer: dict[str, Any] = live.ok(
        "POST",
        "/v1/jobs",
        ALICE,
        {"command": DASK_JOB, "tasks": tasks, "resizable": True, "initial": 1},
    )
    live.running(answer["id"], 1)
    return answer


@pytest.fixture
def dask_job(resize_live_factory: Any) -> Iterator[tuple[LiveCluster, XCECluster, str]]:
    live: LiveCluster = resize_live_factory({"h1": 3, "h2": 3}, stop_grace=STOP_GRACE)
    answer = _running_dask_job(live, "1,6")
    cluster = XCECluster(environ=job_env(live, answer))
    try:
        yield live, cluster, str(answer["id"])
    finally:
        cluster.close()


def worker_names(cluster: XCECluster) -> set[str]:
    return {str(w["name"]) for w in cluster.scheduler_info["workers"].values()}


def allocation_workers(live: LiveCluster, job_id: str) -> set[str]:
    return {str(t["id"]) for t in live.job(job_id)["allocation"] if t["id"] != 0}


def going(live: LiveCluster, job_id: str, workers: int = 4) -> set[str]:
    """The tasks a release in flight stops, or that a finished one took (of the
    ``workers`` tasks 1, 2, ...)."""
    in_flight = live.ok("GET", f"/v1/jobs/{job_id}/resize", ALICE)["in_flight"]
    if in_flight is not None and in_flight["kind"] == "shrink":
        return {str(t["id"]) for t in in_flight["tasks"]}
    return {str(t) for t in range(1, workers + 1)} - allocation_workers(live, job_id)


def target(live: LiveCluster, job_id: str) -> Any:
    """The job's target as its resize status shows it (``None``: none)."""
    return live.ok("GET", f"/v1/jobs/{job_id}/resize", ALICE)["target"]


def events(live: LiveCluster, job_id: str) -> list[dict[str, Any]]:
    """The job's events so far."""
    found: list[dict[str, Any]] = live.ok(
        "GET", f"/v1/jobs/{job_id}/events?after=0&timeout=0", ALICE
    )
    return found


def release_one_drained(
    live: LiveCluster, cluster: XCECluster, client: Any, job_id: str
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Hold data on the workers, release the last worker's task from outside with a
    drain time, and see the data survive and the task leave the allocation: the
    ``release_coming`` event and the task's ``tasks_exited``."""
    data = client.scatter([[j] * 100 for j in range(30)])
    name = sorted(worker_names(cluster))[-1]
    body = {"task_ids": [int(name)], "grace": DRAIN}
    live.ok("POST", f"/v1/jobs/{job_id}/resize/release", ALICE, body)
    wait_until(lambda: name not in allocation_workers(live, job_id), 60, "stopped")
    assert client.gather(data) == [[j] * 100 for j in range(30)]
    seen = events(live, job_id)
    coming = [e for e in seen if e["type"] == "release_coming"]
    exited = [e for e in seen if e["type"] == "tasks_exited" and int(name) in e["task_ids"]]
    assert [e["task_ids"] for e in coming] == [[int(name)]] and exited, seen
    return coming[0], exited[0]


def hold_data(client: Any, log: Path, size: int) -> tuple[Any, list[Any], list[Any]]:
    """The data a release must not lose: an array of 64 chunks of ``size`` integers,
    persisted (each chunk's computation appends its index to ``log``: see
    :func:`counted`), and 18 such arrays scattered; the array, its chunks' futures and
    the scattered futures."""
    log.touch()

    def chunk(i: int) -> Any:  # nested: shipped to the workers by value
        with open(log, "a") as fh:
            fh.write(f"{i}\n")
        return np.full(size, i)

    parts = [
        da.from_delayed(dask.delayed(chunk, pure=False)(i), shape=(size,), dtype=int)
        for i in range(64)
    ]
    array = client.persist(da.concatenate(parts))
    chunks = distributed.futures_of(array)
    distributed.wait(chunks)
    return array, chunks, client.scatter([np.full(size, j) for j in range(18)])


def counted(log: Path) -> dict[int, int]:
    """Chunk index -> how many times it was computed (each computation appends a line)."""
    counts: dict[int, int] = {}
    for line in log.read_text().split():
        counts[int(line)] = counts.get(int(line), 0) + 1
    return counts


def test_scale_grows_and_the_workers_register_by_task_id(
    dask_job: tuple[LiveCluster, XCECluster, str],
) -> None:
    live, cluster, job_id = dask_job
    assert cluster.scheduler is not None
    stored = live.ok("GET", f"/v1/jobs/{job_id}/kv/{SCHEDULER_KEY}", ALICE)["value"]
    assert stored == cluster.scheduler_address and stored.startswith("tcp://127.0.0.1:")
    for bad in (lambda: cluster.scale(6), lambda: cluster.adapt(minimum=2, maximum=6)):
        with pytest.raises(ValueError, match="this job has 0 to 5 workers"):
            bad()
    assert cluster.allocation.size == 1 and cluster._adaptive is None  # nothing changed
    cluster.scale(3)
    assert target(live, job_id)["tasks"] == 4  # the job's target, in its status
    assert [kind for _, kind, _ in cluster.resize_log] == ["grow"]
    cluster.wait_for_workers(3, timeout=60)
    alloc = cluster.wait_for_allocation(60)
    assert alloc.size == 4 and alloc.target is not None and alloc.target["tasks"] == 4
    wait_until(lambda: worker_names(cluster) == allocation_workers(live, job_id), 30, "names")
    assert worker_names(cluster) == {"1", "2", "3"}
    # Each worker's local directory is the job's scratch directory.
    scratch = live.state / "jobs" / job_id / "scratch"
    dirs = {w["local_directory"] for w in cluster.scheduler_info["workers"].values()}
    assert all(str(d).startswith(str(scratch)) for d in dirs), dirs
    # Closing the cluster gives the workers' tasks back: task 0 alone again.
    cluster.close()
    wait_until(lambda: not allocation_workers(live, job_id), 30, "the workers released")
    assert live.job(job_id)["state"] == "RUN"


def listening() -> set[int]:
    """The TCP ports this process listens on."""
    import psutil

    return {
        c.laddr.port
        for c in psutil.Process().net_connections(kind="tcp")
        if c.status == psutil.CONN_LISTEN
    }


def test_the_scheduler_serves_no_http_unless_asked(resize_live_factory: Any) -> None:
    """Distributed's scheduler serves its HTTP pages (the workers, ``/metrics``,
    ``/health``) to anyone without authentication: the cluster's scheduler listens on
    its own port alone, unless a ``dashboard_address`` (or ``dashboard=True``) asks."""
    import httpx

    live: LiveCluster = resize_live_factory({"h1": 1})
    live.start()
    answer = live.ok(
        "POST", "/v1/jobs", ALICE, {"command": DASK_JOB, "tasks": "1,1", "resizable": True}
    )
    live.running(answer["id"], 1)
    before = listening()
    with XCECluster(environ=job_env(live, answer)) as cluster:
        assert cluster.scheduler is not None
        assert listening() - before == {cluster.scheduler.port}
        assert "dashboard" not in cluster.scheduler_info["services"]
        assert cluster.dashboard_link == ""
    options = {"dashboard_address": "127.0.0.1:0"}
    with XCECluster(environ=job_env(live, answer), scheduler_options=options) as cluster:
        port = cluster.scheduler_info["services"]["dashboard"]
        assert cluster.scheduler is not None
        assert listening() - before == {cluster.scheduler.port, port}
        assert httpx.get(f"http://127.0.0.1:{port}/health", timeout=10).text == "ok"


def test_a_number_of_workers_not_an_int_is_refused_at_once(resize_live_factory: Any) -> None:
    """``scale(2.5)`` (or ``True``, or ``adapt`` with such bounds) is a ValueError at
    once, as an ``n`` out of range is: nothing reaches the controller, nothing changes."""
    live: LiveCluster = resize_live_factory({"h1": 4})
    answer = _running_dask_job(live, "1,4")
    with XCECluster(environ=job_env(live, answer)) as cluster:
        start = time.monotonic()
        for bad in (
            lambda: cluster.scale(2.5),  # type: ignore[arg-type]
            lambda: cluster.scale(True),
            lambda: cluster.adapt(minimum=0.5),
            lambda: cluster.adapt(minimum=1, maximum=2.0),
        ):
            with pytest.raises(ValueError, match="a number of workers is an int, not"):
                bad()
        assert time.monotonic() - start < 1.0
        assert target(live, answer["id"]) is None and cluster._adaptive is None
    assert live.job(answer["id"])["version"] == 0


def test_a_worker_whose_scheduler_is_gone_ends(resize_live_factory: Any, tmp_path: Path) -> None:
    """A task started after the cluster closed exits at once (``close()`` empties the
    scheduler's key); one whose scheduler cannot be reached (crashed) exits 1 after
    ``--connect-wait``; SIGTERM while it tries stops it at once, exit 0 (it held
    nothing). Real ``xce-dask-worker`` processes against the live controller."""
    live: LiveCluster = resize_live_factory({"h1": 2})
    live.start()
    body = {"command": ["sleep", "600"], "tasks": "1,2", "resizable": True, "initial": 1}
    answer = live.ok("POST", "/v1/jobs", ALICE, body)
    live.running(answer["id"], 1)
    with XCECluster(environ=job_env(live, answer)):
        pass
    key = f"/v1/jobs/{answer['id']}/kv/{SCHEDULER_KEY}"
    assert live.ok("GET", key, ALICE)["value"] == ""
    env = {**os.environ, **job_env(live, answer), "XCE_TASK_ID": "1", "XCE_JOB_DIR": str(tmp_path)}
    worker = [sys.executable, "-m", "xce_resize_plugin.integrations.dask.worker", "--wait", "30"]
    start = time.monotonic()
    ended = subprocess.run(worker, env=env, capture_output=True, text=True, timeout=60)
    assert ended.returncode == 1 and "the job's Dask cluster has closed" in ended.stderr
    assert time.monotonic() - start < 20, ended.stderr  # not the --wait
    live.ok("PUT", key, ALICE, {"value": "tcp://127.0.0.1:1"})  # a scheduler that crashed
    ended = subprocess.run(
        [*worker, "--connect-wait", "2"], env=env, capture_output=True, text=True, timeout=60
    )
    message = "did not accept this worker within 2 s (--connect-wait)"
    assert ended.returncode == 1 and message in ended.stderr.splitlines()[-1], ended.stderr
    proc = subprocess.Popen(worker, env=env, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stderr or ()), daemon=True)
    reader.start()
    try:
        wait_until(lambda: any("Start worker" in line for line in lines), 30, "the start")
        proc.terminate()
        assert proc.wait(10) == 0, lines  # promptly, not at the SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        reader.join(10)
        proc.stderr.close()


def test_a_grow_waiting_for_readiness_commits_with_the_workers_registered(
    dask_job: tuple[LiveCluster, XCECluster, str],
) -> None:
    live, cluster, job_id = dask_job
    client = ResizeClient.from_env(cluster._environ)
    alloc = client.grow(2, 2, wait=True, timeout=90, wait_ready=True, ready_timeout=60)
    assert alloc.size == 3 and alloc.settled
    # Committed only once both workers said ready, after registering: they are there.
    assert cluster.scheduler is not None
    registered = {str(ws.name) for ws in cluster.scheduler.workers.values()}
    assert {str(t) for t, _ in alloc.tasks if t != 0} == allocation_workers(live, job_id)
    assert allocation_workers(live, job_id) <= registered


def test_outside_release_during_a_computation_loses_nothing(
    dask_job: tuple[LiveCluster, XCECluster, str], tmp_path: Path
) -> None:
    live, cluster, job_id = dask_job
    log = tmp_path / "chunks.log"

    def slow_double(block: Any) -> Any:
        time.sleep(0.05)
        return block * 2

    cluster.scale(4)
    cluster.wait_for_workers(4, timeout=60)
    with distributed.Client(cluster) as client:
        array, chunks, scattered = hold_data(client, log, 1000)
        holders = client.who_has(chunks)
        name_of = {a: str(w["name"]) for a, w in cluster.scheduler_info["workers"].items()}
        total = client.compute(array.map_blocks(slow_double, dtype=int).sum())
        sums = client.map(lambda a: slow_double(a).sum(), scattered, pure=False)
        # Two workers on h2 go mid-way, by the owner's own bresize, with a drain time.
        out = cli(live, "release", "--grace", f"{DRAIN:g}", "2*h2", job_id, tool="bresize")
        assert out.returncode == 0, out.stderr
        released = wait_until(lambda: going(live, job_id), 30, "the release under way")
        assert len(released) == 2
        assert target(live, job_id) is None  # a manual release takes over the size
        assert total.result(timeout=120) == 2 * 1000 * sum(range(64))
        assert client.gather(sums) == [2 * 1000 * j for j in range(18)]
        wait_until(lambda: not worker_names(cluster) & released, 60, "released workers gone")
        assert [f.status for f in chunks + scattered] == ["finished"] * (64 + 18)
        assert [int(a[0]) for a in client.gather(scattered)] == list(range(18))
        assert (array.compute() == np.repeat(np.arange(64), 1000)).all()
    # The released workers did hold chunks of the array, and none was computed twice.
    assert any(name_of[a] in released for addrs in holders.values() for a in addrs)
    assert counted(log) == dict.fromkeys(range(64), 1)  # nothing was recomputed
    # The cluster retired them on the event and acknowledged: they stopped before the
    # drain's deadline (unacknowledged, nothing stops them before it).
    ids = sorted(int(t) for t in released)
    wait_until(lambda: not allocation_workers(live, job_id) & released, 60, "stopped")
    seen = events(live, job_id)
    coming = [e for e in seen if e["type"] == "release_coming" and sorted(e["task_ids"]) == ids]
    exited = [e for e in seen if e["type"] == "tasks_exited" and set(e["task_ids"]) & set(ids)]
    assert len(coming) == 1 and exited, seen
    assert max(e["time"] for e in exited) < coming[0]["deadline"]


def test_scale_down_retires_before_it_releases(
    dask_job: tuple[LiveCluster, XCECluster, str],
) -> None:
    live, cluster, job_id = dask_job
    cluster.scale(4)
    cluster.wait_for_workers(4, timeout=60)
    cluster.wait_for_allocation(60)
    with distributed.Client(cluster) as client:
        data = client.scatter([[j] * 100 for j in range(40)])
        before = worker_names(cluster)
        name_of = {a: str(w["name"]) for a, w in cluster.scheduler_info["workers"].items()}
        cluster.scale(2)
        alloc = cluster.wait_for_allocation(60)
        gone = before - {str(t) for t, _ in alloc.tasks}
        assert len(gone) == 2 and alloc.size == 3
        assert target(live, job_id) == {"tasks": 3, "release_prefer": sorted(map(int, gone))}
        # The released tasks are exactly the retired workers: no data was on a task
        # when it was stopped, so every scattered value is still there.
        assert worker_names(cluster) == before - gone == allocation_workers(live, job_id)
        assert client.gather(data) == [[j] * 100 for j in range(40)]
        # The cluster retired them itself (not the workers on their SIGTERM).
        retired = [
            msg
            for _, msg in client.get_events("all")
            if msg.get("action") == "retire-workers" and msg["retired"]
        ]
        assert [m["stimulus_id"].startswith(RETIRE_STIMULUS) for m in retired] == [True]
        assert {name_of[a] for a in retired[0]["retired"]} == gone


class DeafCluster(XCECluster):
    """An XCECluster that does not follow the job's events: whatever drains a coming
    release is the workers' own doing."""

    async def _listen(self, client: Any) -> None:
        return


def test_the_worker_drains_itself_on_its_release_coming(
    dask_job: tuple[LiveCluster, XCECluster, str],
) -> None:
    live, cluster, job_id = dask_job
    cluster.close()  # the fixture's; this test's cluster does not listen
    with DeafCluster(environ=cluster._environ) as deaf, distributed.Client(deaf) as client:
        deaf.scale(3)
        deaf.wait_for_workers(3, timeout=60)
        deaf.wait_for_allocation(60)
        coming, exited = release_one_drained(live, deaf, client, job_id)
        # The worker closed gracefully and acknowledged: gone before the deadline.
        assert exited["time"] < coming["deadline"]
        retired = [
            msg["stimulus_id"]
            for _, msg in client.get_events("all")
            if msg.get("action") == "retire-workers" and msg["retired"]
        ]
        assert [s.startswith("worker-close-gracefully") for s in retired] == [True], retired


def test_the_notification_command_retires_before_an_outside_release(
    resize_live_factory: Any, tmp_path: Path
) -> None:
    """With ``xce-dask-retire`` as the job's notification command, an outside release
    retires its workers before any SIGTERM: a stop grace too short to move data does
    not matter."""
    live: LiveCluster = resize_live_factory({"h1": 3, "h2": 3}, stop_grace=0.2, notify_timeout=60.0)
    live.start()
    retire = f"{sys.executable} -m xce_resize_plugin.integrations.dask.retire"
    answer = live.ok(
        "POST",
        "/v1/jobs",
        ALICE,
        {
            "command": DASK_JOB,
            "tasks": "1,6",
            "resizable": True,
            "initial": 1,
            "notify_cmd": retire,
        },
    )
    job_id = str(answer["id"])
    live.running(job_id, 1)
    with XCECluster(environ=job_env(live, answer)) as cluster:
        cluster.scale(4)
        cluster.wait_for_workers(4, timeout=60)
        cluster.wait_for_allocation(60)  # its target's grow ran the command too: accepted
        with distributed.Client(cluster) as client:
            array, chunks, scattered = hold_data(client, tmp_path / "chunks.log", 1000)
            name_of = {a: str(w["name"]) for a, w in cluster.scheduler_info["workers"].items()}
            assert cli(live, "release", "2*h2", job_id, tool="bresize").returncode == 0
            released = wait_until(lambda: going(live, job_id), 30, "the release under way")
            wait_until(lambda: not allocation_workers(live, job_id) & released, 30, "stopped")
            by_notification = {
                name_of[a]
                for _, msg in client.get_events("all")
                if msg.get("action") == "retire-workers"
                and msg["stimulus_id"].startswith(NOTIFY_STIMULUS)
                for a in msg["retired"]
            }
            assert by_notification == released and len(released) == 2
            assert [f.status for f in chunks + scattered] == ["finished"] * (64 + 18)
            assert (array.compute() == np.repeat(np.arange(64), 1000)).all()
            assert [int(a[0]) for a in client.gather(scattered)] == list(range(18))
    assert counted(tmp_path / "chunks.log") == dict.fromkeys(range(64), 1)


def test_a_job_not_resizable_says_so(resize_live_factory: Any) -> None:
    live: LiveCluster = resize_live_factory({"h1": 2})
    live.start()
    answer = live.ok("POST", "/v1/jobs", ALICE, {"command": DASK_JOB, "tasks": "1,2"})
    live.running(answer["id"], 2)  # not resizable: started at its maximum
    with XCECluster(environ=job_env(live, answer)) as cluster:
        cluster.wait_for_workers(1, timeout=60)
        with pytest.raises(RemoteError) as refused:
            cluster.scale(0)
        assert refused.value.code == "LSBE_JOB_RESIZABLE"
    assert live.job(answer["id"])["version"] == 0


def test_a_controller_restart_does_not_stop_the_drains(
    dask_job: tuple[LiveCluster, XCECluster, str],
) -> None:
    """The controller is stopped (SIGTERM: its long polls are cut, answered 5xx) and
    started again while the cluster and the workers follow the job's events: both go on
    following them, so an outside release afterwards is still drained and acknowledged
    (its tasks stop before the deadline), and ``scale()`` still works."""
    live, cluster, job_id = dask_job
    cluster.scale(3)
    cluster.wait_for_workers(3, timeout=60)
    cluster.wait_for_allocation(60)
    time.sleep(1.0)  # every worker is past its ready(), long-polling the events
    proc = live.procs[-1]
    proc.terminate()
    assert proc.wait(20) == 0, live.logs()
    time.sleep(2 * RETRY)
    live.start()
    with distributed.Client(cluster) as client:
        coming, exited = release_one_drained(live, cluster, client, job_id)
    assert exited["time"] < coming["deadline"] - DRAIN / 2  # acknowledged
    cluster.scale(3)  # the manual release cleared the target: the cluster sets it again
    assert cluster.wait_for_allocation(60).size == 4
