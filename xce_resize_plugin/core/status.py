"""What a job's resize looks like from outside: the answer to a request or a query."""

from __future__ import annotations

from collections.abc import Sequence

from attrs import frozen

from xce_resize_plugin.core.models import ChangeKind, PendingGrow, Phase, Target, Task


@frozen
class ResizeStatus:
    """The job's resize state as REST, ``bresize`` and scenarios report it.

    ``tasks`` is the committed allocation; ``in_flight`` the kind and tasks of the
    change in flight, if any; ``pending`` the pending grow, if any (``pending.auto``:
    the autoresize demand); ``autoresize`` whether autoresize is on; ``target`` the
    job's target size, if one is set.
    """

    job_id: str
    phase: Phase
    tasks: Sequence[Task]
    min_tasks: int
    max_tasks: int
    version: int
    pending: PendingGrow | None = None
    in_flight: ChangeKind | None = None
    in_flight_tasks: Sequence[Task] = ()
    autoresize: bool = False
    target: Target | None = None

    @property
    def demand(self) -> PendingGrow | None:
        """The autoresize demand: the pending grow when the plugin keeps it."""
        pending = self.pending
        return pending if pending is not None and pending.auto else None
