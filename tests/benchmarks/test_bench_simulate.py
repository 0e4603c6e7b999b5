"""Trace simulation speed (issue #4 §3, issue #10), measured on the HPC2N trace (202,871
jobs, 3.5 years) in ../shared/traces; skipped without it.

- the whole trace with 20 % malleable, both runs as ``xce-resize simulate`` runs them
  (side by side in two processes): wall time (target < 60 s) and the peak resident
  memory of the parent and both runs together (target < 2 GB), sampled from /proc;
- the same trace scaled x5 to 1,200 one-slot hosts, both runs (issue #10's stand-in for
  a real trace of 100,000 jobs on 1,000 hosts; target < 60 s, < 2 GB);
- the elastic run against the rigid run of the same trace (target: at most 1.5x): the
  whole trace, rigid and elastic alternately, three times, in one process, best time
  of each;
- events per second and how the time grows from 10,000 to 200,000 jobs (both runs,
  one after the other), with the log-log slope (1.0 is linear).

Figures are printed; the assertions are on the runs' own checks and on the growth
staying close to linear, not on machine-dependent times (see docs/performance.md).
"""

from __future__ import annotations

import math
import os
import threading
import time
from pathlib import Path

import pytest

from tests.benchmarks.machine import reference_seconds
from tests.benchmarks.test_bench_scale import scaled
from xce_resize_plugin.simulation.comparison import simulate
from xce_resize_plugin.simulation.simulate import (
    SimOptions,
    load_workload,
    run_mode,
)

TRACE = Path(__file__).resolve().parents[3] / "shared" / "traces" / "HPC2N-2002-2.2-cln.swf.gz"
pytestmark = pytest.mark.skipif(not TRACE.exists(), reason="needs ../shared/traces (HPC2N)")


