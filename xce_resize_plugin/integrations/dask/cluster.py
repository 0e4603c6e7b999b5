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

The cluster says the job's size as its target (``set_target``, through
:class:`~.sizing.JobSizer`). Every shrink it makes retires the workers first (their
data moved to the workers that stay, ``retire_workers``) and then names exactly those
tasks to release; a worker whose data could not be moved is kept. A release it did
not make (an outside ``bresize release``, an administrator's, a reclaim, a host
drain) reaches it as a ``release_coming`` job event, on which it retires those
workers and acknowledges them (``drained``), so the tasks stop as soon as their data
is safe rather than at the drain's deadline; ``xce-dask-worker`` also closes
gracefully on that event or on SIGTERM, the fallback where no event comes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import numbers
import os
import time
from collections.abc import Awaitable, Callable, Generator, Mapping
from typing import Any

from distributed.core import Status, rpc
from distributed.deploy.adaptive import Adaptive
from distributed.deploy.cluster import Cluster
from distributed.scheduler import Scheduler

from xce_resize_plugin.errors import Unreachable
from xce_resize_plugin.injob.aio import AsyncResizeClient
from xce_resize_plugin.injob.protocol import Allocation
from xce_resize_plugin.integrations.dask.sizing import RETRY, JobSizer, transient
from xce_resize_plugin.rest.client import RemoteError

log = logging.getLogger(__name__)

#: The key of the job's key-value store that holds the scheduler's address.
SCHEDULER_KEY = "dask-scheduler"
#: How the scheduler's event log names a retirement the cluster made before a release.
RETIRE_STIMULUS = "xce-scale-down"
#: How it names a retirement on a ``release_coming`` event (a release the cluster did
#: not choose: the owner's, an administrator's, a reclaim, a host drain).
DRAIN_STIMULUS = "xce-release-coming"


async def follow_job_events(
    client: AsyncResizeClient,
    refresh: Callable[[], Awaitable[object]],
    release_coming: Callable[[list[int]], None],
) -> None:
    """Read the job's events until it ends: ``refresh`` at each, and
    ``release_coming(task_ids)`` (task 0 left out) once for each release announced.

    A transient failure (the controller failing over) reads again from the last event
    fully handled: an event whose refresh failed is read again, so that no
    ``release_coming`` is skipped, and its release is not announced twice."""
    after: int | None = None  # the last event handled
    announced = -1  # the last release_coming passed on
    while True:
        try:
            async for event in client.events(after=after):
                seq = int(event["seq"])
                if event.get("type") == "release_coming" and seq > announced:
                    announced = seq
                    release_coming([int(t) for t in event.get("task_ids", ()) if int(t) != 0])
                await refresh()
                after = seq
            return  # the job ended
        except (Unreachable, RemoteError) as exc:
            if not transient(exc):
                log.warning("job events refused (%s): outside releases not drained", exc)
                return
            # The controller is failing over, or cannot write: go on where we were.
            log.info("job events not read (%s); again", exc)
            await asyncio.sleep(RETRY)


class _Scheduler(Scheduler):
    """Distributed's scheduler, whose HTTP server is started only when ``http`` is true.

    Distributed starts one in every scheduler, whatever its ``dashboard`` option says:
    ``/health``, ``/metrics``, ``/json/...`` and the ``/info/...`` pages about the
    workers, for anyone who reaches it, without authentication. docs/frameworks.md
    promises no HTTP server unless the cluster's options ask for one."""

    def __init__(self, *, http: bool, **kwargs: Any) -> None:
        self._xce_http = http
        super().__init__(**kwargs)

    def start_http_server(self, *args: Any, **kwargs: Any) -> None:
        if self._xce_http:
            super().start_http_server(*args, **kwargs)


