"""``xce-dask-worker``: the Dask worker of one task of a resizable job.

Run in every task but task 0 (whose program builds an
:class:`~xce_resize_plugin.integrations.dask.cluster.XCECluster`). It reads the
scheduler's address from the job's key-value store (waiting for task 0 to publish
it), and starts a worker named by the task id (``XCE_TASK_ID``), with the job's
scratch directory (``XCE_JOB_DIR``) as its local directory. It runs until the worker
closes: the scheduler closed it (the cluster shrank, or closed), or the task was
released. Once its worker has registered with the scheduler it says the task is
ready (``ready()``: a grow made with ``wait_ready`` commits only then). It follows
the job's events: a ``release_coming`` naming its task (a release with a drain time,
``--grace``) makes it close gracefully, moving the data it holds to the other workers
first, and then acknowledge the drain (``drained``) so the task stops at once rather
than at the deadline. SIGTERM (a release without a drain time, or the deadline
passed; SIGKILL follows after the site's ``stop_grace``) closes it gracefully too: the
fallback where no event came; before the worker registered (nothing held), a signal
stops it at once. A scheduler that does not accept the worker within
``--connect-wait`` seconds (crashed, or closed) ends it, exit 1, as does an empty
address (``XCECluster.close()`` empties it) (docs/frameworks.md).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TypeVar

from distributed import Worker

from xce_resize_plugin.errors import Unreachable
from xce_resize_plugin.injob.aio import AsyncResizeClient
from xce_resize_plugin.integrations.dask.cluster import SCHEDULER_KEY
from xce_resize_plugin.integrations.dask.sizing import ATTEMPTS, RETRY, transient
from xce_resize_plugin.rest.client import RemoteError

log = logging.getLogger("xce-dask-worker")

#: How long a worker waits for task 0 to publish the scheduler's address, by default.
ADDRESS_WAIT = 300.0
#: How long a worker waits, by default, for the scheduler whose address it read to
#: accept it: a scheduler that crashed, or a cluster closed since, is never reached.
CONNECT_WAIT = 60.0
#: How long a worker stopped before it registered is given to close its comms.
CLOSE_WAIT = 10.0

_T = TypeVar("_T")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="xce-dask-worker",
        description="The Dask worker of one task of a resizable job (not task 0).",
    )
    parser.add_argument("--nthreads", type=int, default=1, help="threads (default 1)")
    parser.add_argument("--memory-limit", default="auto", help="Dask's memory limit (default auto)")
    parser.add_argument(
        "--wait",
        type=float,
        default=ADDRESS_WAIT,
        help=f"seconds to wait for the scheduler's address (default {ADDRESS_WAIT:g})",
    )
    parser.add_argument(
        "--connect-wait",
        type=float,
        default=CONNECT_WAIT,
        help="seconds to wait for the scheduler to accept the worker, once its address is "
        f"read (default {CONNECT_WAIT:g}); then exit 1",
    )
    args = parser.parse_args(argv)
    if args.nthreads < 1 or args.wait < 0 or not args.connect_wait > 0:
        parser.error(
            "--nthreads must be at least 1, --wait at least 0 and --connect-wait more than 0"
        )
    return args


async def scheduler_address(environ: Mapping[str, str], wait: float) -> str:
    """The address task 0 published; raises :class:`RuntimeError` if none came in
    ``wait`` seconds. A controller failing over or busy (:func:`.sizing.transient`) is
    asked again within that time; any other refusal is the worker's end."""
    deadline = time.monotonic() + wait
    async with AsyncResizeClient.from_env(environ) as client:
        while True:
            try:
                address = await client.get(
                    SCHEDULER_KEY, wait=max(0.0, deadline - time.monotonic())
                )
                break
            except (Unreachable, RemoteError) as exc:
                if not transient(exc) or time.monotonic() >= deadline:
                    raise RuntimeError(
                        f"the job's key-value store could not be read ({exc}): no Dask "
                        f"scheduler address ({SCHEDULER_KEY!r})"
                    ) from exc
                await asyncio.sleep(RETRY)
    if address is None:
        raise RuntimeError(
            f"no Dask scheduler published in the job's key-value store "
            f"({SCHEDULER_KEY!r}) within {wait:g} s: does task 0 run XCECluster()?"
        )
    if not address:
        # XCECluster.close() empties the key: no scheduler will take this worker.
        raise RuntimeError(f"the job's Dask cluster has closed ({SCHEDULER_KEY!r} is empty)")
    return address


