"""Load on the live controller's REST API: 200 concurrent clients x 50 mixed resize
requests on loopback (issue #3 §7), and durable request throughput with 64 clients
(§9). Reports p50/p99 latency and requests per second.

The cluster is full, so every grow pends and every answer is known in advance: a
client's sequence of requests has exactly one right answer each. Afterwards the journal
must hold exactly the accepted changes (none lost, none applied twice) and the
controller's invariant check must be empty.
"""

from __future__ import annotations

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


@pytest.fixture
def live(tmp_path: Path) -> Iterator[LiveCluster]:
    # 200 one-task jobs fill 200 slots exactly: no grow can ever be placed.
    hosts = {f"n{i:02d}": 20 for i in range(10)}
    cluster = LiveCluster(tmp_path, hosts, {"stop_grace": 1.0})
    try:
        yield cluster
    finally:
        cluster.cleanup()
        kill_marked(str(tmp_path))


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


def test_durable_http_throughput_64_clients(live: LiveCluster, tmp_path: Path) -> None:
    """64 clients, each alternating grow (pends: the cluster is full) and cancel: every
    request is a durable change. Compared with the journal's group-commit rate measured
    in the same run (tests/benchmarks/test_bench_journal.py's method)."""
    from tests.benchmarks.test_bench_journal import group_throughput
    from xce_resize_plugin.journal import GroupCommitter

    with Journal.open(tmp_path / "gc") as journal:
        journal.start()
        with GroupCommitter(journal) as gc:
            journal_rate, _ = group_throughput(gc)
    live.start()
    clients, per_client = 64, 40
    jobs = [
        live.submit(min_tasks=1, max_tasks=21, resizable=True, alloc={f"n{i % 10:02d}": 20})
        for i in range(10)
    ]
    for job in jobs:
        live.running(job, 20)
    start = threading.Barrier(clients + 1)
    wrong: list[str] = []

    def loop(i: int) -> None:
        client = Client(live.url(), ALICE, timeout=120)
        job = jobs[i % len(jobs)]
        start.wait()
        for k in range(per_client):
            kind = "grow" if k % 2 == 0 else "cancel"
            body = {"tasks": 1, "no_notify": True, "cancel_pending": True}
            got = _one(client, job, kind, body if kind == "grow" else None)
            # Several clients share a job: a cancel may find the grow already cancelled.
            if got not in ("200", "202", "LSBE_RESIZE_NO_ACTIVE_REQUEST"):
                wrong.append(got)

    threads = [threading.Thread(target=loop, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    rate = clients * per_client / (time.perf_counter() - t0)
    assert wrong == []
    print(
        f"\ndurable REST throughput, 64 clients: {rate:,.0f} req/s vs journal group commit "
        f"{journal_rate:,.0f} rec/s in the same run = {rate / journal_rate:.2f}x"
    )
