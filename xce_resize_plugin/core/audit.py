"""Domain checks of a journal, on top of the journal's own CRC and structure checks.

``xce-resize journal verify`` runs both: every job's facts must decode, replay through
the engine to exactly the materialised state stored beside them, and that state must
satisfy the resize invariants (task 0 kept, size within the job's bounds, at most one
change in flight).
"""

from __future__ import annotations

from pathlib import Path

from xce_resize_plugin.core import converters, engine
from xce_resize_plugin.core.models import ChangeKind, ResizeState
from xce_resize_plugin.journal import Journal


def state_problems(state: ResizeState) -> list[str]:
    """Invariants one materialised state must satisfy."""
    job = state.job_id
    out = []
    ids = [t.id for t in state.tasks]
    if len(set(ids)) != len(ids):
        out.append(f"job {job}: a task id appears twice in the allocation")
    if state.live and state.tasks and state.tasks[0].id != 0:
        out.append(f"job {job}: task 0 is not the head of the allocation")
    change = state.change
    size = len(state.tasks)
    if change is not None and change.kind is ChangeKind.SHRINK:
        size -= len(change.tasks)
    if change is not None and change.kind is ChangeKind.GROW:
        size += len(change.tasks)
    # A release_exited job keeps running when tasks that exited took it below its
    # minimum (docs/in-job-api.md, "Readiness and exits"): only then may it be there.
    exited = any(r.reason == "task_exit" for r in state.records)
    low = size < state.min_tasks and not exited
    if state.live and (low or size > state.max_tasks):
        out.append(
            f"job {job}: {size} tasks (in flight included) outside "
            f"{state.min_tasks}..{state.max_tasks}"
        )
    if change is not None and state.pending is not None:
        out.append(f"job {job}: a pending grow beside a change in flight")
    target = state.target
    if state.live and target is not None:
        if not state.min_tasks <= target.tasks <= state.max_tasks:
            out.append(
                f"job {job}: target {target.tasks} outside {state.min_tasks}..{state.max_tasks}"
            )
        if state.autoresize:
            out.append(f"job {job}: a target and autoresize at once")
        if 0 in target.release_prefer:
            out.append(f"job {job}: task 0 among the target's preferred releases")
    return out


def replay_problems(path: Path | str) -> list[str]:
    """Replay every job's facts and compare with its stored state."""
    problems: list[str] = []
    with Journal.open(path, readonly=True) as journal:
        jobs = {job_id for _, job_id, _ in journal.facts()}
        for job_id in sorted(jobs):
            try:
                facts = [converters.decode_fact(p) for _, p in journal.job_facts(job_id)]
                replayed = engine.replay(facts)
                stored_bytes = journal.state(job_id)
                stored = converters.decode_state(stored_bytes) if stored_bytes else None
            except Exception as exc:  # any decoding or replay failure is a finding
                problems.append(f"job {job_id}: cannot replay: {type(exc).__name__}: {exc}")
                continue
            if stored is None:
                problems.append(f"job {job_id}: facts but no stored state")
            elif replayed != stored:
                problems.append(f"job {job_id}: stored state differs from the replay of its facts")
            else:
                problems.extend(state_problems(stored))
    return problems
