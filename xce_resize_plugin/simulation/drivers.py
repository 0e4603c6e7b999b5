"""Drivers: who asks for resizes in a simulation, and when.

Nothing in a trace says when a malleable job would have asked to grow or been asked to
shrink; a driver plays that part, as an application or a site would. Drivers act at
each settled instant of the embedded controller's event loop (they are
:class:`~.observer.Observer` objects) and reach the plugin only through its public
paths: resize requests (``xce_resize_request``, through
:meth:`~.controller.EmbeddedController.request_resize`) whose outcome the plugin's
policy hooks decide. They never touch slots or allocations themselves.

- ``grow-when-idle`` (:class:`GrowWhenIdle`): when slots are idle after the host's
  pass, malleable jobs ask to grow toward their ``max``. The idle slots are shared out
  in order of how far below its maximum each job is (relative), then start time, then
  id; each job asks ``GrowRequest(1, share)``, so the plugin places what it can (the
  ``xce_resize_order_grow_hosts`` policy picks the hosts). While the queue's head is
  blocked, only the slots the head does not need at its reserved start count as idle
  (the controller runs with ``protect_reservation``, and the plugin is offered the same
  slots), so a grow never delays the head. The job asks as itself (its own job token,
  like the in-job API).
- ``shrink-for-queue`` (:class:`ShrinkForQueue`): the plugin's reclaim policy, as a
  site deploys it (``[resize] reclaim = "shrink"``): when the queue's head cannot start
  and shrinking malleable jobs toward their ``min`` would start it now, the plugin asks
  them to release (``xce_resize_select_reclaim`` chooses: by default the largest
  excess over ``min`` first, newest tasks first). It does nothing when even shrinking
  every malleable job to its minimum would not start the head: a reconfiguration that
  does not start anyone only costs. The driver itself asks for nothing.
- ``grow-shrink`` (the default, :class:`GrowShrink`): both; the reclaim happens in the
  scheduler cycle, before grows are asked.
- ``none``: no resize is ever asked for (malleable jobs keep their start size).

All requests are made with ``no_notify`` (no notification command per resize; trace
jobs have none, so reclaims run none either) and are placed, started or stopped
within the same instant; a grow the plugin could not place
at once is cancelled at the next settled instant rather than left pending.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from attrs import frozen

from xce_resize_plugin.controllers.observer import FinishedJob, Observer
from xce_resize_plugin.controllers.sim.work import SpeedupWork
from xce_resize_plugin.core.models import CancelRequest, GrowRequest, Phase, ReleaseRequest, Task
from xce_resize_plugin.errors import ResizeError
from xce_resize_plugin.host import Principal

if TYPE_CHECKING:
    from xce_resize_plugin.controllers.sim.sim_controller import EmbeddedController

__all__ = [
    "DRIVERS",
    "Driver",
    "GrowSettings",
    "GrowShrink",
    "GrowWhenIdle",
    "MalleableSpec",
    "NoDriver",
    "ShrinkForQueue",
    "make_driver",
]


@frozen
class MalleableSpec:
    """What a driver knows of a malleable job: its owner, range and recorded size, and
    (optionally) its work, from which it knows its own progress, as an application
    does."""

    user: str
    min_tasks: int
    max_tasks: int
    ref: int
    work: SpeedupWork | None = None


@frozen
class GrowSettings:
    """When malleable jobs ask to grow (``grow-when-idle``, and the grow half of
    ``grow-shrink``).

    :param margin: a job asks only if growing is expected to save it at least
        ``margin`` times the reconfiguration cost beyond paying for it (known from
        its :class:`~.work.SpeedupWork`; jobs without one always ask). An application
        does not stop to redistribute its data for a gain it will not see.
    :param when_queue_empty: ask only while no job waits in the queue.
    :param cooldown: seconds after a job's last resize (or its start) during which it
        does not ask to grow: applications reconfigure at their synchronisation points,
        not whenever a slot frees, and a job just shrunk for the queue should not take
        the slots back at once.
    """

    margin: float = 1.0
    when_queue_empty: bool = False
    cooldown: float = 0.0


class RequestCounts:
    """Requests a driver made, and those the plugin refused by error code."""

    __slots__ = ("refused", "requests")

    def __init__(self) -> None:
        self.requests = 0
        self.refused: dict[str, int] = {}


class Driver(Observer):
    """Base of the drivers: tracks the running malleable jobs and their sizes.

    :param specs: the malleable jobs (id -> :class:`MalleableSpec`); other jobs are
        ignored. Entries are dropped as jobs end.
    """

    name = "none"

    def __init__(self, specs: Mapping[str, MalleableSpec]) -> None:
        self._specs = dict(specs)
        #: Running malleable jobs: id -> committed size.
        self.sizes: dict[str, int] = {}
        self._start: dict[str, float] = {}
        #: When each running malleable job started or last changed size.
        self._last: dict[str, float] = {}
        #: Requests made and requests the plugin refused (by error code).
        self.counts = RequestCounts()
        #: Optional: called with (job id, request, error code or None) for each request.
        self.on_request: (
            Callable[
                [str, Principal, GrowRequest | ReleaseRequest | CancelRequest, str | None], None
            ]
            | None
        ) = None

    def add_spec(self, job_id: str, spec: MalleableSpec) -> None:
        """Tell the driver about a malleable job before it starts."""
        self._specs[job_id] = spec

    def resize_settings(self) -> dict[str, Any]:
        """Keys the run's ``[resize]`` section needs for this driver (over the user's):
        the shrinking drivers turn the plugin's reclaim policy on."""
        return {}

    # -- observer ---------------------------------------------------------------------

    def job_started(self, job_id: str, time: float, tasks: Sequence[Task]) -> None:
        if job_id in self._specs:
            self.sizes[job_id] = len(tasks)
            self._start[job_id] = time
            self._last[job_id] = time

    def allocation_committed(
        self, job_id: str, time: float, tasks: Sequence[Task], version: int
    ) -> None:
        if job_id in self.sizes:
            self.sizes[job_id] = len(tasks)
            self._last[job_id] = time

    def job_requeued(self, job_id: str, time: float) -> None:
        # Back in the queue: not running, but malleable still when it starts again.
        self.sizes.pop(job_id, None)
        self._start.pop(job_id, None)
        self._last.pop(job_id, None)

    def job_ended(self, job: FinishedJob) -> None:
        self._specs.pop(job.id, None)
        self.sizes.pop(job.id, None)
        self._start.pop(job.id, None)
        self._last.pop(job.id, None)

    # -- asking -----------------------------------------------------------------------

    @property
    def requests(self) -> int:
        return self.counts.requests

    @property
    def refused(self) -> dict[str, int]:
        return dict(sorted(self.counts.refused.items()))

    def _ask(
        self,
        ctl: EmbeddedController,
        principal: Principal,
        job_id: str,
        request: GrowRequest | ReleaseRequest | CancelRequest,
    ) -> bool:
        """Send one request through the plugin; ``False`` if it was refused."""
        counts = self.counts
        counts.requests += 1
        code: str | None = None
        try:
            ctl.request_resize(principal, job_id, request)
        except ResizeError as exc:
            code = exc.code
            counts.refused[code] = counts.refused.get(code, 0) + 1
        if self.on_request is not None:
            self.on_request(job_id, principal, request, code)
        return code is None


