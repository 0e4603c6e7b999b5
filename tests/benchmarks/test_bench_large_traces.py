"""Issue #10's target on real traces of today's size: "any real trace of at least
100,000 jobs on at least 1,000 hosts, both runs (20 % malleable), under 60 s on this
2-core machine and under 2 GB".

None of the traces in ../shared/traces is that large (HPC2N has 240 hosts), so the
traces are looked for by their Parallel Workloads Archive names in ../shared/traces and
in the directories named by ``XCE_RESIZE_TRACES`` (separated like ``PATH``); a trace
that is in neither is skipped, naming the file to fetch. docs/performance.md gives the
archive's addresses and the SHA-256 of the files measured.

Each run is the whole trace as ``xce-resize simulate TRACE --malleable 0.2`` runs it:
both runs side by side in two processes, the trace read included. Printed: wall time,
the peak resident memory of the parent and both runs together, the machine reference
(tests/benchmarks/machine.py). Asserted: the runs' own checks, the trace's size (so a
smaller file under the same name cannot pass for it) and the memory target; the time
target is printed, not asserted (the machine is shared, see docs/performance.md).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from tests.benchmarks.machine import reference_seconds
from tests.benchmarks.test_bench_simulate import PeakMemory
from xce_resize_plugin.simulation.comparison import simulate
from xce_resize_plugin.simulation.simulate import SimOptions, load_workload

SHARED = Path(__file__).resolve().parents[3] / "shared" / "traces"

#: Archive name -> (jobs the simulator keeps, hosts): the cleaned logs' sizes as read
#: with one slot per processor.
LARGE = {
    "SDSC-BLUE-2000-4.2-cln.swf.gz": (232_536, 1_152),
    "LLNL-Thunder-2007-1.1-cln.swf.gz": (113_613, 4_008),
}


def trace_dirs() -> list[Path]:
    extra = os.environ.get("XCE_RESIZE_TRACES", "")
    return [SHARED, *(Path(d) for d in extra.split(os.pathsep) if d)]


def find_trace(name: str) -> Path | None:
    for d in trace_dirs():
        if (d / name).is_file():
            return d / name
    return None


@pytest.mark.parametrize("name", sorted(LARGE))
def test_large_real_trace_both_runs(name: str) -> None:
    path = find_trace(name)
    if path is None:
        pytest.skip(
            f"{name} is in none of {', '.join(map(str, trace_dirs()))} "
            "(set XCE_RESIZE_TRACES to the directory holding it; docs/performance.md)"
        )
    jobs, hosts = LARGE[name]
    options = SimOptions(malleable_fraction=0.2)
    with PeakMemory() as mem:
        t0 = time.perf_counter()
        workload = load_workload(path, options)
        result = simulate(path, options, workload=workload)
        wall = time.perf_counter() - t0
    assert result.problems == []
    assert (len(workload.jobs), workload.capacity) == (jobs, hosts)
    r, e = result.rigid, result.elastic
    ref = reference_seconds()
    print(
        f"\n{name} ({jobs:,} jobs on {hosts:,} one-slot hosts, 20% malleable), both runs "
        f"side by side, trace read included: {wall:.1f} s wall (target < 60 s: "
        f"{'met' if wall < 60 else 'NOT met'}); rigid run {r.seconds:.1f} s, elastic run "
        f"{e.seconds:.1f} s; peak memory {mem.peak_kb / 1024:,.0f} MB (target < 2048 MB: "
        f"{'met' if mem.peak_kb < 2 << 20 else 'NOT met'}); {e.metrics.resizes:,} resizes; "
        f"machine reference {ref:.3f} CPU s, wall / reference {wall / ref:.0f}"
    )
    assert mem.peak_kb < 2 << 20
