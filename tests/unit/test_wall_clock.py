"""The live controller's clock never goes back (controllers/live/wall_clock.py), and the
plugin's charge timeline stays in order whatever times it is given (core/fold.py)."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
from hypothesis import given
from hypothesis import strategies as st

from xce_resize_plugin.controllers.live.wall_clock import WallClock
from xce_resize_plugin.core.accounting import segments
from xce_resize_plugin.core.fold import charge_steps


def _source(times: list[float]) -> Iterator[float]:
    yield from times


def test_a_step_back_is_held_until_wall_time_catches_up(caplog: pytest.LogCaptureFixture) -> None:
    times = _source([10.0, 20.0, 15.0, 18.5, 19.9, 25.0, 24.5, 26.0])
    clock = WallClock(source=lambda: next(times))
    with caplog.at_level(logging.WARNING, logger="xce_resize_plugin.controllers.live.wall_clock"):
        seen = [clock.now() for _ in range(8)]
    assert seen == [10.0, 20.0, 20.0, 20.0, 20.0, 25.0, 25.0, 26.0]
    told = [r.getMessage() for r in caplog.records]
    # The 5 s step is told once, and its end; the half-second one is only absorbed.
    assert len(told) == 2
    assert told[0].startswith("the wall clock went back 5.000 s")
    assert told[1].startswith("the wall clock has caught up")


def test_a_release_stamped_before_its_grow_counts_nothing_twice() -> None:
    """A grow stamped 2000, then (the clock stepped back 500 s) a release stamped
    1500: before, the 4-slot stretch vanished and 1500-1600 was counted twice."""
    steps = charge_steps(charge_steps(((1000.0, 2),), 2000.0, 4), 1500.0, 2)
    assert steps == ((1000.0, 2),)
    assert sum(s.slot_seconds for s in segments(steps, 1600.0)) == 1200.0


@given(
    st.lists(
        st.tuples(st.floats(0, 1e6, allow_nan=False), st.integers(0, 64)), min_size=1, max_size=30
    ),
    st.floats(0, 2e6, allow_nan=False),
)
def test_the_timeline_stays_in_order_and_bounded(
    stamps: list[tuple[float, int]], end: float
) -> None:
    """Whatever order the steps' times come in, the timeline's times strictly
    increase, its last step holds what was last asked, and the usage is at most the
    most slots ever held for the time from its first step to the end."""
    steps: tuple[tuple[float, int], ...] = (stamps[0],)
    for at, slots in stamps[1:]:
        steps = charge_steps(steps, at, slots)
    times = [t for t, _ in steps]
    assert times == sorted(set(times))
    assert steps[-1][1] == stamps[-1][1]
    used = sum(s.slot_seconds for s in segments(steps, end))
    most = max(n for _, n in stamps)
    assert used <= most * max(0.0, end - steps[0][0]) * (1 + 1e-9)