class NoDriver(Driver):
    """Never asks for anything."""

    name = "none"


class GrowWhenIdle(Driver):
    """Malleable jobs ask to grow toward their max while slots are idle, as
    ``settings`` say (by default: always, whatever the gain)."""

    name = "grow-when-idle"

    def __init__(
        self, specs: Mapping[str, MalleableSpec], settings: GrowSettings | None = None
    ) -> None:
        super().__init__(specs)
        self.settings = GrowSettings() if settings is None else settings
        self._asked: set[str] = set()

    def settled(self, controller: EmbeddedController) -> None:
        self._cancel_unplaced(controller)
        self.grow(controller)

    def _cancel_unplaced(self, ctl: EmbeddedController) -> None:
        """A grow asked at the previous instant that the plugin could not place."""
        if not self._asked:
            return
        asked, self._asked = self._asked, set()
        for job_id in sorted(asked):
            if job_id not in self.sizes:
                continue
            status = ctl.resize_status(job_id)
            if status is not None and status.phase is Phase.GROW_PENDING:
                self._ask(ctl, self._principal(job_id), job_id, CancelRequest())

    def _principal(self, job_id: str) -> Principal:
        return Principal(self._specs[job_id].user, job_id=job_id)

    def grow(self, ctl: EmbeddedController) -> bool:
        """Share the idle slots out as grow requests; ``True`` if any was made."""
        settings = self.settings
        if ctl.free_slot_count <= 0 or (settings.when_queue_empty and ctl.pending_count):
            return False
        specs, sizes = self._specs, self.sizes
        now = ctl.now()
        last, ready = self._last, now - settings.cooldown
        growable = [j for j, n in sizes.items() if n < specs[j].max_tasks and last[j] <= ready]
        if not growable:
            return False
        budget = ctl.offered_slot_count()
        if budget <= 0:
            return False
        start = self._start
        growable.sort(key=lambda j: (sizes[j] / specs[j].max_tasks, start[j], j))
        asked = False
        for job_id in growable:
            if budget <= 0:
                break
            spec = specs[job_id]
            share = min(spec.max_tasks - sizes[job_id], budget)
            work = spec.work
            if work is not None:
                cost = work.model.reconfig_cost
                if work.gain(now, sizes[job_id] + share) < settings.margin * cost:
                    continue  # the largest grow is the most worth it: none is
            if self._ask(
                ctl, self._principal(job_id), job_id, GrowRequest(1, share, no_notify=True)
            ):
                self._asked.add(job_id)
                budget -= share
                asked = True
        return asked


