r"""Maps and task lists made only when someone reads them.

A job started on thousands of hosts has per-host and per-task maps (the hosts it holds,
its task ids) that the trace simulation mostly never reads: the job ends and they are
dropped. :class:`Unfolded` stands for such a map and builds it at the first read or
change; until then it knows only its size. Code that holds one sees the same object
before and after, so a view kept by the scheduler stays live. :class:`TaskList` does
the same for the job's tasks (what the plugin's job view carries), as a
:class:`~.lazy_tuple.LazyTuple` like a placement of the scheduler.
"""

from __future__ import annotations

from collections.abc import (
    Callable,
    ItemsView,
    Iterable,
    Iterator,
    KeysView,
    MutableMapping,
    Sequence,
    ValuesView,
)
from itertools import islice
from typing import TypeVar, overload

from xce_resize_plugin.controllers.lazy_tuple import LazyTuple
from xce_resize_plugin.controllers.placement_runs import Placement
from xce_resize_plugin.core.models import Task, TasksInIdOrder, make_tasks

__all__ = ["TaskList", "Unfolded"]

K = TypeVar("K")
V = TypeVar("V")


class Unfolded(MutableMapping[K, V]):
    """A dict built by ``make`` (a mapping of ``size`` keys) when first used."""

    __slots__ = ("_dict", "_make", "_size")

    def __init__(self, make: Callable[[], dict[K, V]], size: int) -> None:
        self._make: Callable[[], dict[K, V]] | None = make
        self._dict: dict[K, V] | None = None
        self._size = size

    @property
    def folded(self) -> bool:
        """Whether the dict is still to be made."""
        return self._dict is None

    def refold(self, make: Callable[[], dict[K, V]], size: int) -> None:
        """Stand for another map, made by ``make`` when first used: the same object, so
        that a view holding it stays live (a job's maps after a shrink)."""
        self._make, self._dict, self._size = make, None, size

    def unfold(self) -> dict[K, V]:
        """The dict itself (made now if need be)."""
        d = self._dict
        if d is None:
            assert self._make is not None
            d = self._dict = self._make()
            self._make = None
        return d

    def __len__(self) -> int:
        return self._size if self._dict is None else len(self._dict)

    def __getitem__(self, key: K) -> V:
        return self.unfold()[key]

    def __setitem__(self, key: K, value: V) -> None:
        self.unfold()[key] = value

    def __delitem__(self, key: K) -> None:
        del self.unfold()[key]

    def __iter__(self) -> Iterator[K]:
        return iter(self.unfold())

    def __contains__(self, key: object) -> bool:
        return key in self.unfold()

    def get(self, key: K, default: V | None = None) -> V | None:  # type: ignore[override]
        return self.unfold().get(key, default)

    def keys(self) -> KeysView[K]:
        return self.unfold().keys()

    def items(self) -> ItemsView[K, V]:
        return self.unfold().items()

    def values(self) -> ValuesView[V]:
        return self.unfold().values()

    def clear(self) -> None:
        self._dict = {}
        self._make = None

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Unfolded):
            other = other.unfold()
        return self.unfold() == other

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Unfolded({self.unfold()!r})"


class TaskList(LazyTuple[Task], TasksInIdOrder):
    """A started job's tasks ``start..n-1`` (``0..n-1`` unless a slice) in allocation
    order, made when first read.

    Stands for ``tuple(Task(i, host) ...)`` of a placement of many hosts: its length,
    any one task (by bisection over the placement's runs), its tail slices and its
    tasks from the end are had without making the others. Allocation order is id
    order (:class:`~xce_resize_plugin.core.models.TasksInIdOrder`): the plugin takes a
    shrink's newest tasks from the end.
    """

    __slots__ = ("_tasks", "placement", "start")

    def __init__(self, placement: Placement, start: int = 0) -> None:
        self.placement = placement
        self.start = start
        self._tasks: tuple[Task, ...] | None = None

    def as_tuple(self) -> tuple[Task, ...]:
        """The tasks as a tuple (made at the first call)."""
        tasks = self._tasks
        if tasks is None:
            p, start = self.placement, self.start
            hosts = p.task_hosts()
            if start:
                hosts = islice(hosts, start, None)
            tasks = self._tasks = make_tasks(range(start, p.total), list(hosts))
        return tasks

    def __len__(self) -> int:
        return self.placement.total - self.start

    def task_hosts(self) -> Iterable[str]:
        """The host of each task in order, without making the tasks."""
        if self._tasks is not None:
            return super().task_hosts()
        hosts = self.placement.task_hosts()
        return islice(hosts, self.start, None) if self.start else hosts

    def id_host_pairs(self) -> Iterable[tuple[int, str]]:
        return zip(range(self.start, self.placement.total), self.task_hosts(), strict=True)

    def host_positions(self) -> tuple[Sequence[str], list[tuple[int, int, int]]] | None:
        p = self.placement
        if self._tasks is not None or p.runs is None or p.names is None:
            return None
        runs: list[tuple[int, int, int]] = []
        skip = self.start  # a tail slice: its first tasks may fall inside a run
        for first, n, take in p.runs:
            if skip >= n * take:
                skip -= n * take
                continue
            if skip:
                hosts_skipped, into = divmod(skip, take)
                first, n, skip = first + hosts_skipped, n - hosts_skipped, 0
                if into:
                    # The rest of a host whose first tasks are before the slice.
                    runs.append((first, 1, take - into))
                    first, n = first + 1, n - 1
                    if not n:
                        continue
            runs.append((first, n, take))
        return p.names, runs

    @overload
    def __getitem__(self, i: int) -> Task: ...

    @overload
    def __getitem__(self, i: slice) -> Sequence[Task]: ...

    def __getitem__(self, i: int | slice) -> Task | Sequence[Task]:
        if self._tasks is not None:
            return self._tasks[i]
        if isinstance(i, slice):
            first, stop, step = i.indices(len(self))
            n = len(self)
            if step != 1 or first >= stop or (first == 0 and stop == n):
                return self.as_tuple()[i]
            if stop == n:
                return TaskList(self.placement, self.start + first)
            if self.placement.runs is None:
                return self.as_tuple()[i]
            # Its first tasks: the placement's first runs (the plugin's state after a
            # release of the job's newest tasks), made without the tasks.
            head, _ = self.placement.split(self.start + stop)
            return TaskList(head, self.start + first)
        n = len(self)
        k = i + n if i < 0 else i
        if not 0 <= k < n:
            raise IndexError("task index out of range")
        return Task(self.start + k, self.placement.task_host(self.start + k))

    def __reversed__(self) -> Iterator[Task]:
        if self._tasks is not None:
            return reversed(self._tasks)
        p = self.placement
        # map() stops with the ids: a slice's tasks end at its first.
        return map(Task, range(p.total - 1, self.start - 1, -1), p.task_hosts_reversed())

    def __repr__(self) -> str:
        return repr(self.as_tuple())

    def __reduce__(self) -> tuple[type[tuple[Task, ...]], tuple[tuple[Task, ...]]]:
        # Pickled (sent to another process) as the plain tuple it stands for: its
        # placement refers to the whole cluster's host names.
        return (tuple, (self.as_tuple(),))
