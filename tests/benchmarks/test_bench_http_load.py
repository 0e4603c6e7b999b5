"""Load on the live controller's REST API: 200 concurrent clients x 50 mixed resize
requests on loopback (issue #3 §7), and durable request throughput with 64 clients
(§9) against read-only status requests in the same run (issue #13). Reports p50/p99
latency and requests per second.

The cluster is full, so every grow pends and every answer is known in advance: a
client's sequence of requests has exactly one right answer each. Afterwards the journal
must hold exactly the accepted changes (none lost, none applied twice) and the
controller's invariant check must be empty.
"""

from __future__ import annotations

import os
import statistics
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from xce_resize_plugin.core import converters
from xce_resize_plugin.journal import Journal
from xce_resize_plugin.rest.client import Client, RemoteError
from xce_resize_plugin.testing.live import ALICE, LiveCluster, kill_marked

CLIENTS = 200
REQUESTS = 50
#: One cycle of (request body or None for cancel, expected status or error code).
CYCLE: list[tuple[str, dict[str, Any] | None, str]] = [
    ("grow", {"tasks": 1, "no_notify": True}, "202"),
    ("grow", {"tasks": 1, "no_notify": True}, "LSBE_RESIZE_PENDING_REQUEST"),
    ("grow", {"tasks": 1, "no_notify": True, "cancel_pending": True}, "202"),
    ("status", None, "200"),
    ("cancel", None, "200"),
    ("cancel", None, "LSBE_RESIZE_NO_ACTIVE_REQUEST"),
    ("release", {"count": 1}, "LSBE_RESIZE_BAD_SLOTS_4SLOTS"),
    ("history", None, "200"),
]


def _cluster(tmp_path: Path, hosts: int, slots: int) -> Iterator[LiveCluster]:
    cluster = LiveCluster(tmp_path, {f"n{i:02d}": slots for i in range(hosts)}, {"stop_grace": 1.0})
    try:
        yield cluster
    finally:
        cluster.cleanup()
        kill_marked(str(tmp_path))


@pytest.fixture
def live(tmp_path: Path) -> Iterator[LiveCluster]:
    # 200 one-task jobs fill 200 slots exactly: no grow can ever be placed.
    yield from _cluster(tmp_path, 10, 20)


@pytest.fixture
def live64(tmp_path: Path) -> Iterator[LiveCluster]:
    # 64 one-task jobs fill 64 slots exactly.
    yield from _cluster(tmp_path, 8, 8)


def _one(client: Client, job: str, kind: str, body: dict[str, Any] | None) -> str:
    base = f"/v1/jobs/{job}/resize"
    try:
        if kind == "grow":
            client.call("POST", f"{base}/grow", body)
            return "202"
        if kind == "release":
            client.call("POST", f"{base}/release", body)
            return "202"
        if kind == "cancel":
            client.call("DELETE", f"{base}/pending")
            return "200"
        client.call("GET", base if kind == "status" else f"{base}/history")
        return "200"
    except RemoteError as exc:
        return exc.code


def test_load_200_clients(live: LiveCluster) -> None:
    live.start()
    jobs = [
        live.submit(min_tasks=1, max_tasks=2, resizable=True, alloc={f"n{i % 10:02d}": 1})
        for i in range(CLIENTS)
    ]
    for job in jobs:
        live.running(job, 1)
    latencies: list[float] = []
    wrong: list[str] = []
    accepted: Counter[str] = Counter()
    lock = threading.Lock()
    start = threading.Barrier(CLIENTS + 1)

    def client_loop(job: str) -> None:
        client = Client(live.url(), ALICE, timeout=120)
        mine: list[float] = []
        start.wait()
        for i in range(REQUESTS):
            kind, body, expected = CYCLE[i % len(CYCLE)]
            t0 = time.perf_counter()
            got = _one(client, job, kind, body)
            mine.append(time.perf_counter() - t0)
            with lock:
                if got != expected:
                    wrong.append(f"job {job} request {i} {kind}: {got}, expected {expected}")
                elif kind in ("grow", "cancel") and got[0] == "2":
                    accepted[kind] += 1
                    if body is not None and body.get("cancel_pending"):
                        accepted["replaced"] += 1
        with lock:
            latencies.extend(mine)

    threads = [threading.Thread(target=client_loop, args=(j,)) for j in jobs]
    for t in threads:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - t0
    assert wrong == [], wrong[:10]
    assert live.cluster()["problems"] == []
    latencies.sort()
    p50 = statistics.median(latencies)
    p99 = latencies[int(0.99 * len(latencies))]
    total = CLIENTS * REQUESTS
    print(
        f"\nREST load: {CLIENTS} clients x {REQUESTS} mixed requests = {total} in "
        f"{elapsed:.1f} s ({total / elapsed:,.0f} req/s); latency p50 {p50 * 1e3:.1f} ms, "
        f"p99 {p99 * 1e3:.1f} ms; every answer as expected"
    )
    live.crash()  # stop writing; the journal is read offline below
    with Journal.open(live.state / "resize", readonly=True) as journal:
        facts = Counter(type(converters.decode_fact(p)).__name__ for _, _, p in journal.facts())
    # Each accepted grow wrote one GrowRequested; a replacing grow (-c) also one
    # GrowCancelled; each accepted cancel one GrowCancelled. Nothing more, nothing less.
    assert facts["GrowRequested"] == accepted["grow"]
    assert facts["GrowCancelled"] == accepted["cancel"] + accepted["replaced"]
    assert facts["JobTracked"] == CLIENTS


