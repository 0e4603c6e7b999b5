#!/usr/bin/env python3
"""Task 0 of a Dask job that grows and shrinks itself (run by dask_job.sh).

``XCECluster()`` starts the scheduler in this process and publishes its address in
the job's key-value store; the job's other tasks run ``xce-dask-worker`` and join it.
``adapt()`` hands the job's size to Dask: while tasks queue, the job grows (one
worker per new task, up to ``--maximum``); once they are done, the idle workers are
retired (their data moved) and their tasks released, down to ``--minimum``. The
result is printed; the job ends when this program exits.
"""

from __future__ import annotations

import argparse
import time

from distributed import Client

from xce_resize_plugin.integrations.dask import XCECluster


def work(item: int, seconds: float) -> int:
    time.sleep(seconds)
    return item * item


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=200, help="work items (default 200)")
    parser.add_argument("--seconds", type=float, default=0.5, help="seconds per item")
    parser.add_argument("--minimum", type=int, default=0, help="fewest workers (default 0)")
    parser.add_argument("--maximum", type=int, default=None, help="most workers (job max - 1)")
    args = parser.parse_args()
    with XCECluster() as cluster, Client(cluster) as client:
        maximum = cluster.max_workers if args.maximum is None else args.maximum
        cluster.adapt(minimum=args.minimum, maximum=maximum, interval="250ms")
        futures = client.map(work, range(args.items), seconds=args.seconds)
        total = sum(client.gather(futures))
        print(f"total {total} (expected {sum(i * i for i in range(args.items))})", flush=True)
        # Back down: the adaptive policy retires the idle workers, then releases them.
        # (A worker holding results someone still refers to is kept: drop them.)
        del futures
        deadline = time.monotonic() + 60
        while len(cluster.requested) > args.minimum and time.monotonic() < deadline:
            time.sleep(0.25)
        print(f"workers left: {len(cluster.requested)}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
