"""Plugin recovery: xce_controller_start with 10,000 live resized jobs and 1,000,000
facts of history, against the same live jobs with 10,000 facts (targets: at most 1.5x,
and under 1 s). Measured through the embedded controller's start, so it includes
decoding every live job's state and re-issuing its effects to the host."""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

from xce_resize_plugin.controllers.sim import EmbeddedController
from xce_resize_plugin.core.models import GrowRequest
from xce_resize_plugin.host import Principal
from xce_resize_plugin.journal import Entry, Journal
from xce_resize_plugin.manager import get_plugin_manager

LIVE = 10_000
HOSTS = [(f"n{i:04d}", 32) for i in range(1000)]
CONFIG = {"journal_sync": False}


def build(state_dir: Path, history: int) -> None:
    pm = get_plugin_manager(CONFIG, entry_points=False)
    ctl = EmbeddedController(pm, state_dir, hosts=HOSTS, config=CONFIG, store="lmdb", durable=False)
    for i in range(LIVE):
        host = HOSTS[i % 1000][0]
        job = ctl.submit(f"u{i % 100}", "1,4", runtime=1e9, resizable=True, alloc={host: 1})
        # every live job is tracked by the plugin: a grow placed and committed
        ctl.request_resize(Principal(f"u{i % 100}"), job, GrowRequest(1, 1, no_notify=True))
    ctl.settle()
    ctl.stop()
    # History of finished jobs, written in big batches (it is the size that matters).
    fact = json.dumps({"type": "JobEnded", "job_id": "x", "at": 0.0}).encode()
    with Journal.open(state_dir / "resize", sync=False) as journal:
        journal.start()
        have = journal.last_seq
        n = 0
        while have + n < history:
            batch = min(50_000, history - have - n)
            journal.commit([Entry(f"old{n}", (fact,) * batch, b"{}", ended_at=0.0)])
            n += batch


def start_time(state_dir: Path) -> float:
    pm = get_plugin_manager(CONFIG, entry_points=False)
    ctl = EmbeddedController(pm, state_dir, store="lmdb", durable=False, autostart=False)
    t0 = time.perf_counter()
    ctl.start()
    elapsed = time.perf_counter() - t0
    assert ctl.check_invariants() == []
    ctl.close()
    return elapsed


def test_recovery_cost_grows_with_live_jobs_not_history(tmp_path: Path) -> None:
    small, large = tmp_path / "small", tmp_path / "large"
    t0 = time.perf_counter()
    build(small, 10_000 + 3 * LIVE)
    build(large, 1_000_000)
    setup = time.perf_counter() - t0
    a, b = [], []
    for _ in range(3):
        a.append(start_time(small))
        b.append(start_time(large))
    base, big = statistics.median(a), statistics.median(b)
    ratio = big / base
    met = "met" if ratio <= 1.5 and big < 1.0 else "NOT met"
    print(
        f"\nplugin recovery (xce_controller_start, {LIVE:,} live resized jobs): "
        f"1,000,000 facts {big * 1e3:.0f} ms vs ~{10_000 + 3 * LIVE:,} facts "
        f"{base * 1e3:.0f} ms = {ratio:.2f}x (target <= 1.5x and < 1 s) {met} "
        f"(setup {setup:.0f} s)"
    )
