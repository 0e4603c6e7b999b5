"""The benchmarks' machine reference (tests/benchmarks/machine.py) must stay the same
work from one version to the next, or days could no longer be compared by it."""

from __future__ import annotations

import math

from tests.benchmarks import machine


def test_the_reference_work_is_fixed() -> None:
    # Recorded when the reference was introduced (2026-12-05): changing the work changes
    # these counts, and the figures in docs/performance.md could no longer be compared.
    assert machine._work(1_000) == 456
    assert machine._work(10_000) == 4_283
    assert machine.JOBS == 700_000


def test_the_reference_is_a_time_measured() -> None:
    # No bound on the time itself: the suite asserts no timing (docs/performance.md).
    seconds = machine.reference_seconds(repeat=2, jobs=2_000)
    assert math.isfinite(seconds) and seconds > 0