class ShrinkForQueue(Driver):
    """A site policy: shrink malleable jobs toward their min to start the queue's head.

    This is the plugin's own reclaim policy, the one a site deploys: the driver asks
    for nothing itself, it has the run's ``[resize]`` section set ``reclaim =
    "shrink"`` (:meth:`resize_settings`), and the plugin decides in its scheduler cycle
    which jobs give which tasks (``xce_resize_select_reclaim``; docs/admin-guide.md,
    "Reclaim").

    :param min_delay: shrink only when the head's reserved start (its shadow time) is
        at least this many seconds away (``[resize] reclaim_min_delay``): a head that
        starts soon anyway is not worth the reconfiguration of the jobs that would make
        room for it.
    """

    name = "shrink-for-queue"

    def __init__(self, specs: Mapping[str, MalleableSpec], min_delay: float = 0.0) -> None:
        super().__init__(specs)
        self.min_delay = min_delay

    def resize_settings(self) -> dict[str, Any]:
        return {"reclaim": "shrink", "reclaim_min_delay": self.min_delay}


class GrowShrink(GrowWhenIdle):
    """``shrink-for-queue`` and ``grow-when-idle`` together: the plugin's reclaim
    shrinks in the scheduler cycle, before the grows are asked at the settled instant.
    Takes the settings of both (``grow`` for the one, ``min_delay`` for the other)."""

    name = "grow-shrink"

    def __init__(
        self,
        specs: Mapping[str, MalleableSpec],
        grow: GrowSettings | None = None,
        min_delay: float = 0.0,
    ) -> None:
        super().__init__(specs, grow)
        self.min_delay = min_delay

    def resize_settings(self) -> dict[str, Any]:
        return ShrinkForQueue({}, self.min_delay).resize_settings()


DRIVERS: dict[str, type[Driver]] = {
    "grow-shrink": GrowShrink,
    "grow-when-idle": GrowWhenIdle,
    "shrink-for-queue": ShrinkForQueue,
    "none": NoDriver,
}


def make_driver(
    name: str,
    specs: Mapping[str, MalleableSpec] | None = None,
    *,
    grow_cooldown: float = 0.0,
    grow_margin: float = 1.0,
    grow_when_queue_empty: bool = False,
    shrink_min_delay: float = 0.0,
) -> Driver:
    """A driver by name (see :data:`DRIVERS`) with its settings (those a driver does
    not use are ignored); a bad name raises ``ValueError``."""
    specs = specs or {}
    grow = GrowSettings(grow_margin, grow_when_queue_empty, grow_cooldown)
    if name == "grow-shrink":
        return GrowShrink(specs, grow, shrink_min_delay)
    if name == "grow-when-idle":
        return GrowWhenIdle(specs, grow)
    if name == "shrink-for-queue":
        return ShrinkForQueue(specs, shrink_min_delay)
    if name == "none":
        return NoDriver(specs)
    raise ValueError(f"unknown driver {name!r} (known: {', '.join(DRIVERS)})")
