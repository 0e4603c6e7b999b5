"""Answers kept between scheduler cycles give the run every fresh answer would give
(docs/performance.md, "Speed of the whole HPC2N run"): the plugin's reclaim decision,
kept while the head, the job states and the jobs asked stay the same (and its
candidates, while all but the free slots do), and the host's description of the
blocked head, kept until its ledger changes.

A trace run with reclaim on (the shrinking driver) is made twice: as it runs, and with
every kept answer thrown away before it could be used; the two must agree job by job.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs
import pytest

from xce_resize_plugin import plugin
from xce_resize_plugin.controllers.sim.sim_controller import EmbeddedController
from xce_resize_plugin.core.models import GrowRequest
from xce_resize_plugin.core.reclaim import QueueHead
from xce_resize_plugin.host import ClusterView, Principal
from xce_resize_plugin.runtime import Runtime
from xce_resize_plugin.simulation.simulate import RunResult, SimOptions, load_workload, run_mode

from .harness import Harness

CTC1000 = Path(__file__).resolve().parents[1] / "data" / "CTC-SP2-1996-3.1-cln-first1000.swf.gz"
OPTIONS = SimOptions(malleable_fraction=0.5, limit=600)


def _elastic() -> RunResult:
    result = run_mode(load_workload(CTC1000, OPTIONS), OPTIONS, "elastic", job_rows=True)
    assert result.problems == ()
    return result


def _same_run(a: RunResult, b: RunResult) -> None:
    assert a.jobs == b.jobs
    assert a.metrics == b.metrics
    assert (a.events, a.requests, a.refused) == (b.events, b.requests, b.refused)


def test_a_kept_reclaim_decision_is_the_one_a_fresh_decision_gives(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls = {"decided": 0, "asked": 0}
    decide, ask = Runtime._reclaim_decide, Runtime._ask_reclaim

    def counted_decide(self: Runtime, *args: Any) -> bool:
        calls["decided"] += 1
        return decide(self, *args)

    def counted_ask(self: Runtime, *args: Any) -> bool:
        calls["asked"] += 1
        return ask(self, *args)

    monkeypatch.setattr(Runtime, "_reclaim_decide", counted_decide)
    monkeypatch.setattr(Runtime, "_ask_reclaim", counted_ask)
    kept = _elastic()
    decided_kept, asked = calls["decided"], calls["asked"]
    assert asked > 0  # the run does reclaim: the test would see a stale answer

    reclaim = Runtime._reclaim

    def fresh(self: Runtime, cluster: ClusterView) -> bool:
        self._reclaim_seen = self._candidates_kept = None
        return reclaim(self, cluster)

    monkeypatch.setattr(Runtime, "_reclaim", fresh)
    calls["decided"] = 0
    _same_run(_elastic(), kept)
    # The kept answer was used (else this test shows nothing).
    assert decided_kept < calls["decided"]


def test_the_kept_head_description_is_always_the_fresh_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    head_slots = EmbeddedController._head_slots
    seen = {"kept": 0, "asked": 0}

    def checked(self: EmbeddedController) -> Any:
        was_kept = self._head_kept is not None and (
            self._head_kept[0] == self._cluster.change_epoch
        )
        answer = head_slots(self)
        self._head_kept = None
        assert head_slots(self) == answer
        seen["asked"] += 1
        seen["kept"] += was_kept
        return answer

    monkeypatch.setattr(EmbeddedController, "_head_slots", checked)
    _elastic()
    assert seen["kept"] > 0 and seen["asked"] > seen["kept"]


def test_reclaim_decides_again_once_a_state_or_the_head_changed(tmp_path: Path) -> None:
    h = Harness(tmp_path, hosts=[("hA", 4), ("hB", 4)], config={"reclaim": "shrink"})
    ctl = h.ctl
    # Job 1 holds every slot at its minimum: nothing to reclaim for job 2.
    ctl.submit("ann", (8, 9), resizable=True, alloc={"hA": 4, "hB": 4}, runtime=1000, job_id="1")
    ctl.submit("bob", 4, runtime=100, job_id="2")
    ctl.settle()
    runtime = plugin.runtime_of(ctl)
    decided: list[str] = []
    decide = runtime._reclaim_decide

    def counted(queued: QueueHead, now: float) -> bool:
        decided.append(queued.job_id)
        return decide(queued, now)

    runtime._reclaim_decide = counted  # type: ignore[method-assign]
    ctl.settle()
    assert decided == []  # the same head, states and jobs asked: the answer stands
    # A grow that cannot be placed: a state stored, the ledger unchanged.
    h.request("ann", "1", GrowRequest(1, 1))
    assert runtime.states["1"].pending is not None
    assert decided == ["2"]
    ctl.submit("cat", 1, runtime=100, job_id="3")  # behind the head: nothing it reads
    ctl.settle()
    assert decided == ["2"]
    ctl.advance(1000)  # job 1 ends, job 2 starts: no blocked head any more
    assert decided == ["2"]


def test_reclaim_candidates_follow_a_stored_state(tmp_path: Path) -> None:
    h = Harness(tmp_path, hosts=[("hA", 4), ("hB", 4)], config={"reclaim": "shrink"})
    ctl = h.ctl
    ctl.submit("ann", (2, 8), resizable=True, alloc={"hA": 4, "hB": 2}, runtime=1000, job_id="1")
    ctl.settle()
    runtime = plugin.runtime_of(ctl)
    head = QueueHead("9", 4, None, resizable=("1",))
    (before,) = runtime._reclaim_candidates(head)
    assert runtime._reclaim_candidates(head) == (before,)
    assert before.excess == 4 and not before.pending_grow
    # A grow asked (not placed before the next cycle): the same jobs, another state.
    ctl.request_resize(Principal("ann"), "1", GrowRequest(1, 1))
    (after,) = runtime._reclaim_candidates(head)
    assert after.excess == 4 and after.pending_grow


def test_the_hosts_excess_bound_changes_no_decision(monkeypatch: pytest.MonkeyPatch) -> None:
    """The host's ``resizable_excess`` lets the plugin refuse a head no reclaim starts
    without listing candidates: the run is the one made without the bound."""
    listed = {"n": 0}
    candidates = Runtime._reclaim_candidates

    def counted(self: Runtime, queued: QueueHead) -> Any:
        listed["n"] += 1
        return candidates(self, queued)

    monkeypatch.setattr(Runtime, "_reclaim_candidates", counted)
    bounded = _elastic()
    listed_bounded, listed["n"] = listed["n"], 0

    queue_head = EmbeddedController._queue_head

    def unbounded(self: EmbeddedController) -> QueueHead | None:
        head = queue_head(self)
        return None if head is None else attrs.evolve(head, resizable_excess=None)

    monkeypatch.setattr(EmbeddedController, "_queue_head", unbounded)
    _same_run(_elastic(), bounded)
    assert listed_bounded < listed["n"]  # the bound spared listings (else: shows nothing)


def test_the_kept_queue_head_is_always_the_fresh_one(monkeypatch: pytest.MonkeyPatch) -> None:
    queue_head = EmbeddedController._queue_head
    seen = {"same": 0, "asked": 0}

    def checked(self: EmbeddedController) -> QueueHead | None:
        before = self._queue_head_kept
        answer = queue_head(self)
        self._queue_head_kept = None
        fresh = queue_head(self)
        assert fresh == answer
        seen["asked"] += 1
        if answer is not None and before is not None and before[3] is answer:
            seen["same"] += 1
            self._queue_head_kept = before  # keep the kept one, as the run would
        return answer

    monkeypatch.setattr(EmbeddedController, "_queue_head", checked)
    _elastic()
    assert seen["same"] > 0 and seen["asked"] > seen["same"]