DURABLE_CLIENTS = 64
#: Requests each client makes in one timed phase (status: GETs; durable: grow, cancel, ...).
PHASE_REQUESTS = 40
#: Status and durable phases alternate this many times; each kind's rate is its total
#: requests over its total time, so a passing disturbance of the machine hits both.
ROUNDS = 3


def _cpu_seconds(pid: int) -> float:
    """User and system CPU time of process ``pid`` so far (all its threads)."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _phase(live: LiveCluster, jobs: list[str], durable: bool) -> float:
    """One timed phase: each of the 64 clients makes :data:`PHASE_REQUESTS` requests on
    its own job; seconds taken. Durable: grow (pends: the cluster is full), cancel, ...
    (every request a journal write); else resize status GETs (no write)."""
    start = threading.Barrier(len(jobs) + 1)
    wrong: list[str] = []

    def loop(job: str) -> None:
        client = Client(live.url(), ALICE, timeout=120)
        start.wait()
        for k in range(PHASE_REQUESTS):
            kind = ("grow" if k % 2 == 0 else "cancel") if durable else "status"
            got = _one(client, job, kind, {"tasks": 1, "no_notify": True})
            if got != ("202" if kind == "grow" else "200"):
                wrong.append(f"job {job} {kind}: {got}")

    threads = [threading.Thread(target=loop, args=(j,)) for j in jobs]
    for t in threads:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - t0
    assert wrong == [], wrong[:10]
    return elapsed


def test_durable_http_throughput_64_clients(live64: LiveCluster) -> None:
    """Issue #13, "Speed": 64 clients, each on its own job, alternately doing
    grow-then-cancel pairs (every request a durable change: the cluster is full, so
    every grow pends) and read-only resize status requests, against one controller in
    the same run. Target: the durable request rate at least 0.7x the status rate."""
    live = live64
    live.start()
    # 64 one-task jobs on 8 hosts x 8 slots: the cluster is full, every grow pends.
    jobs = [
        live.submit(min_tasks=1, max_tasks=2, resizable=True, alloc={f"n{i % 8:02d}": 1})
        for i in range(DURABLE_CLIENTS)
    ]
    for job in jobs:
        live.running(job, 1)
    took = {True: 0.0, False: 0.0}
    cpu = {True: 0.0, False: 0.0}  # the controller's CPU seconds (less noisy than rates)
    pid = live.procs[-1].pid
    for _ in range(ROUNDS):
        for durable in (False, True):
            before = _cpu_seconds(pid)
            took[durable] += _phase(live, jobs, durable)
            cpu[durable] += _cpu_seconds(pid) - before
    per_kind = DURABLE_CLIENTS * PHASE_REQUESTS * ROUNDS
    status_rate, durable_rate = per_kind / took[False], per_kind / took[True]
    status_cpu, durable_cpu = (1e3 * cpu[k] / per_kind for k in (False, True))
    assert live.cluster()["problems"] == []
    live.crash()  # the journal is read offline below
    with Journal.open(live.state / "resize", readonly=True) as journal:
        facts = Counter(type(converters.decode_fact(p)).__name__ for _, _, p in journal.facts())
    # Every acknowledged grow and cancel is in the journal, once.
    assert facts["GrowRequested"] == facts["GrowCancelled"] == per_kind // 2
    print(
        f"\ndurable REST throughput, {DURABLE_CLIENTS} clients, same run: grow-then-cancel "
        f"{durable_rate:,.0f} req/s ({durable_rate / 2:,.0f} pairs/s) vs resize status "
        f"{status_rate:,.0f} req/s = {durable_rate / status_rate:.2f}x "
        f"(target >= 0.7x; pairs/s over status req/s {durable_rate / 2 / status_rate:.2f}x); "
        f"controller CPU per request: durable {durable_cpu:.2f} ms, status {status_cpu:.2f} ms"
    )
