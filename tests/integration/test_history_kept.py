"""What a job's record keeps of its past (``EmbeddedController(history_kept=N)``, the
live controller's setting: docs/live-controller.md, "What a job's record keeps").

An elastic job resized all day must not have a record, and a store write per change,
that grows with every resize; and what is dropped must be only what can never be asked
for again: a task still held, or still alive, keeps its record.
"""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.integration.harness import Harness
from xce_resize_plugin.controllers.runners import NotificationRequest, NotificationResult
from xce_resize_plugin.controllers.sim import ScriptedNotificationRunner
from xce_resize_plugin.controllers.store import encode_job
from xce_resize_plugin.controllers.task_records import (
    LIVE_STATES,
    TaskRecord,
    TaskState,
    prune_ended,
)
from xce_resize_plugin.core.models import GrowRequest, ReleaseRequest

HOSTS = [(f"h{i}", 1) for i in range(12)]


def _noisy(request: NotificationRequest) -> NotificationResult:
    return NotificationResult(0, "exit 0", stdout="x" * 1000)


def _cycle(h: Harness, job_id: str) -> None:
    """Grow the job by up to 6 tasks, then release back to 6."""
    h.request("alice", job_id, GrowRequest(min_add=1, max_add=6))
    h.ctl.advance(10)
    size = len(h.ctl.job(job_id).tasks)
    h.request("alice", job_id, ReleaseRequest(count=size - 6))
    h.ctl.advance(10)


def _run(tmp_path: Path, kept: int | None, cycles: int) -> tuple[Harness, str, list[int]]:
    h = Harness(
        tmp_path,
        hosts=HOSTS,
        store="lmdb",
        history_kept=kept,
        notification_runner=ScriptedNotificationRunner(_noisy),
    )
    job_id = h.ctl.submit(
        "alice", (1, 12), initial_tasks=6, resizable=True, runtime=1e9, notify_cmd="note"
    )
    h.ctl.settle()
    sizes = []
    for _ in range(cycles):
        _cycle(h, job_id)
        sizes.append(len(encode_job(h.ctl._jobs[job_id], {})))
    return h, job_id, sizes


def test_a_job_resized_many_times_keeps_a_bounded_record(tmp_path: Path) -> None:
    h, job_id, sizes = _run(tmp_path / "kept", 4, 30)
    job = h.ctl.job(job_id)
    versions = [v.version for v in job.versions]
    assert versions[0] == 0 and len(versions) == 5 and versions[-1] == job.version == 60
    assert versions[1:] == list(range(57, 61))  # the newest, in order
    # Versions list every task: whatever history_kept, at most VERSIONS_KEPT besides
    # the first.
    big, big_id, _ = _run(tmp_path / "big", 10, 8)
    assert [v.version for v in big.ctl.job(big_id).versions] == [0, 13, 14, 15, 16]
    assert len(h.ctl.notifications(job_id)) == 4
    ended = [t for t, s in job.task_states.items() if s not in LIVE_STATES]
    assert len(ended) == 4 and ended == sorted(ended)[-4:]
    # Every task the job holds keeps its record; the record stops growing.
    assert {t.id for t in job.held} <= set(job.task_states)
    assert sizes[-1] < 1.1 * sizes[10]  # (times and ids get longer)
    assert h.ctl.check_invariants() == []
    # Kept whole (simulations, scenarios), the same run's record grows with each resize.
    whole, whole_id, whole_sizes = _run(tmp_path / "whole", None, 30)
    assert len(whole.ctl.job(whole_id).versions) == 61
    assert whole_sizes[-1] > 2 * whole_sizes[10]
    assert whole.ctl.job(whole_id).tasks == job.tasks


def test_a_restart_on_a_pruned_record_resumes_and_goes_on(tmp_path: Path) -> None:
    """The store holds the pruned record: a controller restarted on it finds the job as
    it was, and resizes it further (task ids go on from the newest, never reused)."""
    h, job_id, _ = _run(tmp_path, 3, 12)
    before = h.ctl.job(job_id)
    h.crash_and_restart()
    after = h.ctl.job(job_id)
    assert (after.tasks, after.version, after.versions) == (
        before.tasks,
        before.version,
        before.versions,
    )
    _cycle(h, job_id)
    again = h.ctl.job(job_id)
    assert again.version == before.version + 2 and len(again.versions) == 4  # 1 + 3
    grown = {t.id for t in again.versions[-2].tasks} - {t.id for t in before.tasks}
    assert grown and min(grown) > max(t.id for t in before.versions[-2].tasks)
    assert h.ctl.check_invariants() == []


_STATES = st.sampled_from(list(TaskState))


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(st.integers(0, 60), _STATES, max_size=40),
    st.sets(st.integers(0, 60), max_size=20),
    st.integers(0, 10),
)
def test_only_ended_unheld_tasks_beyond_the_newest_are_dropped(
    states: dict[int, TaskState], held: set[int], keep: int
) -> None:
    records = {tid: TaskRecord("h1", state, 0.0) for tid, state in states.items()}
    said = prune_ended(records, held, keep)
    droppable = sorted(t for t, s in states.items() if s not in LIVE_STATES and t not in held)
    gone = set(states) - set(records)
    assert gone == set(droppable[: max(0, len(droppable) - keep)]) == set(said)
