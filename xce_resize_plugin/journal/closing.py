"""A base for objects used in ``with`` blocks that release what they hold on exit."""

from __future__ import annotations

from types import TracebackType
from typing import Self


class Closing:
    """``with obj:`` gives ``obj`` and calls :meth:`close` on the way out."""

    def close(self) -> None:
        """Release what the object holds. Idempotent."""
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
