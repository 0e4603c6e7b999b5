"""A host's ResizeObserver (xce_resize_plugin.host): the real plugin tells it every
transition as decided and every durable journal write, a restart hands it the live
jobs once, a broken observer never stops the journal's writer, and without an observer
nothing of it is imported or paid for (prometheus-client stays out of the plugin)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from xce_resize_plugin.core.facts import Committed, Fact, GrowPlaced, GrowRequested
from xce_resize_plugin.core.models import GrowRequest, Phase, ResizeState
from xce_resize_plugin.host import Principal
from xce_resize_plugin.journal import Entry, GroupCommitter, Journal

from .harness import Harness


class Watcher:
    """A ResizeObserver that keeps what it is told."""

    def __init__(self) -> None:
        self.phases: list[tuple[Phase | None, Phase]] = []
        self.facts: list[type] = []
        self.loaded: list[str] = []
        self.commits: list[tuple[float, int]] = []

    def resize_transition(
        self, before: ResizeState | None, after: ResizeState, facts: Sequence[Fact]
    ) -> None:
        if not facts:
            assert before is None
            self.loaded.append(after.job_id)
            return
        self.phases.append((None if before is None else before.phase, after.phase))
        self.facts.extend(type(f) for f in facts)

    def journal_committed(self, seconds: float, entries: int) -> None:
        assert seconds >= 0 and entries >= 1
        self.commits.append((seconds, entries))


def _watched(h: Harness, watcher: Watcher) -> None:
    h.ctl.resize_observer = watcher  # type: ignore[attr-defined]
    h.ctl.start()


def test_the_observer_sees_each_transition_and_each_durable_write(tmp_path: Path) -> None:
    h = Harness(tmp_path, hosts=[("hA", 2)], autostart=False)
    watcher = Watcher()
    _watched(h, watcher)
    job = h.ctl.submit("alice", "1,2", runtime=1e6, resizable=True, alloc={"hA": 1})
    h.ctl.settle()
    h.request("alice", job, GrowRequest(1, 1))
    h.ctl.settle()
    assert h.ctl.job(job).tasks and len(h.ctl.job(job).tasks) == 2
    assert watcher.phases[0] == (None, Phase.GROW_PENDING)
    assert watcher.phases[-1][1] is Phase.IDLE
    assert {GrowRequested, GrowPlaced, Committed} <= set(watcher.facts)
    # journal_sync is on (the default): every transition was written durably, some
    # perhaps sharing a write; the observer saw each write once.
    assert sum(n for _, n in watcher.commits) == len(watcher.phases)
    assert watcher.loaded == []


def test_a_restart_hands_the_observer_each_live_job_once(tmp_path: Path) -> None:
    h = Harness(tmp_path, hosts=[("hA", 1)], autostart=False)
    _watched(h, Watcher())
    job = h.ctl.submit("alice", "1,2", runtime=1e6, resizable=True, alloc={"hA": 1})
    h.ctl.settle()
    h.request("alice", job, GrowRequest(1, 1))  # the host is full: it pends
    h.ctl.close()
    h.ctl = h._make()
    again = Watcher()
    _watched(h, again)
    assert again.loaded == [job]
    assert h.ctl.request_resize(Principal("alice"), job, GrowRequest(1, 1, cancel_pending=True))
    assert again.phases == [(Phase.GROW_PENDING, Phase.GROW_PENDING)]


def test_a_broken_commit_observer_does_not_stop_the_writer(tmp_path: Path) -> None:
    calls: list[int] = []

    def broken(seconds: float, entries: int) -> None:
        calls.append(entries)
        raise RuntimeError("observer bug")

    with Journal.open(tmp_path / "j") as journal:
        journal.start()
        with GroupCommitter(journal, observe=broken) as gc:
            for i in range(3):
                entry = Entry(job_id=f"j{i}", facts=(b"fact",), state=b"state")
                assert len(gc.submit(entry)) == 1
        assert journal.last_seq == 3
    assert calls == [1, 1, 1]


def test_the_plugin_imports_no_metrics_library() -> None:
    code = (
        "import sys\n"
        "import xce_resize_plugin.plugin, xce_resize_plugin.runtime\n"
        "import xce_resize_plugin.rest.http, xce_resize_plugin.controllers.live.server\n"
        "print(sorted(m for m in sys.modules if m.startswith('prometheus')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
