"""How the job reaches a given number of tasks: the one place an integration asks the
controller for a size.

Today's in-job API is relative (grow by k, release these ids) and takes one change at
a time: a grow may pend, one change is in flight at a time, and a request made
meanwhile is refused. So :class:`JobSizer` keeps the wanted size and runs a small
reconcile loop: it reads the allocation, waits while a change is in flight, releases
the task ids its user named first, cancels a pending grow that no longer fits, and
grows by the difference. Callers only say :meth:`JobSizer.resize` (a size) and
:meth:`JobSizer.release` (these ids go; the size drops by as many) — the shape of the
controller's declarative target (``set_target(n)``, with the ids preferred for
release), so moving onto it replaces this module's loop and nothing of its callers.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterable
from typing import Any

from xce_resize_plugin.errors import Unreachable
from xce_resize_plugin.injob.aio import AsyncResizeClient
from xce_resize_plugin.injob.protocol import Allocation
from xce_resize_plugin.rest.client import RemoteError

log = logging.getLogger(__name__)

#: Longest wait on the controller's long poll between two looks at the wanted size.
POLL = 10.0
#: Pause after a refused or failed request before the loop looks again.
RETRY = 0.5
#: Refusals that no retry can change (the job is not resizable, is gone, or is not
#: this token's; a request the controller finds malformed): the loop stops on them.
FATAL = frozenset(
    {
        "LSBE_JOB_RESIZABLE",
        "LSBE_NO_JOB",
        "LSBE_JOB_FINISH",
        "LSBE_PERMISSION",
        "XCE_RESIZE_INVALID_REQUEST",
    }
)


class JobSizer:
    """Drives the job towards :attr:`tasks` tasks (task 0 included), one change at a
    time, until it has them; then leaves the allocation alone until the next
    :meth:`resize` or :meth:`release`, so that a change made from outside the job
    (``bresize release`` by the owner or an administrator) stands. Start it with
    :meth:`start` inside a running loop; :meth:`stop` stops it (the client stays its
    owner's)."""

    def __init__(self, client: AsyncResizeClient) -> None:
        self.client = client
        self.tasks: int | None = None
        #: The last allocation the loop read (``None`` before the first).
        self.allocation: Allocation | None = None
        #: The requests made, oldest first: (``time.time()``, ``"grow"``, tasks asked
        #: for at most), (…, ``"release"``, task ids), (…, ``"cancel"``, ``None``).
        self.log: list[tuple[float, str, Any]] = []
        #: The refusal that stopped the loop (one of :data:`FATAL`), if any.
        self.error: RemoteError | None = None
        self._release: set[int] = set()
        self._counted: set[int] = set()  # released ids already taken off the wanted size
        self._wake = asyncio.Event()
        self._settled = asyncio.Event()
        self._loop_task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._loop_task = asyncio.ensure_future(self._run())

    async def stop(self) -> None:
        if self._loop_task is not None:
            self._loop_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._loop_task

    def resize(self, tasks: int) -> None:
        """Want ``tasks`` tasks (task 0 included). Returns at once; the loop does the
        rest."""
        self.tasks = tasks
        self._changed()

    def release(self, task_ids: Iterable[int]) -> None:
        """Let these tasks go (their work is done elsewhere: the caller retired them);
        the wanted size drops by as many of them as the job holds, counted against the
        allocation the loop reads next (not a stale one)."""
        self._release.update(t for t in task_ids if t != 0)
        self._changed()

    @property
    def leaving(self) -> set[int]:
        """The task ids asked to go that the job still holds."""
        return set(self._release)

    def _changed(self) -> None:
        self._settled.clear()
        self._wake.set()

    async def settled(self, timeout: float) -> Allocation:
        """Wait until the allocation has the wanted size with nothing pending or in
        flight; the allocation. Raises :class:`TimeoutError` after ``timeout`` seconds,
        and the refusal that stopped the loop, if one did."""
        await asyncio.wait_for(self._settled.wait(), timeout)
        if self.error is not None:
            raise self.error
        assert self.allocation is not None
        return self.allocation

    async def _run(self) -> None:
        while True:
            self._wake.clear()
            try:
                alloc = await self.client.allocation()
                self.allocation = alloc
                version = await self._step(alloc)
            except RemoteError as exc:
                if exc.code in FATAL:
                    log.error("resizing the job stopped: %s", exc)
                    self.error = exc
                    self._settled.set()
                    return
                # A change raced ours (another request, an outside bresize): look again.
                log.info("resize request not taken (%s); retrying", exc)
                await asyncio.sleep(RETRY)
                continue
            except Unreachable as exc:
                # The controller is failing over: look again shortly.
                log.info("controller not reached (%s); retrying", exc)
                await asyncio.sleep(RETRY)
                continue
            if version is not None:
                await self._wait(version)

    async def _step(self, alloc: Allocation) -> int | None:
        """One move towards the wanted size; the version to wait past, or ``None`` to
        look again at once."""
        ids = {task_id for task_id, _ in alloc.tasks}
        self._release &= ids
        self._counted &= ids
        uncounted = self._release - self._counted
        if uncounted:
            base = self.tasks if self.tasks is not None else alloc.size
            self.tasks = max(1, base - len(uncounted))
            self._counted |= uncounted
        if alloc.in_flight is not None or self.tasks is None:
            return alloc.version
        planned = alloc.size + (int(alloc.pending["max"]) if alloc.pending else 0)
        if self._release:
            self.log.append((time.time(), "release", sorted(self._release)))
            await self.client.release(
                task_ids=sorted(self._release),
                no_notify=True,
                cancel_pending=alloc.pending is not None,
            )
            return None
        if alloc.pending is not None and planned != self.tasks:
            self.log.append((time.time(), "cancel", None))
            await self.client.cancel()
            return None
        if alloc.size < self.tasks and alloc.pending is None:
            self.log.append((time.time(), "grow", self.tasks - alloc.size))
            await self.client.grow(1, self.tasks - alloc.size, no_notify=True)
            return None
        if alloc.settled and alloc.size >= self.tasks and alloc.pending is None:
            # Reached: from now on the allocation is the job's to change. An outside
            # release (the owner's bresize, an administrator) is not undone.
            self.tasks = None
            self._settled.set()
        return alloc.version

    async def _wait(self, version: int) -> None:
        """Until the allocation moves past ``version`` or a new size is wanted."""
        poll = asyncio.ensure_future(self.client.wait(after_version=version, timeout=POLL))
        wake = asyncio.ensure_future(self._wake.wait())
        try:
            done, _ = await asyncio.wait({poll, wake}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            # Also when this loop is cancelled: no request is left running behind it.
            for task in (poll, wake):
                if not task.done():
                    task.cancel()
                with contextlib.suppress(asyncio.CancelledError, RemoteError, Unreachable):
                    await task
        if poll in done and poll.exception() is not None:
            await asyncio.sleep(RETRY)
