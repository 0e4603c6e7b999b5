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
