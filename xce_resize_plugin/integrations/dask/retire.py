"""``xce-dask-retire``: the job's resize notification command for a Dask job
(``xce-resize submit --rnc xce-dask-retire``, ``bsub -rnc``).

A release the job did not make itself (the owner's ``bresize release``, an
administrator's) runs the job's notification command before it stops any task, with
the tasks it will stop in ``XCE_RESIZE_TASK_IDS``. This command retires exactly those
workers (their data moved to the workers that stay) and then accepts the change, so the
workers hold nothing when SIGTERM comes, however short ``[resize] stop_grace`` is: the
notification has ``[resize] notify_timeout`` (default 60 s) instead. It always accepts
(exit 0): a Dask job has no reason to refuse a release, and a worker whose data could
not be moved still hands it over on SIGTERM. Grows are accepted at once.

Where the controller gives releases a drain time and job events (``--grace``),
:class:`~.cluster.XCECluster` drains on the ``release_coming`` event instead and this
command is not needed; it is kept for releases without a drain time and for hosts
whose controller has no job events.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
import time
from collections.abc import Mapping
from typing import Any

from distributed.core import rpc

from xce_resize_plugin.injob.aio import AsyncResizeClient
from xce_resize_plugin.integrations.dask.cluster import SCHEDULER_KEY

log = logging.getLogger("xce-dask-retire")

#: How the scheduler's event log names a retirement this command made.
NOTIFY_STIMULUS = "xce-notify"


async def retire(environ: Mapping[str, str]) -> dict[str, Any]:
    """Retire the workers of the tasks a shrink takes; what the scheduler retired
    (empty for a grow, or when the job runs no Dask scheduler)."""
    if environ.get("LSB_RESIZE_EVENT") != "shrink":
        return {}
    names = [t for t in environ.get("XCE_RESIZE_TASK_IDS", "").split(",") if t]
    if not names:
        return {}
    async with AsyncResizeClient.from_env(environ) as client:
        address = await client.get(SCHEDULER_KEY)
    if not address:
        return {}  # none published, or emptied by the cluster's close
    scheduler = rpc(address)
    try:
        retired: dict[str, Any] = await scheduler.retire_workers(
            names=names,
            close_workers=False,
            remove=True,
            stimulus_id=f"{NOTIFY_STIMULUS}-{time.time()}",
        )
    finally:
        await scheduler.close_rpc()
    return retired


def main(argv: list[str] | None = None) -> int:
    # No options: but --help answers, and anything else is refused (exit 2) rather
    # than the command acting on a release while its caller thought it asked for help.
    argparse.ArgumentParser(
        prog="xce-dask-retire",
        description="A Dask job's resize notification command (xce-resize submit --rnc "
        "xce-dask-retire): before a release it did not make, the workers of the tasks "
        "in XCE_RESIZE_TASK_IDS hand their data over; it always accepts (exit 0). "
        "Grows are accepted at once. Takes no arguments; docs/frameworks.md.",
    ).parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    try:
        retired = asyncio.run(retire(os.environ))
    except Exception as exc:  # accept anyway: SIGTERM still closes the workers gracefully
        print(f"xce-dask-retire: workers not retired ({exc}); accepting", file=sys.stderr)
        return 0
    log.info("retired %s", sorted(str(info.get("name")) for info in retired.values()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
