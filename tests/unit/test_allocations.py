"""core/allocations.py: every function returns what its plain form returns, for a tuple,
for a host's list in id order and for such a list without gaps (where the fast paths
apply); the fast paths keep the host's list as its own slice."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from operator import attrgetter
from typing import Any, overload

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from xce_resize_plugin.core.allocations import (
    as_kept,
    describe_ids,
    id_range,
    joined,
    next_task_id,
    plain_ints,
    task_ids,
    with_ids,
    without_ids,
)
from xce_resize_plugin.core.models import Task, TasksInIdOrder


class _InOrder(TasksInIdOrder):
    """A host's list in id order over a tuple; counts the tasks read one by one and
    whether it was iterated whole (what the fast paths avoid)."""

    __slots__ = ("_tasks", "iterated", "reads")

    def __init__(self, tasks: Sequence[Task]) -> None:
        self._tasks = tuple(tasks)
        self.reads = 0
        self.iterated = False

    def __len__(self) -> int:
        return len(self._tasks)

    @overload
    def __getitem__(self, i: int) -> Task: ...

    @overload
    def __getitem__(self, i: slice) -> Sequence[Task]: ...

    def __getitem__(self, i: int | slice) -> Task | Sequence[Task]:
        if isinstance(i, slice):
            return _InOrder(self._tasks[i])
        self.reads += 1
        return self._tasks[i]

    def __iter__(self) -> Iterator[Task]:
        self.iterated = True
        return iter(self._tasks)


def _plain_with(tasks: Sequence[Task], ids: object) -> tuple[Task, ...]:
    return tuple(t for t in tasks if t.id in ids)  # type: ignore[operator]


def _plain_without(tasks: Sequence[Task], ids: object) -> tuple[Task, ...]:
    return tuple(t for t in tasks if t.id not in ids)  # type: ignore[operator]


@st.composite
def _allocations(draw: st.DrawFn) -> tuple[tuple[Task, ...], bool]:
    """Tasks with ascending ids (gapless from any first id, or with gaps) on a few
    hosts; and whether they are gapless."""
    n = draw(st.integers(0, 40))
    first = draw(st.integers(0, 5))
    gapless = draw(st.booleans())
    if gapless:
        ids = list(range(first, first + n))
    else:
        ids = sorted(draw(st.sets(st.integers(0, 80), max_size=n)))
    hosts = draw(st.lists(st.sampled_from("abcd"), min_size=len(ids), max_size=len(ids)))
    tasks = tuple(Task(i, h) for i, h in zip(ids, hosts, strict=True))
    return tasks, gapless or not ids or ids[-1] - ids[0] == len(ids) - 1


@st.composite
def _id_sets(draw: st.DrawFn, tasks: tuple[Task, ...]) -> object:
    """Ids to take: the newest k (what a release of the newest tasks names), any
    subset, ids not held, as a set, frozenset, list or tuple (with bools and floats
    among them now and then)."""
    held = [t.id for t in tasks]
    kind = draw(st.sampled_from(["newest", "newest", "nudged", "any", "foreign"]))
    if kind in ("newest", "nudged"):
        k = draw(st.integers(0, len(held)))
        chosen: list[object] = list(held[len(held) - k :])
        if kind == "nudged" and k >= 3:
            # One id between the least and the greatest moved off the ints.
            i = draw(st.integers(1, k - 2))
            chosen[i] = chosen[i] + draw(st.sampled_from([0.5, 0.0]))  # type: ignore[operator]
    elif kind == "any":
        chosen = list(draw(st.lists(st.sampled_from(held), unique=True))) if held else []
    else:
        chosen = list(draw(st.lists(st.integers(-2, 90), max_size=6)))
    if chosen and draw(st.integers(0, 4)) == 0:
        # An id that is no int: equal to one (True, 2.0) or between two (x + 0.5).
        odd = [True, False, 1.0, 2.0, 0.5, *(x + 0.5 for x in chosen)]  # type: ignore[operator]
        chosen[draw(st.integers(0, len(chosen) - 1))] = draw(st.sampled_from(odd))
    form = draw(st.sampled_from([set, frozenset, list, tuple]))
    return form(chosen)


@settings(max_examples=400, deadline=None)
@given(st.data())
def test_each_function_is_its_plain_form(data: st.DataObject) -> None:
    tasks, gapless = data.draw(_allocations())
    ids = data.draw(_id_sets(tasks))
    for seq in (tasks, _InOrder(tasks)):
        assert tuple(with_ids(seq, ids)) == _plain_with(tasks, ids)  # type: ignore[arg-type]
        assert tuple(without_ids(seq, ids)) == _plain_without(tasks, ids)  # type: ignore[arg-type]
        assert task_ids(seq) == tuple(t.id for t in tasks)
        assert next_task_id(seq) == max((t.id for t in tasks), default=-1) + 1
        assert tuple(as_kept(seq)) == tasks
        assert joined(seq, tasks[:2]) == tasks + tasks[:2]
    span = id_range(_InOrder(tasks))
    assert id_range(tasks) is None  # a plain tuple says nothing of its order
    if tasks and gapless:
        assert span is not None and list(span) == [t.id for t in tasks]
    else:
        assert span is None


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 60), st.integers(0, 5), st.data())
def test_a_release_of_the_newest_tasks_is_a_slice_of_the_hosts_list(
    n: int, first: int, data: st.DataObject
) -> None:
    """The fast paths read the list's ends, not its tasks, and give its own slices."""
    tasks = tuple(Task(first + i, f"h{i % 3}") for i in range(n))
    k = data.draw(st.integers(1, n))
    ids = {t.id for t in tasks[n - k :]}
    listed = _InOrder(tasks)
    taken, kept = with_ids(listed, ids), without_ids(listed, ids)
    assert not listed.iterated and listed.reads <= 4
    assert isinstance(taken, _InOrder) and isinstance(kept, (_InOrder, tuple))
    assert tuple(taken) == tasks[n - k :] and tuple(kept) == tasks[: n - k]
    assert task_ids(listed) == tuple(range(first, first + n)) and not listed.iterated


