"""How the job reaches a given number of tasks: the one place an integration asks the
controller for a size.

It declares the size as the job's target (``set_target``, docs/in-job-api.md, "A
target size"): the controller converges on it by itself — keeps one pending grow while
below it, replaces that grow when the target changes, waits for a change in flight to
settle, grows back after a host failure — so nothing here loops over grows, cancels
and releases. :meth:`JobSizer.resize` says a size; :meth:`JobSizer.release` says
which tasks go (their workers already retired).

Why a release is a target with ``release_prefer`` and not ``release(task_ids=...)``:
an explicit release is a manual change, which clears the job's target (the size an
adaptive cluster keeps asking for would be lost at every scale-down) and is refused
while another change is in flight or, without ``cancel_pending``, while a grow pends.
The target is one request whatever the job is doing, and it is as exact: with ``n`` =
the tasks the job holds once the change in flight settles, less the ids that go, the
controller releases exactly ``len(ids)`` tasks, the preferred ones first.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from xce_resize_plugin.errors import Unreachable
from xce_resize_plugin.injob.aio import AsyncResizeClient
from xce_resize_plugin.injob.protocol import Allocation
from xce_resize_plugin.rest.client import RemoteError

log = logging.getLogger(__name__)

#: Pause between two attempts when the controller was not reached (failing over), or
#: the allocation changed between the read and the request.
RETRY = 0.5
#: How many attempts a request gets before its error reaches the caller.
ATTEMPTS = 20
#: Longest wait on the controller's long poll in :meth:`JobSizer.settled`.
POLL = 10.0
#: The refusal a target gets when a preferred id left the job between the read of the
#: allocation and the request (an outside release took it): read again and retry, if
#: the allocation read again shows that race (:meth:`JobSizer._raced`).
RACED = "XCE_RESIZE_INVALID_REQUEST"


def transient(exc: Unreachable | RemoteError) -> bool:
    """Whether asking again later may succeed: the controller was not reached, or it
    answered a 5xx — it is stopping (a failover: ``XCE_CONTROLLER_STOPPING``, or a long
    poll cut short by its shutdown), or its state cannot be written for now
    (``XCE_STATE_NOT_WRITABLE``, ``XCE_RESIZE_JOURNAL``: nothing was applied) — or a
    429: the owner's requests in progress were at their limit through all of the
    client's own retries (a job of hundreds of workers, each following the events),
    and nothing was done. Any other 4xx is the controller's answer to the request
    itself (the job ended, the token refused)."""
    return isinstance(exc, Unreachable) or exc.http_status >= 500 or exc.http_status == 429


class JobSizer:
    """Declares the job's size to the controller, as its target; :attr:`allocation` is
    the last allocation read (the cluster refreshes it at every job event)."""

    def __init__(self, client: AsyncResizeClient, allocation: Allocation) -> None:
        self.client = client
        self.allocation = allocation
        #: The targets set, oldest first: (``time.time()``, kind, detail); kind
        #: ``grow`` (detail: the tasks wanted, more than the job had), ``target`` (the
        #: tasks wanted, no more than it had) or ``release`` (the task ids that go).
        self.log: list[tuple[float, str, Any]] = []

    async def refresh(self) -> Allocation:
        self.allocation = await self.client.allocation()
        return self.allocation

    async def resize(self, tasks: int) -> Allocation:
        """Make ``tasks`` the job's target (task 0 included); returns once the
        controller took it, not once reached (see :meth:`settled`)."""

        async def order() -> tuple[int, list[int]] | None:
            alloc = await self.refresh()
            # Tasks the target names to go, their release not started yet: keep them
            # named (else the controller would pick others, whose workers hold data),
            # and grow only once they are on their way (the caller asks again).
            held = {t for t, _ in alloc.tasks}
            going = sorted((self.leaving - _in_flight_shrink(alloc)) & held)
            wanted = min(tasks, alloc.size - len(going)) if going else tasks
            kind = "grow" if wanted > alloc.size else "target"
            self.log.append((time.time(), kind, wanted))
            return wanted, going

        return await self._set(order)

    async def release(self, task_ids: Iterable[int]) -> Allocation:
        """Let these tasks go (the caller retired their workers): the target becomes
        the tasks the job holds once its change in flight settles, less these, which
        the controller releases first. Ids the job no longer holds are left out."""
        wanted = {t for t in task_ids if t != 0}

        async def order() -> tuple[int, list[int]] | None:
            alloc = await self.refresh()
            after = _held(alloc) - _in_flight_shrink(alloc)
            prefer = sorted(wanted & after)
            if not prefer:
                return None  # all already going
            self.log.append((time.time(), "release", prefer))
            return max(1, len(after) - len(prefer)), prefer

        return await self._set(order)

    @property
    def leaving(self) -> set[int]:
        """The tasks on their way out: those a release in flight stops, and those the
        target names to release while the job is above it."""
        alloc = self.allocation
        out = _in_flight_shrink(alloc)
        if alloc.target is not None and int(alloc.target["tasks"]) < alloc.size:
            out |= {int(t) for t in alloc.target.get("release_prefer", ())}
        return out

    async def _set(
        self, order: Callable[[], Awaitable[tuple[int, list[int]] | None]]
    ) -> Allocation:
        """Set the target ``order`` computes (none: nothing to do), again when the
        controller was not reached or the allocation changed under it; other refusals
        are raised."""
        for attempt in range(ATTEMPTS):
            prefer: list[int] = []
            try:
                wanted = await order()
                if wanted is None:
                    return self.allocation
                tasks, prefer = wanted
                self.allocation = await self.client.set_target(tasks, prefer)
                return self.allocation
            except (Unreachable, RemoteError) as exc:
                retry = transient(exc) or await self._raced(exc, prefer)
                if not retry or attempt == ATTEMPTS - 1:
                    raise
                log.info("target not set (%s); again", exc)
                await asyncio.sleep(RETRY)
        raise AssertionError("unreachable")  # pragma: no cover

    async def _raced(self, exc: Unreachable | RemoteError, prefer: list[int]) -> bool:
        """Whether a refusal is the race :data:`RACED` stands for: a task the target
        named left the job before the request came (the allocation, read again, no
        longer holds it). Any other invalid request (a size not an int, say) will be
        refused again: it is the caller's to see, at once."""
        if not isinstance(exc, RemoteError) or exc.code != RACED or not prefer:
            return False
        try:
            alloc = await self.refresh()
        except (Unreachable, RemoteError) as again:
            if not transient(again):
                raise
            return True  # read again on the next attempt
        return not set(prefer) <= _held(alloc)

    async def settled(self, timeout: float) -> Allocation:
        """Wait until the job holds its target with nothing pending or in flight (or
        has no target: none set, or cleared by a manual change, which then stands);
        the allocation. :class:`TimeoutError` after ``timeout`` seconds; a controller
        failing over or busy meanwhile (:func:`transient`) is asked again."""
        deadline = time.monotonic() + timeout
        alloc = await self.refresh()
        while True:
            target = alloc.target
            if alloc.settled and (target is None or alloc.size == int(target["tasks"])):
                return alloc
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"the job did not reach its target {target} in {timeout:g} s")
            try:
                alloc = self.allocation = await self.client.wait(
                    after_version=alloc.version, timeout=min(POLL, left)
                )
            except (Unreachable, RemoteError) as exc:
                if not transient(exc):
                    raise
                log.info("allocation not read (%s); again", exc)
                await asyncio.sleep(min(RETRY, max(0.0, deadline - time.monotonic())))


def _held(alloc: Allocation) -> set[int]:
    """The tasks the job holds: its allocation and those a grow in flight adds (the
    ones a target's ``release_prefer`` may name)."""
    flight = alloc.in_flight or {}
    held = {t for t, _ in alloc.tasks}
    if flight.get("kind") == "grow":
        held |= {int(t["id"]) for t in flight.get("tasks", ())}
    return held


def _in_flight_shrink(alloc: Allocation) -> set[int]:
    """The tasks the release in flight stops (none if no release is)."""
    flight = alloc.in_flight or {}
    if flight.get("kind") != "shrink":
        return set()
    return {int(t["id"]) for t in flight.get("tasks", ())}