class XCEAdaptive(Adaptive):
    """Distributed's :class:`~distributed.deploy.adaptive.Adaptive`, whose scale-down is
    the cluster's own: retire the chosen workers (data moved), then release their
    tasks. (The stock one closes the workers itself, so their tasks would exit before
    the job is asked to let them go.)"""

    async def recommendations(self, target: int) -> dict[str, Any]:
        recommended: dict[str, Any] = await super().recommendations(target)
        if recommended["status"] == "down" and not recommended.get("workers"):
            # Only tasks still to come exceed the target: lower the job's target.
            return {"status": "up", "n": target}
        return recommended

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
        :class:`~distributed.scheduler.Scheduler` (e.g. ``port``, ``security``). The
        scheduler runs no HTTP server unless they ask for one: ``dashboard=True`` (on a
        free port of ``XCE_HEAD_ADDR`` unless ``dashboard_address`` says where), or a
        ``dashboard_address`` alone (Dask's HTTP routes, ``/metrics`` and the rest,
        without the dashboard), or ``jupyter=True`` (Jupyter is served through it).
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
        options = dict(scheduler_options or {})
        self._scheduler_options = {
            "host": head,
            "dashboard": False,
            "dashboard_address": f"{head}:0",  # never a fixed port two jobs would share
            # jupyter=True serves Jupyter through the HTTP server: it needs one too.
            "http": bool(
                options.get("dashboard")
                or options.get("dashboard_address")
                or options.get("jupyter")
            ),
            **options,
        }
        self.scheduler: Scheduler | None = None
        self._allocation: Allocation
        self._sizer: JobSizer | None = None
        self._listener: asyncio.Future[None] | None = None
        self._draining: set[asyncio.Future[None]] = set()
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
            self.scheduler = await _Scheduler(**self._scheduler_options)
            self.scheduler_comm = rpc(self.scheduler.address)
            await client.put(SCHEDULER_KEY, self.scheduler.address)
        except BaseException:
            # The controller refused or was not reached: leave nothing running.
            if self.scheduler is not None:
                await self.scheduler.close(reason="XCECluster failed to start")
            await client.aclose()
            self.status = Status.closed  # nothing of it runs: nothing to close
            raise
        self._sizer = JobSizer(client, self._allocation)
        self._listener = asyncio.ensure_future(self._listen(client))
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
        """The job's allocation as last read (refreshed at every job event)."""
        return self._sizer.allocation if self._sizer is not None else self._allocation

    @property
    def resize_log(self) -> list[tuple[float, str, Any]]:
        """The targets the cluster set, oldest first: ``(time.time(), kind, detail)``,
        kind ``grow`` (detail: the tasks wanted, more than the job had), ``target`` (the
        tasks wanted, no more) or ``release`` (the task ids named to go)."""
        return list(self._sizer.log) if self._sizer is not None else []

    @property
    def requested(self) -> set[str]:
        """The workers the job has tasks for (names = task ids), registered or not."""
        return {str(task_id) for task_id, _ in self.allocation.tasks if task_id != 0}

    @property
    def plan(self) -> set[str]:
        """The requested workers and one placeholder per task the job's target (or a
        pending grow) still adds."""
        alloc = self.allocation
        coming = int(alloc.pending["max"]) if alloc.pending else 0
        if alloc.target is not None:
            coming = max(coming, int(alloc.target["tasks"]) - alloc.size)
        return self.requested | {f"coming-{i}" for i in range(coming)}

    def scale(self, n: int) -> Any:
        """Make the job ``n`` workers (``n + 1`` tasks, its target); a shrink retires
        the workers with the least data first, then names them for release. Raises
        the controller's refusal (e.g. ``LSBE_JOB_RESIZABLE``); :class:`ValueError`
        at once, nothing changed, for an ``n`` not an int within ``0..max_workers``."""
        n = _count(n, f"scale({n!r})")
        if not 0 <= n <= self.max_workers:
            raise ValueError(
                f"scale({n}): this job has 0 to {self.max_workers} workers "
                f"(its maximum tasks less task 0)"
            )
        return self.sync(self._scale, n)

    def scale_down(self, workers: list[Any]) -> Any:
        """Retire these workers (names: task ids), then release their tasks."""
        return self.sync(self._scale_down, [int(str(w)) for w in workers])

    def adapt(self, Adaptive: type[Adaptive] = XCEAdaptive, **kwargs: Any) -> Adaptive:
        """Distributed's adaptive scaling between ``minimum`` and ``maximum`` workers
        (within ``0..max_workers``; ``maximum`` defaults to ``max_workers``)."""
        kwargs.setdefault("maximum", self.max_workers)
        call = f"adapt(minimum={kwargs.get('minimum', 0)!r}, maximum={kwargs['maximum']!r})"
        # Ints only: the adaptive policy's targets, within them, become the job's size.
        low, high = _count(kwargs.get("minimum", 0), call), _count(kwargs["maximum"], call)
        if not 0 <= low <= high <= self.max_workers:
            raise ValueError(
                f"adapt(minimum={low}, maximum={high}): this job has 0 to "
                f"{self.max_workers} workers (its maximum tasks less task 0)"
            )
        return super().adapt(Adaptive=Adaptive, **kwargs)

    async def _scale(self, n: int) -> None:
        assert self._sizer is not None
        alloc = await self._sizer.refresh()
        leaving = self._sizer.leaving
        workers = [t for t, _ in alloc.tasks if t != 0 and t not in leaving]
        if n >= len(workers):
            await self._sizer.resize(n + 1)
            return
        # The workers that have not registered yet hold no data: they go first.
        observed = {str(name) for name in self.observed}
        going = [t for t in workers if str(t) not in observed][: len(workers) - n]
        more = len(workers) - n - len(going)
        if more:
            names = await self._rpc.workers_to_close(n=more, attribute="name")
            going += [int(str(name)) for name in names]
        await self._scale_down(going)

    async def _retire(self, task_ids: list[int], stimulus: str) -> set[int]:
        """Retire the registered workers of these tasks (data moved, removed from the
        scheduler); the tasks that hold no data now: those retired and those whose
        worker was not registered. A worker whose data no other could take is kept."""
        registered = {str(w["name"]) for w in self.scheduler_info["workers"].values()}
        names = [str(t) for t in task_ids if str(t) in registered]
        retired: dict[str, Any] = {}
        if names:
            retired = await self._rpc.retire_workers(
                names=names,
                close_workers=False,
                remove=True,
                stimulus_id=f"{stimulus}-{time.time()}",
            )
        kept = set(names) - {str(info["name"]) for info in retired.values()}
        if kept:
            log.warning("workers %s keep data no other worker could take", sorted(kept))
        return {t for t in task_ids if str(t) not in kept}

    async def _scale_down(self, task_ids: list[int]) -> None:
        assert self._sizer is not None
        await self._sizer.release(await self._retire(task_ids, RETIRE_STIMULUS))

    async def _wait_settled(self, timeout: float) -> Allocation:
        assert self._sizer is not None
        return await self._sizer.settled(timeout)

    def wait_for_allocation(self, timeout: float = 60.0) -> Allocation:
        """Block until the job holds its target with nothing pending or in flight (or
        has none: a manual change cleared it); the allocation. ``TimeoutError`` after
        ``timeout`` seconds."""
        result: Allocation = self.sync(self._wait_settled, timeout)
        return result

    # -- releases the cluster did not choose ---------------------------------------

    async def _listen(self, client: AsyncResizeClient) -> None:
        """Follow the job's events until it ends: refresh the allocation at each, and
        drain the workers a ``release_coming`` names."""
        assert self._sizer is not None
        await follow_job_events(
            client, self._sizer.refresh, lambda ids: self._drain_later(client, ids)
        )

    def _drain_later(self, client: AsyncResizeClient, task_ids: list[int]) -> None:
        drain = asyncio.ensure_future(self._drain(client, task_ids))
        self._draining.add(drain)
        drain.add_done_callback(self._draining.discard)

    async def _drain(self, client: AsyncResizeClient, task_ids: list[int]) -> None:
        """Retire the workers of a coming release, then tell the controller their tasks
        may stop now (a worker kept for its data stops at the deadline instead)."""
        try:
            safe = await self._retire(task_ids, DRAIN_STIMULUS)
            if safe:
                await client.drained(sorted(safe))
            log.info("release of %s: drained %s", task_ids, sorted(safe))
        except (Unreachable, RemoteError) as exc:
            # Already stopped (acknowledged by the worker, or past its deadline).
            log.info("drain of %s not acknowledged: %s", task_ids, exc)

    # -- the end --------------------------------------------------------------------

    async def _close(self) -> None:
        if self.status in (Status.closing, Status.closed):
            return
        if self._adaptive is not None:
            self._adaptive.stop(reason="cluster-closing")
        await super()._close()
        if self._sizer is not None:
            await _unpublish(self._sizer.client)
        if self.scheduler is not None:
            await self.scheduler.close(reason="XCECluster closed")
        for task in (self._listener, *self._draining):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        if self._sizer is not None:
            # The scheduler told its workers to close: their tasks exit; give them back.
            await _shrink_quietly(self._sizer)
            await self._sizer.client.aclose()

    def close(self, timeout: float | None = None) -> Any:
        result = super().close(timeout)
        if not self.asynchronous:
            self._loop_runner.stop()
        return result