def test_a_list_in_id_order_is_kept_and_any_other_sequence_copied() -> None:
    tasks = [Task(0, "a"), Task(1, "b")]
    listed = _InOrder(tasks)
    assert as_kept(listed) is listed
    kept = as_kept(tasks)
    assert kept == tuple(tasks) and isinstance(kept, tuple)
    tasks.append(Task(2, "c"))  # the caller's list changing does not change the copy
    assert len(kept) == 2


def test_the_pairs_of_a_list_in_id_order_are_its_tasks() -> None:
    tasks = (Task(3, "a"), Task(4, "b"), Task(9, "a"))
    assert list(_InOrder(tasks).id_host_pairs()) == list(map(attrgetter("id", "host"), tasks))


@pytest.mark.parametrize(
    ("ids", "text"),
    [
        ([], "none"),
        ([5], "5"),
        ([3, 1, 2, 2], "1-3"),
        ([0, 1, 2, 7, 9, 10], "0-2, 7, 9-10"),
        (range(0, 40, 2), "0, 2, 4, 6, 8, 10, 12, 14, ... 20 ids in all"),
        (range(100_000), "0-99999"),
    ],
)
def test_ids_in_a_message_are_runs_and_a_few_of_them(ids: Any, text: str) -> None:
    assert describe_ids(ids) == text


class _Index:
    def __index__(self) -> int:
        return 3


@pytest.mark.parametrize(
    ("values", "plain"),
    [
        ([], True),
        ([1, 2, 3], True),
        (range(5), True),
        ([1, True], False),
        ([_Index()], False),
        ([1, 2.0], False),
    ],
)
def test_plain_ints_are_ints_only(values: Any, plain: bool) -> None:
    assert plain_ints(values) is plain
