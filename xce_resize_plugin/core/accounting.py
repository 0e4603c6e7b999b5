"""The allocation timeline: slot-seconds per segment, and the resize records.

Pure. The timeline is the job's *charged* slots (committed tasks plus a grow's reserved
ones, minus a shrink's already stopped ones), stepping at the facts that reserve or free
slots — the same count that limits and quotas see, so usage is never more or less than
what the job held (docs/architecture.md, "Resize semantics").
"""

from __future__ import annotations

from attrs import frozen

from xce_resize_plugin.core.models import (
    JobInfo,
    JobState,
    PendingGrow,
    ResizeRecord,
    ResizeState,
    Segment,
)


@frozen
class Usage:
    """A job's allocation timeline up to a time, and its resize records."""

    job_id: str
    segments: tuple[Segment, ...]
    records: tuple[ResizeRecord, ...] = ()
    #: Whether autoresize is on, and its demand (the pending grow the plugin keeps).
    autoresize: bool = False
    demand: PendingGrow | None = None

    @property
    def slot_seconds(self) -> float:
        return sum(s.slot_seconds for s in self.segments)


def segments(steps: tuple[tuple[float, int], ...], end: float) -> tuple[Segment, ...]:
    """Turn ``(time, slots)`` steps into segments ending at ``end``; empty ones dropped."""
    out = []
    for i, (start, slots) in enumerate(steps):
        stop = steps[i + 1][0] if i + 1 < len(steps) else end
        stop = min(stop, end)
        if stop > start and slots > 0:
            out.append(Segment(start, stop, slots))
    return tuple(out)


def usage_of_state(state: ResizeState, now: float) -> Usage:
    """Usage of a job the plugin tracks (it has resized, or asked to)."""
    end = state.ended_at if state.ended_at is not None else now
    pending = state.pending
    demand = pending if pending is not None and pending.auto else None
    return Usage(
        state.job_id, segments(state.charges, end), state.records, state.autoresize, demand
    )


def usage_of_job(job: JobInfo, now: float) -> Usage:
    """Usage of a job that never resized: its dispatch allocation from start to end."""
    if job.start_time is None:
        return Usage(job.id, (), autoresize=job.autoresize)
    end = job.end_time if job.end_time is not None else now
    steps = segments(((job.start_time, len(job.tasks)),), end)
    return Usage(job.id, steps, autoresize=job.autoresize)


def job_of_record(state: ResizeState) -> JobInfo | None:
    """The job as the plugin's record of it has it, once it has ended (``None`` before):
    for a job the host has forgotten (docs/host-integration.md, ``xce_acct_job``).

    What only the host knew is not in the record: the job is given as ``DONE`` (how it
    ended is the host's), with no environment, notification command or span options.
    """
    if state.ended_at is None:
        return None
    return JobInfo(
        id=state.job_id,
        user=state.user,
        state=JobState.DONE,
        min_tasks=state.min_tasks,
        max_tasks=state.max_tasks,
        tasks=state.tasks,
        resizable=True,
        start_time=state.started_at,
        end_time=state.ended_at,
        autoresize=state.autoresize,
    )
