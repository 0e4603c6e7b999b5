"""Journal benchmarks (docs/journal-format.md): group commit and recovery, against their baselines.

Each figure is measured side by side with its baseline in the same run, on the same
disk (both under one pytest tmp dir), rounds alternating so that a noisy neighbour hits
both. Figures are printed as ratios (``tox -e bench`` runs pytest with ``-s``); nothing
is asserted on time, only that the work was done.

1. Durable commit throughput: 64 requester threads through :class:`GroupCommitter`
   (each entry one ~200-byte fact + a ~300-byte state) against raw py-lmdb making one
   durable write transaction per record (the same fact + state). Target >= 5x.
   Latency of one request with no concurrency (one ``submit``) against one raw durable
   commit. Target <= 1.5x.
2. Recovery (``Journal.open`` + ``start`` + ``list(live_states())``) of 10,000 live jobs
   with 1,000,000 facts of history against the same 10,000 live jobs with 10,000 facts.
   Target <= 1.5x and < 1 s.
"""

from __future__ import annotations

import os
import statistics
import threading
import time
from pathlib import Path

import lmdb

from xce_resize_plugin.journal import (
    Entry,
    GroupCommitter,
    Journal,
    collector_paused,
    require_intact,
    verify,
)

THREADS = 64
PER_THREAD = 50  # entries per requester thread: 3,200 per round
RAW_RECORDS = 400  # raw durable transactions per round
ROUNDS = 5
LATENCY_SAMPLES = 200
FACT_BYTES, STATE_BYTES = 200, 300

LIVE_JOBS = 10_000
HISTORY_FACTS = 1_000_000
FACTS_PER_JOB = 10
HISTORY_FACT_BYTES = 120
BUILD_BATCH = 1_000  # entries per build transaction (10,000 facts)
RECOVERY_ROUNDS = 5

TARGET_THROUGHPUT = 5.0
TARGET_LATENCY = 1.5
TARGET_RECOVERY = 1.5
TARGET_RECOVERY_S = 1.0


def verdict(ok: bool) -> str:
    return "met" if ok else "NOT met"


# --------------------------------------------------------------------------- 1. commit


class Raw:
    """The baseline: py-lmdb, durable defaults, one write transaction per record."""

    def __init__(self, path: Path) -> None:
        self.env = lmdb.open(str(path), map_size=256 << 20, max_dbs=4, sync=True, metasync=True)
        self.facts = self.env.open_db(b"facts")
        self.jobs = self.env.open_db(b"jobs")
        self.seq = 0

    def commit(self, job: bytes, fact: bytes, state: bytes) -> None:
        self.seq += 1
        with self.env.begin(write=True) as txn:
            txn.put(self.seq.to_bytes(8, "big"), fact, db=self.facts, append=True)
            txn.put(job, state, db=self.jobs)

    def close(self) -> None:
        self.env.close()


def raw_throughput(raw: Raw) -> float:
    fact, state = os.urandom(FACT_BYTES), os.urandom(STATE_BYTES)
    t0 = time.perf_counter()
    for i in range(RAW_RECORDS):
        raw.commit(b"job%d" % (i % THREADS), fact, state)
    return RAW_RECORDS / (time.perf_counter() - t0)


def group_throughput(gc: GroupCommitter) -> tuple[float, int]:
    """Records per second with THREADS requesters; also the seqs returned (a check)."""
    fact, state = os.urandom(FACT_BYTES), os.urandom(STATE_BYTES)
    barrier = threading.Barrier(THREADS + 1)
    done = [0] * THREADS

    def requester(t: int) -> None:
        barrier.wait()
        for _ in range(PER_THREAD):
            done[t] += len(gc.submit(Entry(f"job{t}", (fact,), state)))

    threads = [threading.Thread(target=requester, args=(t,)) for t in range(THREADS)]
    for thread in threads:
        thread.start()
    barrier.wait()
    t0 = time.perf_counter()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - t0
    return THREADS * PER_THREAD / elapsed, sum(done)


def test_group_commit_throughput_and_latency(tmp_path: Path) -> None:
    raw = Raw(tmp_path / "raw")
    journal = Journal.open(tmp_path / "journal")  # durable defaults
    journal.start()
    gc = GroupCommitter(journal)
    try:
        raw_rates, group_rates = [], []
        for _ in range(ROUNDS):
            raw_rates.append(raw_throughput(raw))
            rate, seqs = group_throughput(gc)
            assert seqs == THREADS * PER_THREAD
            group_rates.append(rate)
        batches = gc.transactions
        raw_rate, group_rate = statistics.median(raw_rates), statistics.median(group_rates)
        ratio = group_rate / raw_rate
        print(
            f"\njournal group-commit throughput: {group_rate:,.0f} rec/s vs raw {raw_rate:,.0f} "
            f"rec/s = {ratio:.1f}x ({THREADS} threads, {gc.entries / batches:.1f} entries "
            f"per transaction)"
        )
        print(f"TARGET throughput >= {TARGET_THROUGHPUT:g}x: {verdict(ratio >= TARGET_THROUGHPUT)}")

        # Latency: one request at a time, interleaved with one raw commit at a time.
        fact, state = os.urandom(FACT_BYTES), os.urandom(STATE_BYTES)
        raw_times, submit_times = [], []
        for i in range(LATENCY_SAMPLES):
            t0 = time.perf_counter()
            raw.commit(b"lat", fact, state)
            t1 = time.perf_counter()
            seqs_one = gc.submit(Entry(f"lat{i % 8}", (fact,), state))
            t2 = time.perf_counter()
            assert len(seqs_one) == 1
            raw_times.append(t1 - t0)
            submit_times.append(t2 - t1)
        raw_ms = statistics.median(raw_times) * 1e3
        sub_ms = statistics.median(submit_times) * 1e3
        lat_ratio = sub_ms / raw_ms
        print(
            f"journal commit latency (median of {LATENCY_SAMPLES}): one submit {sub_ms:.3f} ms "
            f"vs raw durable commit {raw_ms:.3f} ms = {lat_ratio:.2f}x"
        )
        print(f"TARGET latency <= {TARGET_LATENCY:g}x: {verdict(lat_ratio <= TARGET_LATENCY)}")
    finally:
        gc.close()
        journal.close()
        raw.close()


