"""Sweep speed (issue #10): 2 traces x 3 malleable fractions x 3 seeds = 18 cells, on 2
local worker processes against the same cells run one after the other in one process
(``--workers 1``), side by side in one run, no cache. Target: at least 1.7x.

The traces are KTH's and CTC's first 3,000 jobs from ../shared/traces (a cell then
takes a few seconds, as real sweep cells do), else the samples in tests/data. The two
ways must give the same numbers (asserted); the times and their ratio are printed, not
asserted (docs/performance.md; the machine is shared, so ``os.getloadavg()`` is printed
with them, and the share of a core the serial run got: on a busy machine two workers
cannot get two cores).
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from xce_resize_plugin.simulation.sweep import run_sweep
from xce_resize_plugin.simulation.sweep_config import load_sweep

ROOT = Path(__file__).resolve().parents[2]
SHARED = ROOT.parent / "shared" / "traces"
FULL = [SHARED / "KTH-SP2-1996-2.1-cln.swf.gz", SHARED / "CTC-SP2-1996-3.1-cln.swf.gz"]
SAMPLES = [
    ROOT / "tests" / "data" / "KTH-SP2-1996-2.1-cln-first200.swf.gz",
    ROOT / "tests" / "data" / "CTC-SP2-1996-3.1-cln-first1000.swf.gz",
]


TICKS = os.sysconf("SC_CLK_TCK")


def _descendants_cpu() -> dict[int, float]:
    """CPU seconds (user + system) so far of every process below this one."""
    parent: dict[int, int] = {}
    cpu: dict[int, float] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        pid = int(entry)
        parent[pid] = int(fields[1])
        cpu[pid] = (int(fields[11]) + int(fields[12])) / TICKS
    me, out = os.getpid(), {}
    for pid in cpu:
        p = parent.get(pid)
        while p is not None and p > 1:
            if p == me:
                out[pid] = cpu[pid]
                break
            p = parent.get(p)
    return out


class WorkerCpu:
    """The CPU seconds the worker processes got (sampled every 0.2 s from /proc)."""

    def __init__(self) -> None:
        self.seen: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.seen.update(_descendants_cpu())
            self._stop.wait(0.2)

    def __enter__(self) -> WorkerCpu:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def total(self) -> float:
        return sum(self.seen.values())


def test_two_workers_against_serial(tmp_path: Path) -> None:
    traces, limit = (FULL, 3000) if all(p.exists() for p in FULL) else (SAMPLES, 1000)
    config = tmp_path / "bench.toml"
    names = ", ".join(f'"{p}"' for p in traces)
    config.write_text(
        f"[sweep]\nworkloads = [{names}]\nmalleable_fractions = [0.2, 0.5, 1.0]\n"
        f"seeds = [0, 1, 2]\n[simulate]\nlimit = {limit}\n",
        encoding="utf-8",
    )
    sweep = load_sweep(config)
    load_before = os.getloadavg()
    began, cpu = time.perf_counter(), time.process_time()
    serial = run_sweep(sweep, workers=1)
    serial_s = time.perf_counter() - began
    serial_cpu = time.process_time() - cpu
    began = time.perf_counter()
    with WorkerCpu() as workers:
        parallel = run_sweep(sweep, workers=2)
    parallel_s = time.perf_counter() - began
    load_after = os.getloadavg()
    # 18 cells, 16 runs: per trace one rigid run, and one elastic run at fraction 1.0
    # for the three seeds (xce_resize_plugin/simulation/sweep.py shares them).
    assert serial.ran == parallel.ran == 16
    assert [r for _, r in serial.cells] == [r for _, r in parallel.cells]
    assert all(not r["problems"] for _, r in serial.cells)
    print(
        f"\nsweep of 18 cells ({', '.join(p.name for p in traces)}, first {limit:,} jobs): "
        f"serial {serial_s:.1f} s, 2 workers {parallel_s:.1f} s, "
        f"speed-up {serial_s / parallel_s:.2f}x (target >= 1.7x); "
        f"load average before {load_before[0]:.2f}, after {load_after[0]:.2f} "
        f"on {os.cpu_count()} cores; the serial run got {serial_cpu / serial_s:.0%} of a core "
        f"({serial_cpu:.1f} s of CPU in {serial_s:.1f} s), the 2 workers "
        f"{workers.total / parallel_s:.2f} cores ({workers.total:.1f} s of CPU in "
        f"{parallel_s:.1f} s)"
    )