def _rss_kb(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as fh:
            return [int(x) for x in fh.read().split()]
    except OSError:
        return []


class PeakMemory:
    """Samples the resident memory of this process and its children (every 50 ms)."""

    def __init__(self) -> None:
        self.peak_kb = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        me = os.getpid()
        while not self._stop.is_set():
            total = _rss_kb(me) + sum(_rss_kb(c) for c in _children(me))
            self.peak_kb = max(self.peak_kb, total)
            self._stop.wait(0.05)

    def __enter__(self) -> PeakMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def test_whole_hpc2n_trace_both_runs() -> None:
    options = SimOptions(malleable_fraction=0.2)
    with PeakMemory() as mem:
        t0 = time.perf_counter()
        result = simulate(TRACE, options)
        wall = time.perf_counter() - t0
    assert result.problems == []
    r, e = result.rigid, result.elastic
    events = r.events + e.events
    print(
        f"\nHPC2N whole trace ({len(result.workload.jobs):,} jobs, 20% malleable), both runs "
        f"side by side: {wall:.1f} s wall (target < 60 s, issue #4: "
        f"{'met' if wall < 60 else 'NOT met'}; < 30 s, issue #10: "
        f"{'met' if wall < 30 else 'NOT met'}); "
        f"rigid run {r.seconds:.1f} s, elastic run {e.seconds:.1f} s; {events:,} events, "
        f"{events / wall:,.0f} events/s; peak memory {mem.peak_kb / 1024:,.0f} MB "
        f"(target < 2048 MB: {'met' if mem.peak_kb < 2 << 20 else 'NOT met'}); "
        f"{e.metrics.resizes:,} resizes"
    )
    ref = reference_seconds()
    print(
        f"machine reference (tests/benchmarks/machine.py): {ref:.3f} CPU s, wall / reference "
        f"{wall / ref:.0f} (compare days by this, not by the wall time alone)"
    )
    assert mem.peak_kb < 2 << 20


def test_whole_hpc2n_trace_on_1200_hosts_both_runs() -> None:
    """The stand-in for issue #10's "real trace of at least 100,000 jobs on at least
    1,000 hosts" (none is in ../shared/traces; real ones, where a site has them:
    test_bench_large_traces.py): HPC2N's 202,871 jobs and its machine
    scaled x5, the smallest factor past 1,000 hosts (1,200 one-slot hosts; every job's
    sizes x5, so each resize moves five times the tasks). Target as for the real trace:
    both runs under 60 s and 2 GB."""
    options = SimOptions(malleable_fraction=0.2)
    with PeakMemory() as mem:
        t0 = time.perf_counter()
        workload = scaled(load_workload(TRACE, options), 5)
        result = simulate(TRACE, options, workload=workload)
        wall = time.perf_counter() - t0
    assert result.problems == []
    assert workload.capacity == 1200 and len(workload.jobs) == 202_871
    r, e = result.rigid, result.elastic
    ref = reference_seconds()
    print(
        f"\nHPC2N x5 ({len(workload.jobs):,} jobs on {workload.capacity:,} one-slot hosts, 20% "
        f"malleable), both runs side by side, trace read and scaled included: {wall:.1f} s "
        f"wall (target < 60 s: {'met' if wall < 60 else 'NOT met'}); rigid run "
        f"{r.seconds:.1f} s, elastic run {e.seconds:.1f} s; peak memory "
        f"{mem.peak_kb / 1024:,.0f} MB (target < 2048 MB: "
        f"{'met' if mem.peak_kb < 2 << 20 else 'NOT met'}); {e.metrics.resizes:,} resizes; "
        f"machine reference {ref:.3f} CPU s, wall / reference {wall / ref:.0f}"
    )
    assert mem.peak_kb < 2 << 20


def test_elastic_against_rigid() -> None:
    """The whole trace, rigid then elastic, three times over in one process; the best
    time of each (the machine is shared: the minimum is the run least disturbed by
    others, and one good or bad run of either side moves a best-of-two by 5 %)."""
    options = SimOptions(malleable_fraction=0.2)
    workload = load_workload(TRACE, options)
    times: dict[str, list[float]] = {"rigid": [], "elastic": []}
    for _ in range(3):
        for mode in ("rigid", "elastic"):
            run = run_mode(workload, options, mode)
            assert run.problems == ()
            times[mode].append(run.seconds)
    rigid, elastic = min(times["rigid"]), min(times["elastic"])
    ratio = elastic / rigid
    print(
        f"\nHPC2N whole trace, 20% malleable: rigid {rigid:.1f} s, elastic {elastic:.1f} s "
        f"(best of {times}) = {ratio:.2f}x (target <= 1.5x: "
        f"{'met' if ratio <= 1.5 else 'NOT met'})"
    )


def test_growth_from_10k_to_200k_jobs() -> None:
    sizes = (10_000, 25_000, 50_000, 100_000, 200_000)
    full = load_workload(TRACE, SimOptions(malleable_fraction=0.2))
    rows = []
    for n in sizes:
        options = SimOptions(malleable_fraction=0.2, limit=n)
        workload = load_workload(TRACE, options) if n < len(full.jobs) else full
        rigid = run_mode(workload, options, "rigid")
        elastic = run_mode(workload, options, "elastic")
        assert rigid.problems == () and elastic.problems == ()
        rows.append((len(workload.jobs), rigid, elastic))
    print("\njobs      rigid s  events/s   elastic s  events/s  resizes  elastic/rigid")
    for jobs, rigid, elastic in rows:
        print(
            f"{jobs:>7,}  {rigid.seconds:8.1f}  {rigid.events / rigid.seconds:8,.0f}  "
            f"{elastic.seconds:9.1f}  {elastic.events / elastic.seconds:8,.0f}  "
            f"{elastic.metrics.resizes:7,}  {elastic.seconds / rigid.seconds:6.2f}x"
        )
    jobs0, r0, e0 = rows[0]
    jobs1, r1, e1 = rows[-1]
    span = math.log(jobs1 / jobs0)
    slope_r = math.log(r1.seconds / r0.seconds) / span
    slope_e = math.log(e1.seconds / e0.seconds) / span
    ratio = e1.seconds / r1.seconds
    print(
        f"growth {jobs0:,} -> {jobs1:,} jobs: rigid x{r1.seconds / r0.seconds:.1f} (log-log "
        f"slope {slope_r:.2f}), elastic x{e1.seconds / e0.seconds:.1f} (slope {slope_e:.2f}); "
        f"elastic/rigid at {jobs1:,} jobs in this single pass {ratio:.2f}x"
    )
    # Close to linear: a quadratic part would show as a slope well above 1.
    assert slope_r < 1.25 and slope_e < 1.25