def _count(n: object, call: str) -> int:
    """``n`` as a number of workers: an int (a bool is not one); :class:`ValueError`
    naming ``call`` otherwise (a float would reach the controller as a size it refuses)."""
    if isinstance(n, bool) or not isinstance(n, numbers.Integral):
        raise ValueError(f"{call}: a number of workers is an int, not {type(n).__name__}")
    return int(n)


async def _unpublish(client: AsyncResizeClient) -> None:
    """Empty :data:`SCHEDULER_KEY` rather than delete it: a task that starts after the
    close then exits at once (``xce-dask-worker`` reads an empty address as a closed
    cluster), where a deleted key would have it hold its slot waiting for a scheduler
    that is gone.
    A job already ending refuses it, which is fine (its tasks go anyway)."""
    try:
        await client.put(SCHEDULER_KEY, "")
    except (Unreachable, RemoteError) as exc:
        log.info("scheduler address not cleared at close: %s", exc)


async def _shrink_quietly(sizer: JobSizer) -> None:
    """Target task 0 alone (the job's minimum, if higher) at the cluster's close; a job
    already ending refuses it, which is fine (its tasks go anyway)."""
    try:
        await sizer.resize(max(1, sizer.allocation.min_tasks))
    except (Unreachable, RemoteError) as exc:
        log.info("workers not released at close: %s", exc)
