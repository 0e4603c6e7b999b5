"""The in-job API: a running job grows and shrinks itself (elastic frameworks).

Standard library only on its import path, so any task can use it cheaply::

    from xce_resize_plugin.injob import ResizeClient

    client = ResizeClient.from_env()          # XCE_CONTROLLER_URL, XCE_JOB_ID, XCE_JOB_TOKEN
    alloc = client.allocation()               # hosts, tasks, version, pending, in flight
    done = client.grow(2, 8, wait=True)       # PMIx EXTEND: 2..8 more tasks
    client.release(count=2, wait=True)        # PMIx RELEASE: the site policy picks tasks
    client.cancel()                           # PMIx REQ_CANCEL: drop the pending grow
    client.put("scheduler", "tcp://...")      # the job's key-value store (task 0) ...
    addr = client.get("scheduler", wait=60)   # ... and the other tasks find it

The same calls, awaitable, for asyncio frameworks (httpx; the ``async`` extra)::

    from xce_resize_plugin.injob.aio import AsyncResizeClient

The job's own token (``XCE_JOB_TOKEN``) authorises it for its own job only.
docs/in-job-api.md maps every call onto PMIx's allocation directives and LSF's
notification command.
"""

from xce_resize_plugin.injob.client import ResizeClient
from xce_resize_plugin.injob.protocol import (
    MAX_POLL,
    Allocation,
    ChangeOptions,
    GrowOptions,
    ReleaseOptions,
    WaitOptions,
)

__all__ = [
    "MAX_POLL",
    "Allocation",
    "ChangeOptions",
    "GrowOptions",
    "ReleaseOptions",
    "ResizeClient",
    "WaitOptions",
]
