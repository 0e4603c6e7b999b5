"""A job's allocation as a sequence of tasks, read without being copied.

The plugin keeps a job's committed allocation in its state (``ResizeState.tasks``), in
its first fact (``JobTracked``), in a release (``ReleaseAccepted``) and in resize
records. A host may give a job's tasks as a :class:`~.models.TasksInIdOrder` that makes
its tasks only when they are read (the embedded controller's list of a job of tens of
thousands of hosts does). Copying it into a tuple on the job's first resize, and then
filtering every task of it at each release, cost a job of many hosts time in proportion
to its size at every resize (docs/performance.md, "Allocations the plugin does not
copy"). The functions here keep such a list as it is where the result is one of its
slices: the tasks a release of its newest tasks takes, and the tasks it keeps.

Every function returns what its plain form (written next to it) returns, element for
element; only the type of the sequence may differ. Their fast paths rest on what
:class:`~.models.TasksInIdOrder` promises: ids strictly ascending (a job's task ids are
unique), slices in id order too, and a list that never changes.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from itertools import compress
from operator import attrgetter, not_

from xce_resize_plugin.core.models import Task, TasksInIdOrder

__all__ = [
    "as_kept",
    "describe_ids",
    "id_range",
    "joined",
    "next_task_id",
    "plain_ints",
    "task_ids",
    "with_ids",
    "without_ids",
]

_id_of = attrgetter("id")

_INT = frozenset({int})


def plain_ints(values: Iterable[object]) -> bool:
    """Whether every value is a plain ``int`` (not a bool, not an integer of another
    kind), checked at C speed: a site's answer may name thousands of task ids."""
    return set(map(type, values)) <= _INT


#: The most runs of ids :func:`describe_ids` writes out.
_RUNS_SHOWN = 8


def describe_ids(ids: Iterable[int]) -> str:
    """Task ids for a message, as runs (``0-63, 70, 72-90``), at most a few of them
    (``..., 4,096 ids in all``): a message about a job of many thousand tasks stays a
    line, whatever the job's size."""
    ordered = sorted(set(ids))
    runs: list[tuple[int, int]] = []
    for i in ordered:
        if runs and runs[-1][1] == i - 1:
            runs[-1] = (runs[-1][0], i)
        else:
            runs.append((i, i))
    shown = ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs[:_RUNS_SHOWN])
    if len(runs) > _RUNS_SHOWN:
        shown += f", ... {len(ordered):,} ids in all"
    return shown or "none"


def as_kept(tasks: Sequence[Task]) -> Sequence[Task]:
    """``tasks`` as the plugin keeps them: a host's :class:`TasksInIdOrder` as it is
    (it does not change), anything else copied into a tuple (``tuple(tasks)``)."""
    if isinstance(tasks, TasksInIdOrder | tuple):
        return tasks
    return tuple(tasks)


def id_range(tasks: Sequence[Task]) -> range | None:
    """The ids of ``tasks`` as a range, when ``tasks`` is a :class:`TasksInIdOrder`
    without gaps (its last id minus its first is its length minus one): then task ``i``
    has id ``first + i``. ``None`` for any other sequence (and an empty one)."""
    if not isinstance(tasks, TasksInIdOrder):
        return None
    n = len(tasks)
    if not n:
        return None
    first, last = tasks[0].id, tasks[-1].id
    if last - first != n - 1:
        return None
    return range(first, last + 1)


def task_ids(tasks: Sequence[Task]) -> tuple[int, ...]:
    """The ids of ``tasks`` in their order (``tuple(t.id for t in tasks)``)."""
    ids = id_range(tasks)
    if ids is not None:
        return tuple(ids)
    return tuple(map(_id_of, tasks))


def next_task_id(tasks: Sequence[Task]) -> int:
    """One more than the largest id (``max((t.id for t in tasks), default=-1) + 1``)."""
    if isinstance(tasks, TasksInIdOrder):
        return tasks[-1].id + 1 if len(tasks) else 0
    return max(map(_id_of, tasks), default=-1) + 1


def _newest(tasks: Sequence[Task], ids: Collection[int]) -> int | None:
    """How many of the newest tasks ``ids`` names, when ``ids`` are exactly the ids of
    the last ones of a gapless :class:`TasksInIdOrder` (what a release of the newest
    tasks names); ``None`` otherwise."""
    span = id_range(tasks)
    if span is None:
        return None
    k = len(ids)
    if not k:
        return 0
    if k > len(span):
        return None
    # k distinct ints (a set, or a collection without repeats: checked) of which the
    # least is the k-th newest id and the greatest the newest are exactly those k.
    if set(map(type, ids)) != {int}:
        return None  # (an id 4.5 between two others matches no task; True is 1)
    if not isinstance(ids, set | frozenset) and len(set(ids)) != k:
        return None
    if min(ids) != span[-k] or max(ids) != span[-1]:
        return None
    return k


def with_ids(tasks: Sequence[Task], ids: Collection[int]) -> Sequence[Task]:
    """The tasks whose ids are in ``ids``, in their order
    (``tuple(t for t in tasks if t.id in ids)``); a host's list's newest tasks as its
    own slice."""
    k = _newest(tasks, ids)
    if k is not None:
        return tasks[len(tasks) - k :] if k else ()
    return tuple(compress(tasks, map(ids.__contains__, map(_id_of, tasks))))


def without_ids(tasks: Sequence[Task], ids: Collection[int]) -> Sequence[Task]:
    """The tasks whose ids are not in ``ids``, in their order
    (``tuple(t for t in tasks if t.id not in ids)``); a host's list without its newest
    tasks as its own slice."""
    k = _newest(tasks, ids)
    if k is not None:
        return tasks[: len(tasks) - k] if k else tasks
    return tuple(compress(tasks, map(not_, map(ids.__contains__, map(_id_of, tasks)))))


def joined(first: Sequence[Task], then: Iterable[Task]) -> tuple[Task, ...]:
    """``first`` followed by ``then`` (``tuple(first) + tuple(then)``)."""
    return (*first, *then)
