#!/usr/bin/env python3
"""An elastic task farm: one job that grows when it has a backlog and shrinks when idle.

Submit it as a resizable job whose every task runs this script::

    xce-resize submit -n 1,8 --initial 1 --resizable --cwd "$PWD" -- \
        "$(command -v python3)" task_farm.py --items 40 --work 0.2

Task 0 is the coordinator: it fills a spool directory with work items, asks the
controller for more tasks while the backlog is long (``grow``) and gives tasks back when
the backlog is gone (``release``: the site policy picks which). Every other task is a
worker: it claims an item by renaming it (atomic on one filesystem), works, and marks it
done. A released worker gets SIGTERM: it puts its item back and exits, so no item is
lost or done twice. The job ends when every item is done and task 0 exits 0.

Only the standard library and ``xce_resize_plugin.injob`` (itself standard library only).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path

from xce_resize_plugin.injob import ResizeClient

STOP = False


def log(msg: str) -> None:
    task = os.environ.get("XCE_TASK_ID", "?")
    print(f"[task {task} t={time.time():.2f}] {msg}", flush=True)


def spool(root: Path) -> tuple[Path, Path, Path]:
    todo, doing, done = root / "todo", root / "doing", root / "done"
    for d in (todo, doing, done):
        d.mkdir(parents=True, exist_ok=True)
    return todo, doing, done


def coordinator(root: Path, items: int, max_backlog_per_worker: int) -> int:
    todo, doing, done = spool(root)
    for i in range(items):
        (todo / f"item-{i:05d}").write_text(str(i))
    client = ResizeClient.from_env()
    while True:
        backlog = len(list(todo.iterdir()))
        finished = len(list(done.iterdir()))
        alloc = client.allocation()
        workers = alloc.size - 1
        hosts = os.environ.get("XCE_HOSTS", "")
        log(f"backlog {backlog}, done {finished}/{items}, workers {workers}, hosts '{hosts}'")
        if finished >= items:
            break
        if not alloc.settled:
            time.sleep(0.2)  # a resize is under way: let it finish first
            continue
        if backlog > max_backlog_per_worker * max(workers, 1) and alloc.size < alloc.max_tasks:
            want = min(alloc.max_tasks - alloc.size, backlog // max_backlog_per_worker)
            log(f"growing by 1..{want}")
            client.grow(1, max(1, want), no_notify=True)
        elif backlog == 0 and workers > 0 and len(list(doing.iterdir())) < workers:
            idle = workers - len(list(doing.iterdir()))
            log(f"releasing {idle} idle worker(s)")
            client.release(count=idle, no_notify=True)
        time.sleep(0.2)
    # A release or grow may still be under way: its tasks cannot be released until it
    # settles, so wait for that before counting the workers to give back.
    workers = client.wait(timeout=30).size - 1
    if workers > 0:
        # Give the workers back before the job ends, and see it committed: the job's
        # accounting then shows the shrink, and nothing is charged for idle tasks. A
        # grow that still pends is cancelled by the same request.
        client.release(count=workers, no_notify=True, wait=True, timeout=30, cancel_pending=True)
    log("all items done")
    return 0


def worker(root: Path, work: float) -> int:
    todo, doing, done = spool(root)
    me = os.environ["XCE_TASK_ID"]

    def on_term(signum: int, frame: object) -> None:
        global STOP
        STOP = True

    signal.signal(signal.SIGTERM, on_term)
    while not STOP:
        items = sorted(todo.iterdir())
        claimed = None
        for item in items:
            target = doing / f"{item.name}.{me}"
            try:
                item.rename(target)  # atomic: exactly one worker wins the item
            except FileNotFoundError:
                continue
            claimed = target
            break
        if claimed is None:
            time.sleep(0.1)
            continue
        deadline = time.monotonic() + work
        while time.monotonic() < deadline and not STOP:
            time.sleep(0.01)
        name = claimed.name.rsplit(".", 1)[0]
        if STOP:
            claimed.rename(todo / name)  # released mid-item: give it back
            log(f"released: returned {name}")
            break
        claimed.rename(done / name)
    log("worker exits")
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--items", type=int, default=40)
    p.add_argument("--work", type=float, default=0.2, help="seconds per item")
    p.add_argument("--backlog", type=int, default=4, help="items per worker before growing")
    p.add_argument("--spool", type=Path, help="spool directory (default: ./spool-JOBID)")
    args = p.parse_args()
    root = args.spool or Path(f"spool-{os.environ.get('XCE_JOB_ID', 'local')}").resolve()
    if os.environ.get("XCE_TASK_ID", "0") == "0":
        return coordinator(root, args.items, args.backlog)
    return worker(root, args.work)


if __name__ == "__main__":
    sys.exit(main())
