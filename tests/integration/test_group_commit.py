"""Concurrent requests share fsyncs (group commit) and none is lost or doubled."""

from __future__ import annotations

import threading
from pathlib import Path

from xce_resize_plugin import plugin
from xce_resize_plugin.core.models import CancelRequest, GrowRequest, Phase
from xce_resize_plugin.host import Principal
from xce_resize_plugin.journal import Journal

from .harness import Harness


def test_concurrent_requests_are_group_committed(tmp_path: Path) -> None:
    h = Harness(tmp_path, hosts=[("hA", 64)])  # journal_sync defaults to true: durable
    jobs = [
        h.ctl.submit("alice", "1,64", runtime=1e6, resizable=True, alloc={"hA": 1})
        for _ in range(32)
    ]
    h.ctl.settle()
    runtime = plugin.runtime_of(h.ctl)
    assert runtime._committer is not None
    errors: list[BaseException] = []
    barrier = threading.Barrier(len(jobs))

    hook = h.ctl.plugin_manager.hook  # what REST handler threads call

    def client(job_id: str) -> None:
        owner = Principal("alice")
        try:
            barrier.wait()
            for _ in range(5):
                status = hook.xce_resize_request(
                    controller=h.ctl, principal=owner, job_id=job_id, request=GrowRequest(1, 1)
                )
                assert status is not None and status.phase is Phase.GROW_PENDING
                hook.xce_resize_request(
                    controller=h.ctl, principal=owner, job_id=job_id, request=CancelRequest()
                )
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=client, args=(j,)) for j in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    committer = runtime._committer
    requests = len(jobs) * 10
    assert committer.entries == requests
    assert committer.transactions < requests  # fsyncs were shared
    h.ctl.stop()
    with Journal.open(tmp_path / "resize", readonly=True) as journal:
        kinds = [p for _, _, p in journal.facts()]
    # every request is there exactly once: 32 JobTracked + 160 grows + 160 cancels
    assert len(kinds) == len(jobs) + requests
