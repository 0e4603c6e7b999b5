"""Time-parallel simulation: one run split in time over several processes.

A run is a sequence of instants, each depending on the state the one before left. It
cannot be cut at a chosen job and its two halves run at once, as the second half's
starting state is known only once the first has run. But the state of a batch system
forgets: started from an empty machine at job ``k``, a run of the workload's end soon
finds the state of the run from the start (in HPC2N, 1,500-2,600 jobs after ``k``; the
jobs running at ``k`` end, the queue drains once), and from that instant on both runs are
the same, event for event. This is the "state matching" of time-parallel simulation
(Lin and Lazowska, 1991).

So a *segment* runs the workload from job ``first`` on an empty machine. When a
process has nothing to do, the coordinator (.parallel) splits the busiest segment: a
new segment starts at a job ``cut`` about half way through what the old one has left. The new
segment pauses at a few *probes* after ``cut`` (the first job of an instant), and sends
the digest of its state there (.pause_state); the old segment pauses at the same probes
and compares. At the first probe where the digests are equal it stops: its result up
to there, joined with the new segment's from there, is the run's result (:func:`joined`),
the same as one process would have found. If no probe matches, the old segment goes on
alone and the new one is dropped: a time-parallel run is never wrong, at worst no faster.

Joining needs what the new segment had gathered at the probe, to take it out: a
:class:`Mark` at each probe records the lengths of what only grows (waits, run times,
usage steps, problems found, per-job rows) and the counters, and restarts the maxima
(peak usage, last end) and the warnings' tally, so that what comes after the probe is
known exactly.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import attrs
from attrs import frozen

from xce_resize_plugin.simulation.checks import MAX_PROBLEMS, Check
from xce_resize_plugin.simulation.jobs_csv import JobRows
from xce_resize_plugin.simulation.metrics import RunStats, UsageTrack
from xce_resize_plugin.simulation.run_log import LogSummary
from xce_resize_plugin.simulation.simulate import Gathered, RunParts, Workload

__all__ = ["PROBE_OFFSETS", "Mark", "joined", "probes_after", "take_mark"]

#: Where a new segment is compared with the one it relieves: these many jobs after its
#: first (then the next job that opens an instant). Every 512 jobs up to 16,384 (most
#: runs meet within 2,000 to 7,000 jobs on HPC2N, and a probe costs the two a cheap
#: signature, and a digest only where the signatures agree or the budget allows,
#: see .parallel), then every 2,048 up to 65,536, for machines whose state takes
#: longer to forget (a synthetic machine of 65,536 hosts: 5,000 to 20,000 jobs).
PROBE_OFFSETS = (256, *range(512, 16_385, 512), *range(18_432, 65_537, 2048))


def instant_start(workload: Workload, i: int) -> int:
    """The first job index at or after ``i`` whose arrival opens an instant (the job
    before it arrives earlier): a pause before that instant has submitted exactly the
    jobs before it. ``len(jobs)`` if there is none."""
    jobs = workload.jobs
    n = len(jobs)
    while 0 < i < n and jobs[i].submit == jobs[i - 1].submit:
        i += 1
    return min(i, n)


def probes_after(
    workload: Workload, cut: int, offsets: Sequence[int] = PROBE_OFFSETS
) -> tuple[int, ...]:
    """The probes of a segment starting at job ``cut``, increasing, within the jobs."""
    out: list[int] = []
    n = len(workload.jobs)
    for offset in offsets:
        p = instant_start(workload, cut + offset)
        if p >= n:
            break
        if not out or p > out[-1]:
            out.append(p)
    return tuple(out)


@frozen
class Mark:
    """What a segment had gathered at a probe (see the module docstring)."""

    waits: int
    usage_steps: int
    #: The maxima since the mark before (then restarted): usage peak, last end, ledger.
    peaks: tuple[int, float, int]
    counters: tuple[int, ...]
    #: Each check's problems listed since the mark before (the lists then restart, so
    #: that what comes after has the room one process would have given it).
    problems: tuple[tuple[str, ...], ...]
    counts: tuple[int, ...]
    requests: int
    refused: Mapping[str, int]
    #: The warnings since the mark before (the tally then restarts).
    warnings: tuple[LogSummary, ...]
    rows: int


def _counters(stats: RunStats, parts: RunParts) -> tuple[int, ...]:
    checks = parts.checks
    extra: tuple[int, ...] = ()
    if checks is not None:
        easy = checks.easy.backfilled if checks.easy is not None else 0
        extra = (checks.completion.expected, checks.completion.ended, easy)
    return (stats.ended, stats.started, stats.requeued, stats.grows, stats.shrinks, *extra)


def _checks(parts: RunParts) -> tuple[Check, ...]:
    return parts.checks.all if parts.checks is not None else ()


def _rows(parts: RunParts) -> JobRows | None:
    return next((o for o in parts.extra if isinstance(o, JobRows)), None)


def take_mark(parts: RunParts) -> Mark:
    """The mark of a segment paused at a probe; restarts its maxima and its tally."""
    stats, usage = parts.stats, parts.stats.usage
    ledger = parts.checks.ledger if parts.checks is not None else None
    checks = _checks(parts)
    rows = _rows(parts)
    mark = Mark(
        waits=len(stats.waits),
        usage_steps=len(usage.times),
        peaks=(usage.peak, stats.makespan, ledger.peak if ledger is not None else 0),
        counters=_counters(stats, parts),
        problems=tuple(tuple(c.problems) for c in checks),
        counts=tuple(c.count for c in checks),
        requests=parts.driver.requests,
        refused=parts.driver.refused,
        warnings=parts.tally.summaries() if parts.tally is not None else (),
        rows=len(rows.rows) if rows is not None else 0,
    )
    # What comes after the mark, alone: the maxima restart from the level now (usage
    # and the ledger stay where they are; no job has ended since), the tally anew.
    usage.peak = usage._u
    stats.makespan = 0.0
    if ledger is not None:
        ledger.peak = ledger.total
    if parts.tally is not None:
        parts.tally.restart()
    for check in checks:
        check.problems = []
    return mark


def joined(
    head: Gathered,
    tail: Gathered,
    marks: Mapping[int, Mark],
    at: int,
    rows: tuple[JobRows | None, JobRows | None] = (None, None),
) -> Gathered:
    """The run of ``head`` up to the probe ``at`` (where it stopped) followed by
    ``tail`` from there. ``tail`` may itself have stopped later (the result then stops
    there too); its marks from ``at`` on say what it gathered after. ``head`` is
    changed in place and returned."""
    later = sorted(p for p in marks if p > at)
    m = marks[at]
    _join_stats(head.stats, tail.stats, m, [marks[p] for p in later])
    if head.checks is not None and tail.checks is not None:
        _join_checks(head.checks.all, tail.checks.all, m, [marks[p] for p in later])
        _join_counters(head, tail, m)
        ledger_after = max([marks[p].peaks[2] for p in later] + [tail.checks.ledger.peak])
        head.checks.ledger.peak = max(head.checks.ledger.peak, ledger_after)
        # What the checks hold of the jobs alive is the tail's (the same jobs).
        for mine, theirs in zip(head.checks.all, tail.checks.all, strict=True):
            _take_live(mine, theirs)
    refused = dict(head.refused)
    for code, n in tail.refused.items():
        refused[code] = refused.get(code, 0) + n - m.refused.get(code, 0)
    warnings = _join_warnings(head.warnings, [*(marks[p].warnings for p in later), tail.warnings])
    if rows[0] is not None and rows[1] is not None:
        rows[0].rows.extend(rows[1].rows[m.rows :])
        _take_live(rows[0], rows[1])
    return attrs.evolve(
        head,
        requests=head.requests + tail.requests - m.requests,
        refused={k: v for k, v in refused.items() if v},
        warnings=warnings,
        rejections=tail.rejections,
        invariants=tail.invariants,
        stopped=tail.stopped,
    )


def _join_stats(head: RunStats, tail: RunStats, m: Mark, later: Sequence[Mark]) -> None:
    head.waits.extend(tail.waits[m.waits :])
    head.runs.extend(tail.runs[m.waits :])
    (ended, started, requeued, grows, shrinks) = (
        tail.ended - m.counters[0],
        tail.started - m.counters[1],
        tail.requeued - m.counters[2],
        tail.grows - m.counters[3],
        tail.shrinks - m.counters[4],
    )
    head.ended += ended
    head.started += started
    head.requeued += requeued
    head.grows += grows
    head.shrinks += shrinks
    head.makespan = max([head.makespan, tail.makespan, *(k.peaks[1] for k in later)])
    _join_usage(head.usage, tail.usage, m, later)
    _take_live(head, tail)


def _join_usage(head: UsageTrack, tail: UsageTrack, m: Mark, later: Sequence[Mark]) -> None:
    """The usage steps after the mark appended, and the area summed over them in the
    order one process would have (so the utilization is the same to the last bit)."""
    first_new = len(head.times)
    head.times.extend(tail.times[m.usage_steps :])
    head.used.extend(tail.used[m.usage_steps :])
    times, used = head.times, head.used
    area = head.area
    t, u = head._t, head._u
    for i in range(first_new, len(times)):
        area += u * (times[i] - t)
        t, u = times[i], used[i]
    head.area, head._t, head._u = area, t, u
    head.peak = max([head.peak, tail.peak, *(k.peaks[0] for k in later)])


def _join_checks(
    head: Sequence[Check], tail: Sequence[Check], m: Mark, later: Sequence[Mark]
) -> None:
    """The problems listed after the mark appended while there is room (as one process
    lists them), and the counts summed."""
    for i, (mine, theirs) in enumerate(zip(head, tail, strict=True)):
        after = [p for k in later for p in k.problems[i]] + theirs.problems
        mine.problems.extend(after[: MAX_PROBLEMS - len(mine.problems)])
        mine.count += theirs.count - m.counts[i]


def _join_counters(head: Gathered, tail: Gathered, m: Mark) -> None:
    assert head.checks is not None and tail.checks is not None
    completion, theirs = head.checks.completion, tail.checks.completion
    completion.expected += theirs.expected - m.counters[5]
    completion.ended += theirs.ended - m.counters[6]
    if head.checks.easy is not None and tail.checks.easy is not None:
        head.checks.easy.backfilled += tail.checks.easy.backfilled - m.counters[7]


#: What each observer gathers that only grows or counts (joined above); everything
#: else it holds describes the jobs alive and is the tail's.
_JOINED = frozenset(
    {
        "waits",
        "runs",
        "ended",
        "started",
        "requeued",
        "grows",
        "shrinks",
        "makespan",
        "usage",
        "_progress",
        "_every",
        "problems",
        "count",
        "expected",
        "backfilled",
        "peak",
        "rows",
        "run",
        "_malleable",
    }
)


def _take_live(mine: object, theirs: object) -> None:
    for name, value in vars(theirs).items():
        if name not in _JOINED:
            setattr(mine, name, value)


def _join_warnings(
    head: Sequence[LogSummary], intervals: Sequence[Sequence[LogSummary]]
) -> tuple[LogSummary, ...]:
    kinds: dict[tuple[str, str], LogSummary] = {(w.logger, w.pattern): w for w in head}
    for interval in intervals:
        for w in interval:
            key = (w.logger, w.pattern)
            seen = kinds.get(key)
            kinds[key] = w if seen is None else attrs.evolve(seen, count=seen.count + w.count)
    return tuple(kinds.values())
