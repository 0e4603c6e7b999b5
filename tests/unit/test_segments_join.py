"""Joining what two segments of a split run listed (simulation/segments.py): the
problems of a check as one process lists them, at most MAX_PROBLEMS, the count exact."""

from __future__ import annotations

from xce_resize_plugin.simulation.checks import MAX_PROBLEMS, Check
from xce_resize_plugin.simulation.segments import Mark, _join_checks


def _mark(problems: list[str], count: int) -> Mark:
    return Mark(
        waits=0,
        usage_steps=0,
        peaks=(0, 0.0, 0),
        counters=(),
        problems=(tuple(problems),),
        counts=(count,),
        requests=0,
        refused={},
        warnings=(),
        rows=0,
    )


def _check(found: list[str]) -> Check:
    check = Check()
    for text in found:
        check.problem(text)
    return check


def test_problem_lists_join_as_one_process_lists_them() -> None:
    before = [f"p{i}" for i in range(8)]  # what the run found up to the meeting
    after = [f"p{i}" for i in range(8, 40)]  # and after it, in every segment alike
    one = _check(before + after)
    head = _check(before)
    # The successor found other problems before the meeting (its own start), filled
    # its list at the mark, restarted it, and went on: two marks after the meeting.
    early = [f"q{i}" for i in range(25)]
    at = _mark(early[:MAX_PROBLEMS], len(early))
    later = [_mark(after[:3], len(early) + 3), _mark(after[3:5], len(early) + 5)]
    tail = Check()
    tail.count = len(early) + 5
    for text in after[5:]:
        tail.problem(text)
    _join_checks([head], [tail], at, later)
    assert head.problems == one.problems and len(head.problems) == MAX_PROBLEMS
    assert head.count == one.count == 40
    assert head.finish() == one.finish()