async def run(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    """Read the address, start the worker, run until it closes; 0 also when a signal
    stopped it before it registered (it held nothing)."""
    task = environ.get("XCE_TASK_ID")
    if not task or task == "0":
        raise RuntimeError("xce-dask-worker runs in a job's tasks other than task 0")
    loop = asyncio.get_running_loop()
    stopped = asyncio.Event()  # a signal came before the worker registered
    running: list[Worker] = []
    closing: list[asyncio.Task[None]] = []

    def leave(why: str, ack: bool) -> None:
        if not running:
            # Nothing registered holds data: stop the address read or the start now,
            # whose scheduler may never answer.
            log.info("%s: stopping (no worker registered yet)", why)
            stopped.set()
            return
        # Released: move the data, then close (and say so, when the event told us).
        log.info("%s: closing gracefully", why)
        if not closing:
            closing.append(loop.create_task(_leave(running[0], environ, int(task), ack)))

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, leave, signal.Signals(sig).name, False)
    address = await _unless(stopped, scheduler_address(environ, args.wait))
    if address is None:
        return 0
    worker = Worker(
        address,
        name=task,
        nthreads=args.nthreads,
        memory_limit=args.memory_limit,
        local_directory=environ.get("XCE_JOB_DIR"),
        death_timeout=args.connect_wait,  # bounds the start: its registration
    )
    if await _unless(stopped, _start(worker, address, args.connect_wait)) is None:
        await _close_unstarted(worker)
        return 0
    running.append(worker)
    if stopped.is_set():  # the signal came as the registration completed
        leave("signal", False)
    watch = loop.create_task(_watch(environ, int(task), leave))
    try:
        await worker.finished()
        for task_ in closing:
            await task_
    finally:
        watch.cancel()
    return 0


async def _unless(stopped: asyncio.Event, work: Awaitable[_T]) -> _T | None:
    """``work``'s result; ``None`` if ``stopped`` is set first (``work`` cancelled)."""
    job = asyncio.ensure_future(work)
    stop = asyncio.ensure_future(stopped.wait())
    try:
        await asyncio.wait({job, stop}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        job.cancel()
        raise
    finally:
        stop.cancel()
    if job.done():
        return job.result()
    job.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await job
    return None


async def _start(worker: Worker, address: str, bound: float) -> bool:
    """Start the worker: registered with the scheduler within ``bound`` seconds (its
    ``death_timeout``, after which distributed closes it), else :class:`RuntimeError`."""
    try:
        await worker
    except TimeoutError as exc:
        raise RuntimeError(
            f"the Dask scheduler at {address} did not accept this worker within {bound:g} s "
            f"(--connect-wait): task 0's XCECluster has closed or failed"
        ) from exc
    except (OSError, RuntimeError) as exc:
        raise RuntimeError(f"the Dask worker did not start: {exc.__cause__ or exc}") from exc
    return True


async def _close_unstarted(worker: Worker) -> None:
    """Close a worker whose start was cancelled (no data: nothing to move)."""
    try:
        await asyncio.wait_for(worker.close(reason="task stopped", timeout=CLOSE_WAIT), CLOSE_WAIT)
    except (TimeoutError, OSError, RuntimeError) as exc:
        log.info("worker not closed cleanly: %s", exc)


async def _leave(worker: Worker, environ: Mapping[str, str], task_id: int, ack: bool) -> None:
    await worker.close_gracefully(reason="task released")
    if ack:
        try:
            async with AsyncResizeClient.from_env(environ) as client:
                await client.drained([task_id])
        except (Unreachable, RemoteError) as exc:
            # The cluster acknowledged it first and the task is stopping: nothing lost.
            log.info("drain not acknowledged: %s", exc)


async def _ready(client: AsyncResizeClient, task_id: int) -> None:
    """Tell the controller this task is usable, so that a grow made with
    ``wait_ready`` commits once its workers have registered (safe to repeat)."""
    for _ in range(ATTEMPTS):
        try:
            await client.ready(task_id)
            return
        except (Unreachable, RemoteError) as exc:
            if not transient(exc):
                log.warning("ready not recorded: %s", exc)
                return
            await asyncio.sleep(RETRY)  # the controller is failing over


async def _watch(
    environ: Mapping[str, str], task_id: int, leave: Callable[[str, bool], None]
) -> None:
    """Say the task is ready (its worker registered), then follow the job's events
    until one says this task is to be released."""
    after: int | None = None
    async with AsyncResizeClient.from_env(environ) as client:
        await _ready(client, task_id)
        while True:
            try:
                async for event in client.events(after=after):
                    after = int(event["seq"])
                    ids = event.get("task_ids", ())
                    if event.get("type") == "release_coming" and task_id in ids:
                        leave("release coming", True)
                        return
                return  # the job ended
            except (Unreachable, RemoteError) as exc:
                if not transient(exc):
                    log.warning("job events refused (%s): closing on SIGTERM only", exc)
                    return
                await asyncio.sleep(RETRY)  # the controller is failing over


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    try:
        return asyncio.run(run(args, os.environ))
    except RuntimeError as exc:
        print(f"xce-dask-worker: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
