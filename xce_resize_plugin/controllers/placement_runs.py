"""A job's placement as *runs* of consecutive hosts taking the same number of tasks each.

:meth:`.slots.FreeSlots.place` makes a :class:`Placement` of runs. Taking it, charging it
(the cluster) and freeing it again cost a few steps per run, not per host: a job of a
thousand one-slot hosts placed in host order is one or a few runs. The ``(host, tasks)``
pairs are made only when something reads them.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable, Iterator, Sequence
from itertools import accumulate, chain, repeat
from operator import itemgetter

from xce_resize_plugin.controllers.lazy_tuple import LazyTuple

__all__ = ["Placement", "Run"]

#: ``(first host position, hosts, tasks per host)``: consecutive hosts of a placement.
Run = tuple[int, int, int]
_count_of = itemgetter(1)


class Placement(LazyTuple[tuple[str, int]]):
    """``(host, tasks)`` pairs in allocation order, and their ``total`` of tasks.

    Made from pairs, or by :meth:`.slots.FreeSlots.place` as runs of hosts (see the module
    docstring): then :attr:`runs` and :attr:`names` (the hosts in position order)
    are set and the pairs are made only when read (:meth:`as_tuple`).
    """

    __slots__ = ("_ends", "_pairs", "names", "runs", "total")

    def __init__(self, pairs: Iterable[tuple[str, int]] = ()) -> None:
        self._pairs: tuple[tuple[str, int], ...] | None = tuple(pairs)
        self.names: Sequence[str] | None = None
        self.runs: tuple[Run, ...] | None = None
        self.total: int = sum(map(_count_of, self._pairs))
        self._ends: list[int] | None = None

    @classmethod
    def of_runs(cls, names: Sequence[str], runs: Iterable[Run]) -> Placement:
        """The placement of ``runs`` over the hosts ``names`` (in position order)."""
        self = cls.__new__(cls)
        self._pairs = None
        self.names = names
        self.runs = tuple(runs)
        self.total = sum(n * take for _, n, take in self.runs)
        self._ends = None
        return self

    def as_tuple(self) -> tuple[tuple[str, int], ...]:
        return self.pairs()

    def split(self, m: int) -> tuple[Placement, tuple[Run, ...]]:
        """Its first ``m`` tasks as a placement of runs, and the runs of the others (a
        host whose tasks fall on both sides is in both, with its share): a shrink that
        releases a job's newest tasks keeps the rest as runs. Only for runs."""
        names, runs = self.names, self.runs
        assert names is not None and runs is not None, "split() is for runs"
        head: list[Run] = []
        tail: list[Run] = []
        left = m
        for first, n, take in runs:
            size = n * take
            if left >= size:
                head.append((first, n, take))
                left -= size
                continue
            if not left:
                tail.append((first, n, take))
                continue
            full, part = divmod(left, take)
            if full:
                head.append((first, full, take))
            at, rest = first + full, n - full
            if part:  # this host's first tasks stay, its others go
                head.append((at, 1, part))
                tail.append((at, 1, take - part))
                at, rest = at + 1, rest - 1
            if rest:
                tail.append((at, rest, take))
            left = 0
        return Placement.of_runs(names, head), tuple(tail)

    def pairs(self) -> tuple[tuple[str, int], ...]:
        """The ``(host, tasks)`` pairs (made at the first call for runs)."""
        if self._pairs is None:
            names, runs = self.names, self.runs
            assert names is not None and runs is not None
            self._pairs = tuple(
                chain.from_iterable(
                    zip(names[first : first + n], repeat(take, n), strict=True)
                    for first, n, take in runs
                )
            )
        return self._pairs

    def hosts(self) -> Iterator[str]:
        """The hosts in allocation order, each once per pair."""
        if self._pairs is None and self.runs is not None and self.names is not None:
            names = self.names
            return chain.from_iterable(names[f : f + n] for f, n, _ in self.runs)
        return map(itemgetter(0), self.pairs())

    def task_hosts(self) -> Iterator[str]:
        """The host of each task ``0..total-1`` in allocation order."""
        if self._pairs is None and self.runs is not None and self.names is not None:
            # From the runs, without making the pairs: a run of one task per host is
            # its slice of the names.
            names = self.names
            return chain.from_iterable(
                names[f : f + n]
                if take == 1
                else chain.from_iterable(map(repeat, names[f : f + n], repeat(take, n)))
                for f, n, take in self.runs
            )
        return chain.from_iterable(map(repeat, self.hosts(), map(_count_of, self)))

    def task_host(self, k: int) -> str:
        """The host of task ``k`` (``0 <= k < total``), found among the runs (or pairs)
        by bisection, without making the other tasks' hosts."""
        if not 0 <= k < self.total:
            raise IndexError(f"task {k} of a placement of {self.total}")
        runs = self.runs  # fixed for the placement's life: the ends are of runs, or pairs
        ends = self._ends
        if ends is None:
            steps = (
                (n * take for _, n, take in runs)
                if runs is not None
                else map(_count_of, self.pairs())
            )
            ends = self._ends = list(accumulate(steps))
        i = bisect_right(ends, k)
        if runs is None:
            return self.pairs()[i][0]
        first, _, take = runs[i]
        names = self.names
        assert names is not None
        return names[first + (k - (ends[i - 1] if i else 0)) // take]

    def task_hosts_reversed(self) -> Iterator[str]:
        """The host of each task, from task ``total-1`` down to task 0."""
        if self._pairs is None and self.runs is not None and self.names is not None:
            names = self.names
            return chain.from_iterable(
                chain.from_iterable(map(repeat, reversed(names[f : f + n]), repeat(take, n)))
                for f, n, take in reversed(self.runs)
            )
        pairs = self.pairs()
        return chain.from_iterable(
            map(repeat, map(itemgetter(0), reversed(pairs)), map(_count_of, reversed(pairs)))
        )

    def host_count(self) -> int:
        """How many pairs (hosts), without making them."""
        if self._pairs is None and self.runs is not None:
            return sum(n for _, n, _ in self.runs)
        return len(self.pairs())

    def __len__(self) -> int:
        return self.host_count()

    def __repr__(self) -> str:
        return f"Placement({self.pairs()!r})"

    def __reduce__(self) -> tuple[type[Placement], tuple[tuple[tuple[str, int], ...]]]:
        # Pickled as its pairs: the runs refer to the whole cluster's host names.
        return (Placement, (self.pairs(),))
