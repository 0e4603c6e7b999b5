"""bresize start-up: `bresize -V` wall time against `python3 -c pass` (target <= 2.5x),
both run as fresh processes, interleaved, in one run."""

from __future__ import annotations

import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path


def wall(argv: list[str], n: int) -> float:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def test_bresize_version_startup() -> None:
    exe = shutil.which("bresize") or str(Path(sys.executable).parent / "bresize")
    base_argv = [sys.executable, "-c", "pass"]
    a, b = [], []
    for _ in range(10):
        a.append(wall(base_argv, 3))
        b.append(wall([exe, "-V"], 3))
    base, cmd = statistics.median(a), statistics.median(b)
    ratio = cmd / base
    met = "met" if ratio <= 2.5 else "NOT met"
    print(
        f"\nbresize -V: {cmd * 1e3:.1f} ms vs python3 -c pass {base * 1e3:.1f} ms "
        f"= {ratio:.2f}x (target <= 2.5x) {met}"
    )
