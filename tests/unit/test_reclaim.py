"""The reclaim decision on counts (core/reclaim.py): which slots count for the head,
the built-in choice, and the rules a site policy's answer is held to."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from xce_resize_plugin.core.models import JobState, Task, TasksInIdOrder
from xce_resize_plugin.core.reclaim import (
    QueueHead,
    ReclaimCandidate,
    ReclaimHead,
    check_selection,
    default_selection,
    freed_by,
    reclaim_in_order,
    same_head,
    short_after,
)
from xce_resize_plugin.errors import PolicyRejected
from xce_resize_plugin.testing import make_job


def head(
    tasks: int,
    free: dict[str, int],
    ptile: int | None = None,
    unusable: frozenset[str] = frozenset(),
) -> ReclaimHead:
    return ReclaimHead(make_job({}, id="9", state=JobState.PEND), tasks, ptile, free, unusable)


def cand(job_id: str, alloc: dict[str, int], minimum: int, start: float = 0.0) -> ReclaimCandidate:
    j = make_job(alloc, id=job_id, min_tasks=minimum, start_time=start)
    return ReclaimCandidate(j, j.tasks[1:], len(j.tasks) - minimum)


def test_short_counts_slots_up_to_the_ptile_on_usable_hosts() -> None:
    h = head(4, {"a": 3, "b": 1}, ptile=2, unusable=frozenset({"c"}))
    assert h.short() == 1  # a counts 2 (ptile), b 1
    assert h.short({"a": 1}) == 1  # a is already at its ptile
    assert h.short({"c": 4}) == 1  # c never counts
    assert h.short({"b": 1}) == 0
    assert (h.gain("a", {}), h.gain("b", {}), h.gain("c", {}), h.gain("d", {})) == (0, 1, 0, 1)
    assert head(4, {"a": 3}).short({"a": 1}) == 0  # no ptile: every slot counts


def test_default_takes_the_largest_excess_and_the_newest_tasks_first() -> None:
    small = cand("1", {"a": 3}, 1)  # excess 2
    big = cand("2", {"b": 5}, 1)  # excess 4
    assert default_selection(head(3, {"c": 1}), [small, big]) == {"2": [4, 3]}
    # Ties: the newest job first, then by id.
    old, new = cand("3", {"a": 3}, 1, start=10.0), cand("4", {"b": 3}, 1, start=20.0)
    assert default_selection(head(1, {}), [old, new]) == {"4": [2]}
    # Never more than a job's excess, never task 0: both jobs at their minimum.
    assert default_selection(head(9, {}), [small, big]) == {"2": [4, 3, 2, 1], "1": [2, 1]}


def test_default_skips_tasks_whose_slots_would_not_count() -> None:
    # ptile 1: the head needs two hosts; b already has a free slot, so only a slot freed
    # on a counts, and the job's newest tasks (on b) are passed over.
    j = cand("1", {"a": 2, "b": 3}, 1)
    h = head(2, {"b": 1}, ptile=1)
    assert default_selection(h, [j]) == {"1": [1]}
    assert freed_by({"1": [1]}, [j]) == {"a": 1}


@pytest.mark.parametrize(
    ("selection", "message"),
    [
        ({"5": [1]}, "not a candidate"),
        ({"1": [0]}, r"returned \[0\] for job 1, whose releasable tasks are 1-3$"),
        ({"1": [1, 1]}, "releasable"),
        ({"1": [7]}, "releasable"),
        ({"1": [1, 2, 3]}, "may give 2"),
    ],
)
def test_a_policy_answer_that_breaks_the_rules_is_refused(
    selection: dict[str, list[int]], message: str
) -> None:
    with pytest.raises(PolicyRejected, match=message):
        check_selection(selection, [cand("1", {"a": 4}, 2)])


@settings(max_examples=200, deadline=None)
@given(
    st.integers(0, 40),
    st.dictionaries(st.sampled_from("abcdefgh"), st.integers(1, 5), max_size=8),
    st.dictionaries(st.sampled_from("abcdefghij"), st.integers(1, 5), max_size=10),
    st.frozensets(st.sampled_from("ij")),
)
def test_a_known_free_total_judges_as_the_hosts_do(
    tasks: int, free: dict[str, int], freed: dict[str, int], unusable: frozenset[str]
) -> None:
    """A head without ptile judged on the free total the host gave (no walk over the
    hosts) is as short as one judged host by host, for any slots freed anywhere."""
    job = make_job({}, id="9", state=JobState.PEND)
    by_hosts = ReclaimHead(job, tasks, None, free, unusable)
    by_total = ReclaimHead(job, tasks, None, free, unusable, sum(free.values()))
    assert by_total.short() == by_hosts.short()
    assert by_total.short(freed) == by_hosts.short(freed)
    assert [by_total.gain(h, freed) for h in "acij"] == [by_hosts.gain(h, freed) for h in "acij"]


_heads = st.builds(
    QueueHead,
    st.sampled_from(["1", "2"]),
    st.integers(1, 4),
    st.sampled_from([None, 2]),
    st.sampled_from([10.0, 20.0]),
    st.dictionaries(st.sampled_from("abc"), st.integers(1, 2), max_size=3),
    st.sampled_from([frozenset(), frozenset({"c"})]),
    st.sampled_from([(), ("3",)]),
    st.sampled_from([None, 1, 2]),
    st.sampled_from([None, 0, 3]),
)


@given(_heads, _heads)
def test_heads_are_the_same_exactly_when_equal(a: QueueHead, b: QueueHead) -> None:
    """The reclaim's cheap comparison of the head it decided for (fields that differ
    most often first) says what equality says, and an object is its own head."""
    assert same_head(a, b) == (a == b)
    assert same_head(a, a) and not same_head(a, None)


def _one_by_one(h: ReclaimHead, candidates: list[ReclaimCandidate]) -> dict[str, list[int]]:
    """The built-in choice spelled out task by task: each job's newest tasks first, up
    to its excess, those whose slot counts for the head, until the head fits."""
    freed: dict[str, int] = {}
    out: dict[str, list[int]] = {}
    need = h.short()
    for c in candidates:
        taken = 0
        for task in sorted(c.releasable, key=lambda t: -t.id):
            if need <= 0 or taken >= c.excess:
                break
            if h.gain(task.host, freed):
                out.setdefault(c.job.id, []).append(task.id)
                freed[task.host] = freed.get(task.host, 0) + 1
                taken, need = taken + 1, need - 1
    return out


@settings(max_examples=200, deadline=None)
@given(
    st.integers(0, 30),
    st.dictionaries(st.sampled_from("abcd"), st.integers(1, 3), max_size=4),
    st.lists(
        st.tuples(
            st.dictionaries(st.sampled_from("abcdef"), st.integers(1, 6), min_size=1),
            st.integers(1, 4),
        ),
        max_size=4,
    ),
    st.one_of(st.none(), st.integers(1, 3)),
    st.frozensets(st.sampled_from("ef")),
)
def test_the_order_takes_what_a_task_by_task_walk_takes(
    tasks: int,
    free: dict[str, int],
    jobs: list[tuple[dict[str, int], int]],
    ptile: int | None,
    unusable: frozenset[str],
) -> None:
    """``reclaim_in_order`` (which takes a job's newest tasks in one slice when every
    freed slot counts) chooses what a walk over each job's tasks, newest first, does."""
    h = head(tasks, free, ptile, unusable)
    candidates = [
        cand(str(i), alloc, max(1, min(minimum, sum(alloc.values()))))
        for i, (alloc, minimum) in enumerate(jobs)
    ]
    assert reclaim_in_order(h, candidates) == _one_by_one(h, candidates)


