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
fallback where no event came (docs/frameworks.md).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
import time
from collections.abc import Callable, Mapping, Sequence

from distributed import Worker

from xce_resize_plugin.errors import Unreachable
from xce_resize_plugin.injob.aio import AsyncResizeClient
from xce_resize_plugin.integrations.dask.cluster import SCHEDULER_KEY
from xce_resize_plugin.integrations.dask.sizing import ATTEMPTS, RETRY, transient
from xce_resize_plugin.rest.client import RemoteError

log = logging.getLogger("xce-dask-worker")

#: How long a worker waits for task 0 to publish the scheduler's address, by default.
ADDRESS_WAIT = 300.0


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
    args = parser.parse_args(argv)
    if args.nthreads < 1 or args.wait < 0:
        parser.error("--nthreads must be at least 1 and --wait at least 0")
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
    return address


async def run(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    task = environ.get("XCE_TASK_ID")
    if not task or task == "0":
        raise RuntimeError("xce-dask-worker runs in a job's tasks other than task 0")
    address = await scheduler_address(environ, args.wait)
    worker = Worker(
        address,
        name=task,
        nthreads=args.nthreads,
        memory_limit=args.memory_limit,
        local_directory=environ.get("XCE_JOB_DIR"),
    )
    loop = asyncio.get_running_loop()
    closing: list[asyncio.Task[None]] = []

    def leave(why: str, ack: bool) -> None:
        # Released: move the data, then close (and say so, when the event told us).
        log.info("%s: closing gracefully", why)
        if not closing:
            closing.append(loop.create_task(_leave(worker, environ, int(task), ack)))

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, leave, signal.Signals(sig).name, False)
    await worker
    watch = loop.create_task(_watch(environ, int(task), leave))
    try:
        await worker.finished()
        for task_ in closing:
            await task_
    finally:
        watch.cancel()
    return 0


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