# --------------------------------------------------------------------------- 2. recovery


def build_history(path: Path) -> None:
    """LIVE_JOBS live jobs and HISTORY_FACTS facts; most belong to finished jobs.

    Built with sync=False in transactions of BUILD_BATCH entries: setup, not measured.
    """
    blobs = [os.urandom(HISTORY_FACT_BYTES) for _ in range(64)]
    state = os.urandom(STATE_BYTES)
    jobs = HISTORY_FACTS // FACTS_PER_JOB
    finished = jobs - LIVE_JOBS
    with Journal.open(path, sync=False) as j:
        j.start()
        for first in range(0, jobs, BUILD_BATCH):
            batch = []
            for n in range(first, min(first + BUILD_BATCH, jobs)):
                facts = tuple(blobs[(n + k) % 64] for k in range(FACTS_PER_JOB))
                ended = 1_600_000_000.0 + n if n < finished else None
                batch.append(Entry(f"job{n:07d}", facts, state, ended_at=ended))
            j.commit(batch)
        stats = j.stats()
    assert stats["facts"] == HISTORY_FACTS and stats["jobs"] == LIVE_JOBS


def build_small(path: Path) -> None:
    """The same LIVE_JOBS live jobs (same ids, same state size), one fact each."""
    state = os.urandom(STATE_BYTES)
    fact = os.urandom(HISTORY_FACT_BYTES)
    jobs = HISTORY_FACTS // FACTS_PER_JOB
    with Journal.open(path, sync=False) as j:
        j.start()
        for first in range(jobs - LIVE_JOBS, jobs, BUILD_BATCH):
            j.commit(
                [Entry(f"job{n:07d}", (fact,), state) for n in range(first, first + BUILD_BATCH)]
            )
        stats = j.stats()
    assert stats["facts"] == LIVE_JOBS and stats["jobs"] == LIVE_JOBS


def recover(path: Path) -> float:
    t0 = time.perf_counter()
    with Journal.open(path) as j:  # the defaults a controller uses
        j.start()
        # As the plugin's start reads them (runtime/phases.py): with the cyclic collector
        # paused. Without it, a full collection of the benchmark process's objects
        # falls into some recoveries and not others (20-30 ms here, more than the read).
        with collector_paused():
            live = list(j.live_states())
    elapsed = time.perf_counter() - t0
    assert len(live) == LIVE_JOBS
    return elapsed


def test_recovery_does_not_grow_with_history(tmp_path: Path) -> None:
    history, small = tmp_path / "history", tmp_path / "small"
    t0 = time.perf_counter()
    build_history(history)
    build_small(small)
    # The journals were built without sync: write their pages out now, or the first
    # recovery's epoch commit (fsync) pays for writing back hundreds of megabytes.
    os.sync()
    build_s = time.perf_counter() - t0
    big_times, small_times = [], []
    for _ in range(RECOVERY_ROUNDS):
        big_times.append(recover(history))
        small_times.append(recover(small))
    big, little = statistics.median(big_times), statistics.median(small_times)
    ratio = big / little
    size_mb = (history / "data.mdb").stat().st_size / 1e6
    print(
        f"\njournal recovery (open + start + live_states, {LIVE_JOBS:,} live jobs): "
        f"{HISTORY_FACTS:,} facts ({size_mb:.0f} MB) {big * 1e3:.1f} ms vs {LIVE_JOBS:,} facts "
        f"{little * 1e3:.1f} ms = {ratio:.2f}x (setup {build_s:.1f} s)"
    )
    ok = ratio <= TARGET_RECOVERY and big < TARGET_RECOVERY_S
    print(f"TARGET recovery <= {TARGET_RECOVERY:g}x and < {TARGET_RECOVERY_S:g} s: {verdict(ok)}")


# --------------------------------------------------------------------- 3. start check

START_CHECK_ROUNDS = 3


def test_the_start_check_of_a_large_journal(tmp_path: Path) -> None:
    """What the live controller's check at start (``require_intact``: every record's CRC,
    the meta keys, the sequence accounting) costs on 1,000,000 facts, against the
    recovery it precedes and against ``journal verify``'s record checks (which add the
    index cross-references). Not a target: the figure goes to docs/performance.md."""
    history = tmp_path / "history"
    build_history(history)
    checks, verifies, recoveries = [], [], []
    for _ in range(START_CHECK_ROUNDS):
        t0 = time.perf_counter()
        report = require_intact(history)
        checks.append(time.perf_counter() - t0)
        assert report.facts == HISTORY_FACTS
        t0 = time.perf_counter()
        assert verify(history, structure=False).ok
        verifies.append(time.perf_counter() - t0)
        recoveries.append(recover(history))
    check, full, rec = (statistics.median(x) for x in (checks, verifies, recoveries))
    print(
        f"\nstart check of {HISTORY_FACTS:,} facts: {check:.2f} s (journal verify without "
        f"the page walk: {full:.2f} s; recovery itself: {rec * 1e3:.0f} ms)"
    )
