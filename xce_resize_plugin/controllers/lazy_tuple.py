"""A sequence standing for a tuple made only when first needed.

A placement of the scheduler (:class:`~.slots.Placement`) and a started job's task list
(:class:`~.lazy.TaskList`) stand for tuples that a job of many hosts mostly never needs
(docs/performance.md, "Allocations as runs of hosts"). Both read, compare and hash as
those tuples through :class:`LazyTuple`.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Iterator, Sequence
from typing import TypeVar, overload

__all__ = ["LazyTuple"]

T = TypeVar("T")


class LazyTuple(Sequence[T]):
    """A sequence standing for a tuple that :meth:`as_tuple` makes (once) when first
    needed: read, compared (with a tuple or list either way round) and hashed as it."""

    __slots__ = ()

    @abstractmethod
    def as_tuple(self) -> tuple[T, ...]:
        """The tuple itself (made at the first call)."""

    @overload
    def __getitem__(self, i: int) -> T: ...

    @overload
    def __getitem__(self, i: slice) -> Sequence[T]: ...

    def __getitem__(self, i: int | slice) -> T | Sequence[T]:
        return self.as_tuple()[i]

    def __iter__(self) -> Iterator[T]:
        return iter(self.as_tuple())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, LazyTuple):
            return self.as_tuple() == other.as_tuple()
        if isinstance(other, (tuple, list)):
            return self.as_tuple() == tuple(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.as_tuple())
