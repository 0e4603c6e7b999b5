"""``XCECluster``: a Dask cluster whose workers are the tasks of the resizable job it
runs in (docs/frameworks.md, "Dask").

Task 0 runs the program that builds the cluster; the cluster starts a scheduler in
that process, on the address the other tasks reach task 0's host at
(``XCE_HEAD_ADDR``), and publishes it in the job's key-value store under
:data:`SCHEDULER_KEY`; every other task runs ``xce-dask-worker``, which reads it and
starts a worker named by its task id. So worker ``"5"`` is task 5, and the job's size
is the number of workers plus one.

Why a :class:`distributed.deploy.Cluster` and not a ``SpecCluster``: a spec cluster
creates its workers itself, each under a name it chose; here the controller starts
them (a grow), names them (task ids, known only once the grow is placed) and may stop
them from outside the job (an owner's or an administrator's ``bresize release``). The
cluster only says how many, and which go.

Every shrink the cluster makes retires the workers first (their data moved to the
workers that stay, ``retire_workers``) and releases exactly those tasks afterwards;
a worker whose data could not be moved is kept. A shrink made from outside the job
reaches the workers as SIGTERM, on which ``xce-dask-worker`` retires itself.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Generator, Mapping
from typing import Any

from distributed.core import Status, rpc
from distributed.deploy.adaptive import Adaptive
from distributed.deploy.cluster import Cluster
from distributed.scheduler import Scheduler

from xce_resize_plugin.injob.aio import AsyncResizeClient
from xce_resize_plugin.injob.protocol import Allocation
from xce_resize_plugin.integrations.dask.sizing import JobSizer

log = logging.getLogger(__name__)

#: The key of the job's key-value store that holds the scheduler's address.
SCHEDULER_KEY = "dask-scheduler"
#: How the scheduler's event log names a retirement the cluster made before a release.
RETIRE_STIMULUS = "xce-scale-down"


class XCEAdaptive(Adaptive):
    """Distributed's :class:`~distributed.deploy.adaptive.Adaptive`, whose scale-down is
    the cluster's own: retire the chosen workers (data moved), then release their
    tasks. (The stock one closes the workers itself, so their tasks would exit before
    the job is asked to let them go.)"""

    async def scale_down(self, workers: list[Any]) -> None:  # type: ignore[override]
        if workers:
            assert isinstance(self.cluster, XCECluster)
            await self.cluster.scale_down(workers)


class XCECluster(Cluster):
    """The Dask cluster of the resizable job this process is task 0 of.

    ``XCECluster()`` needs nothing but the job's environment (``XCE_JOB_ID``,
    ``XCE_CONTROLLER_URL``, ``XCE_JOB_TOKEN``, ``XCE_HEAD_ADDR``). ``scale(n)`` makes the
    job ``n + 1`` tasks (one worker per task besides task 0), ``adapt(minimum=,
    maximum=)`` lets distributed's adaptive policy do it; ``n`` is at most the job's
    maximum tasks less one. ``close()`` closes the scheduler, whose workers then exit,
    and releases their tasks.

    :param environ: the environment to read instead of ``os.environ``.
    :param scheduler_options: more keyword arguments for the
        :class:`~distributed.scheduler.Scheduler` (e.g. ``port``, ``dashboard_address``,
        ``security``).
    """

    def __init__(
        self,
        *,
        environ: Mapping[str, str] | None = None,
        scheduler_options: Mapping[str, Any] | None = None,
        asynchronous: bool = False,
        loop: Any = None,
        name: str | None = None,
    ) -> None:
        env = dict(os.environ if environ is None else environ)
        task = env.get("XCE_TASK_ID", "0")
        if task != "0":
            raise RuntimeError(f"XCECluster runs in task 0 of a job; this is task {task}")
        head = env.get("XCE_HEAD_ADDR")
        if not head:
            raise RuntimeError("not inside an XCE job: XCE_HEAD_ADDR not set in the environment")
        self._environ = env
        self._scheduler_options = {
            "host": head,
            "dashboard": False,
            "dashboard_address": f"{head}:0",  # never a fixed port two jobs would share
            **(scheduler_options or {}),
        }
        self.scheduler: Scheduler | None = None
        self._allocation: Allocation
        self._sizer: JobSizer | None = None
        super().__init__(asynchronous=asynchronous, loop=loop, name=name, quiet=True)
        if not self.called_from_running_loop:
            self._loop_runner.start()
            try:
                self.sync(self._start)
            except BaseException:
                self._loop_runner.stop()
                raise

    def __await__(self) -> Generator[Any, Any, XCECluster]:
        async def started() -> XCECluster:
            if self.status == Status.created:
                await self._start()
            return self

        return started().__await__()

    async def _start(self) -> None:
        if self.status != Status.created:
            return
        self.status = Status.starting
        client = AsyncResizeClient.from_env(self._environ)
        try:
            self._allocation = await client.allocation()
            self.scheduler = await Scheduler(**self._scheduler_options)
            self.scheduler_comm = rpc(self.scheduler.address)
            await client.put(SCHEDULER_KEY, self.scheduler.address)
        except BaseException:
            # The controller refused or was not reached: leave nothing running.
            if self.scheduler is not None:
                await self.scheduler.close(reason="XCECluster failed to start")
            await client.aclose()
            self.status = Status.closed  # nothing of it runs: nothing to close
            raise
        self._sizer = JobSizer(client)
        self._sizer.start()
        await super()._start()

    @property
    def _rpc(self) -> Any:
        """The connection to the scheduler (set once started)."""
        assert self.scheduler_comm is not None
        return self.scheduler_comm

    # -- sizes ----------------------------------------------------------------------

    @property
    def max_workers(self) -> int:
        """The most workers the job may have: its maximum tasks less task 0."""
        return self.allocation.max_tasks - 1

    @property
    def allocation(self) -> Allocation:
        """The job's allocation as last read (refreshed at every change)."""
        sized = self._sizer.allocation if self._sizer is not None else None
        return sized if sized is not None else self._allocation

    @property
    def resize_log(self) -> list[tuple[float, str, Any]]:
        """The resize requests the cluster made, oldest first: ``(time.time(), kind,
        detail)``, kind ``grow`` (detail: tasks asked for at most), ``release`` (task
        ids) or ``cancel``."""
        return list(self._sizer.log) if self._sizer is not None else []

    @property
    def requested(self) -> set[str]:
        """The workers the job has tasks for (names = task ids), registered or not."""
        return {str(task_id) for task_id, _ in self.allocation.tasks if task_id != 0}

    @property
    def plan(self) -> set[str]:
        """The requested workers and one placeholder per task a pending grow or the
        wanted size still adds."""
        alloc = self.allocation
        wanted = self._sizer.tasks if self._sizer is not None else None
        coming = int(alloc.pending["max"]) if alloc.pending else 0
        if wanted is not None:
            coming = max(coming, wanted - alloc.size)
        return self.requested | {f"coming-{i}" for i in range(coming)}

    def scale(self, n: int) -> Any:
        """Make the job ``n`` workers (``n + 1`` tasks); a shrink retires the workers
        with the least data first, then releases their tasks."""
        if not 0 <= n <= self.max_workers:
            raise ValueError(
                f"scale({n}): this job has 0 to {self.max_workers} workers "
                f"(its maximum tasks less task 0)"
            )
        if self._sizer is not None and self._sizer.error is not None:
            raise self._sizer.error
        return self.sync(self._scale, n)

    def scale_down(self, workers: list[Any]) -> Any:
        """Retire these workers (names: task ids), then release their tasks."""
        return self.sync(self._scale_down, [int(str(w)) for w in workers])

    def adapt(self, Adaptive: type[Adaptive] = XCEAdaptive, **kwargs: Any) -> Adaptive:
        """Distributed's adaptive scaling between ``minimum`` and ``maximum`` workers
        (within ``0..max_workers``; ``maximum`` defaults to ``max_workers``)."""
        kwargs.setdefault("maximum", self.max_workers)
        low, high = kwargs.get("minimum", 0), kwargs["maximum"]
        if not 0 <= low <= high <= self.max_workers:
            raise ValueError(
                f"adapt(minimum={low}, maximum={high}): this job has 0 to "
                f"{self.max_workers} workers (its maximum tasks less task 0)"
            )
        return super().adapt(Adaptive=Adaptive, **kwargs)

    async def _scale(self, n: int) -> None:
        assert self._sizer is not None
        leaving = self._sizer.leaving
        workers = [t for t, _ in self.allocation.tasks if t != 0 and t not in leaving]
        if n >= len(workers):
            self._sizer.resize(n + 1)
            return
        # The workers that have not registered yet hold no data: they go first.
        observed = {str(name) for name in self.observed}
        going = [t for t in workers if str(t) not in observed][: len(workers) - n]
        more = len(workers) - n - len(going)
        if more:
            names = await self._rpc.workers_to_close(n=more, attribute="name")
            going += [int(str(name)) for name in names]
        await self._scale_down(going)

    async def _scale_down(self, task_ids: list[int]) -> None:
        assert self._sizer is not None
        registered = {str(w["name"]) for w in self.scheduler_info["workers"].values()}
        names = [str(t) for t in task_ids if str(t) in registered]
        retired: dict[str, Any] = {}
        if names:
            retired = await self._rpc.retire_workers(
                names=names,
                close_workers=False,
                remove=True,
                stimulus_id=f"{RETIRE_STIMULUS}-{time.time()}",
            )
        kept = set(names) - {str(info["name"]) for info in retired.values()}
        if kept:
            log.warning("workers %s keep data no other worker could take: not released", kept)
        self._sizer.release([t for t in task_ids if str(t) not in kept])

    async def _wait_settled(self, timeout: float) -> Allocation:
        assert self._sizer is not None
        return await self._sizer.settled(timeout)

    def wait_for_allocation(self, timeout: float = 60.0) -> Allocation:
        """Block until the job has the size last asked for (nothing pending or in
        flight); the allocation. ``TimeoutError`` after ``timeout`` seconds; the
        controller's refusal (:class:`~xce_resize_plugin.rest.client.RemoteError`) if
        the job cannot be resized (e.g. ``LSBE_JOB_RESIZABLE``: not submitted
        resizable)."""
        result: Allocation = self.sync(self._wait_settled, timeout)
        return result

    # -- the end --------------------------------------------------------------------

    async def _close(self) -> None:
        if self.status in (Status.closing, Status.closed):
            return
        if self._adaptive is not None:
            self._adaptive.stop(reason="cluster-closing")
        going = [task_id for task_id, _ in self.allocation.tasks if task_id != 0]
        await super()._close()
        if self.scheduler is not None:
            await self.scheduler.close(reason="XCECluster closed")
        if self._sizer is not None:
            # The scheduler told its workers to close: their tasks exit; give them back.
            await self._sizer.stop()
            if going:
                await _release_quietly(self._sizer.client, going)
            await self._sizer.client.aclose()

    def close(self, timeout: float | None = None) -> Any:
        result = super().close(timeout)
        if not self.asynchronous:
            self._loop_runner.stop()
        return result


async def _release_quietly(client: AsyncResizeClient, task_ids: list[int]) -> None:
    """Release the tasks at the cluster's close; a job already ending refuses it, which
    is fine (its tasks go anyway)."""
    try:
        await client.release(task_ids=task_ids, no_notify=True, cancel_pending=True)
    except Exception as exc:
        log.info("release of workers %s at close not taken: %s", task_ids, exc)