@settings(max_examples=200, deadline=None)
@given(
    st.integers(0, 30),
    st.dictionaries(st.sampled_from("abcd"), st.integers(1, 3), max_size=4),
    st.dictionaries(st.sampled_from("abcdef"), st.integers(1, 6), min_size=1),
    st.one_of(st.none(), st.integers(1, 3)),
    st.frozensets(st.sampled_from("ef")),
    st.booleans(),
    st.data(),
)
def test_what_a_selection_leaves_short_is_counted_as_the_hosts_count_it(
    tasks: int,
    free: dict[str, int],
    alloc: dict[str, int],
    ptile: int | None,
    unusable: frozenset[str],
    total_known: bool,
    data: st.DataObject,
) -> None:
    """``short_after`` (a count when every freed slot counts) is what the head is short
    once the selection's slots, host by host, are freed."""
    job = make_job({}, id="9", state=JobState.PEND)
    total = sum(free.values()) if total_known else None
    h = ReclaimHead(job, tasks, ptile, free, unusable, total)
    c = cand("1", alloc, 1)
    releasable = [t.id for t in c.releasable]
    ids = data.draw(st.lists(st.sampled_from(releasable), unique=True)) if releasable else []
    assert short_after(h, {"1": ids}, [c]) == h.short(freed_by({"1": ids}, [c]))


class _InIdOrder(TasksInIdOrder):
    """A plain tuple that says its ids ascend (as a host's own task list does)."""

    def __init__(self, tasks: tuple[Task, ...]) -> None:
        self._tasks = tasks

    def __len__(self) -> int:
        return len(self._tasks)

    def __getitem__(self, i):  # type: ignore[no-untyped-def]
        return self._tasks[i]


@settings(max_examples=200, deadline=None)
@given(
    st.one_of(
        st.lists(st.integers(1, 12), min_size=1, max_size=10, unique=True).map(sorted),
        st.tuples(st.integers(1, 5), st.integers(1, 8)).map(lambda t: list(range(t[0], sum(t)))),
    ),
    st.lists(st.integers(-2, 14), max_size=6),
)
def test_a_list_in_id_order_is_checked_as_any_list(ids: list[int], chosen: list[int]) -> None:
    """``check_selection`` accepts and refuses the same answers whether the releasable
    tasks are a list in id order (checked by its first and last id when it has no gap)
    or a plain tuple."""
    tasks = tuple(Task(i, f"h{i % 3}") for i in ids)
    job = make_job({"h0": 1}, id="1", min_tasks=1)
    verdicts = []
    for releasable in (tasks, _InIdOrder(tasks)):
        c = ReclaimCandidate(job, releasable, len(tasks))
        try:
            check_selection({"1": chosen}, [c])
            verdicts.append("ok")
        except PolicyRejected as exc:
            verdicts.append(str(exc))
    assert verdicts[0] == verdicts[1]
