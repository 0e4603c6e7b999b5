"""Both runs of a simulation on the local cores, each split in time when a core is free.

``simulate`` starts one worker process per core (forked: they inherit the read
workload). The rigid run goes to one, the elastic run to another. A worker that has
nothing left to do is given the end of the busiest run: the coordinator (this process)
asks that run's segment to take a successor at a job about half way through what it has left,
and the successor runs from there on an empty machine until the two meet
(:mod:`.segments`). On two cores this puts the second core to work once the shorter
run is done, instead of leaving it idle while the longer one finishes.

Messages (tuples, through one pipe per worker; every one names its run and segment, so
a late one for a segment gone is recognised and dropped):

- coordinator to worker: ``run``, ``split`` (take a successor at a job), ``digest`` (the
  successor's, at a probe), ``met`` (the predecessor stopped: no more digests),
  ``stop`` (the segment is dropped), ``gone`` (the successor is), ``quit``;
- worker to coordinator: ``progress``, ``split-ok``/``split-no``, ``digest``, ``met``
  (stopped at a probe), ``no-meet`` (went on alone), ``done`` (with what it gathered),
  ``dropped``, ``error``.
"""

from __future__ import annotations

import contextlib
import gc
import math
import multiprocessing
import os
import signal
import tempfile
import time
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

import attrs

from xce_resize_plugin.controllers.sim import EmbeddedController
from xce_resize_plugin.simulation.jobs_csv import JobRows
from xce_resize_plugin.simulation.pause_state import digest, signature
from xce_resize_plugin.simulation.segments import (
    PROBE_OFFSETS,
    Mark,
    instant_start,
    joined,
    probes_after,
    take_mark,
)
from xce_resize_plugin.simulation.simulate import (
    MODES,
    Gathered,
    Mode,
    ProgressFn,
    RunParts,
    RunResult,
    SimOptions,
    SimulationError,
    Workload,
    gather_run,
    result_of,
)

__all__ = ["can_split", "run_both"]

#: Jobs between a segment's looks at its messages (and its progress reports).
CHUNK = 512
#: Jobs a segment must have left to be split: the two meet some thousands of jobs
#: after the cut (.segments), and that much is done twice.
MIN_SPLIT = 24_000
#: Jobs after a cut at which segments typically meet (HPC2N: 1,500 to 13,000).
MEETING = 3000
#: The most of its time a new segment spends on digests (what it skips, it still
#: sends the signature of, and the segment it relieves can meet it at a later probe).
DIGEST_SHARE = 0.2
#: Seconds of digests a segment makes before it counts them against its time.
DIGEST_FREE = 0.25


class _Dropped(Exception):
    """The coordinator dropped this segment (the one it was to relieve went on alone)."""


class _Quit(BaseException):
    """The coordinator is done: the worker ends, whatever it was running (not an
    ``Exception``: a run's failure is reported, this is not)."""


#: The most worker processes :func:`run_both` starts by default: each split runs some
#: thousands of jobs twice, and halves of halves soon leave too little to split.
MAX_WORKERS = 8


def default_workers() -> int:
    """The cores this process may use (at least two, at most :data:`MAX_WORKERS`)."""
    affinity = getattr(os, "sched_getaffinity", None)
    cores = len(affinity(0)) if affinity is not None else (os.cpu_count() or 1)
    return max(2, min(MAX_WORKERS, cores))


def can_split(workload: Workload, options: SimOptions, job_rows: bool) -> bool:
    """Whether runs of this workload may be split in time. Not:

    - with a site's policy files (``[resize] policy_files``): a policy is Python code
      whose module may keep state of its own (a count, a quota), which no digest can
      see, so two runs could seem to meet and not;
    - with injected host failures: a requeued job's history is read back from the
      plugin's journal, which a digest leaves out;
    - when job ids repeat: a digest leaves out the ids of forgotten jobs.
    """
    del job_rows  # per-job rows are joined like the rest
    if options.host_failures is not None or options.resize_config().get("policy_files"):
        return False
    ids = [j.id for j in workload.jobs]
    return len(set(ids)) == len(ids)


# -- the worker side ----------------------------------------------------------------


@attrs.define(eq=False)
class _Stepper:
    """Drives one segment: pauses at its chunk ends and probes, answers the
    coordinator, publishes its digests and marks, compares with its successor's."""

    conn: Connection
    workload: Workload
    mode: Mode
    seg: int
    first: int
    #: Probes where this segment sends its digest to the one it relieves.
    publish: list[int]
    chunk: int = CHUNK
    offsets: tuple[int, ...] = PROBE_OFFSETS
    marks: dict[int, Mark] = attrs.Factory(dict)
    #: Probes where it compares with its successor's digests, and theirs so far
    #: (signature, digest or None where the successor saved the cost of one).
    meet: list[int] = attrs.Factory(list)
    theirs: dict[int, tuple[Any, bytes | None]] = attrs.Factory(dict)
    #: Seconds spent on digests (and, for the ones it publishes, on sending them),
    #: and when this segment started.
    digesting: float = 0.0
    began: float = attrs.Factory(time.perf_counter)

    def __call__(self, ctl: EmbeddedController, parts: RunParts) -> int | None:
        jobs = self.workload.jobs
        n = len(jobs)
        pos, first_call = self.first, True
        next_chunk = instant_start(self.workload, pos + self.chunk)
        while True:
            self._poll(pos, block=False)
            target = min([next_chunk, *self.publish[:1], *self.meet[:1]])
            if target >= n:
                ctl.run_before(math.inf, first=first_call)
                self.conn.send(("progress", self.mode, self.seg, n))
                return None
            ctl.run_before(jobs[target].submit, first=first_call)
            first_call, pos = False, target
            if self.publish and self.publish[0] == pos:
                self.publish.pop(0)
                self._publish(ctl, parts, pos)
            if self.meet and self.meet[0] == pos:
                self.meet.pop(0)
                if self._met(ctl, parts, pos):
                    return pos
                if not self.meet:
                    self.conn.send(("no-meet", self.mode, self.seg))
            if pos >= next_chunk:
                self.conn.send(("progress", self.mode, self.seg, pos))
                next_chunk = instant_start(self.workload, pos + self.chunk)

    def _publish(self, ctl: EmbeddedController, parts: RunParts, p: int) -> None:
        """Send the state at probe ``p``: its signature always, its digest unless
        digests have cost more than :data:`DIGEST_SHARE` of this segment's time (a
        machine of 65,536 hosts with jobs of thousands of tasks has a state of
        megabytes; the one relieved cannot meet at this probe then, but at a later)."""
        t = time.perf_counter()
        found = digest(ctl, parts.driver) if self._may_digest(t) else None
        self.marks[p] = take_mark(parts)
        self.conn.send(("digest", self.mode, self.seg, p, (signature(ctl), found)))
        self.digesting += time.perf_counter() - t

    def _met(self, ctl: EmbeddedController, parts: RunParts, p: int) -> bool:
        # The successor publishes every probe in order, and it is ahead: wait for it
        # (with the probe back in the list meanwhile, so that no split is taken).
        self.meet.insert(0, p)
        while p not in self.theirs:
            self._poll(p, block=True)
        self.meet.pop(0)
        theirs, found = self.theirs[p]
        if found is None or signature(ctl) != theirs:
            return False
        # The same budget as its successor's (:meth:`_publish`): on a machine whose
        # state is megabytes, runs whose signatures agree at every probe and whose
        # digests never do would otherwise spend seconds a probe. Over it, this probe
        # is passed over; a later one may still meet.
        t = time.perf_counter()
        if not self._may_digest(t):
            return False
        mine = digest(ctl, parts.driver)
        self.digesting += time.perf_counter() - t
        if mine != found:
            return False
        self.conn.send(("met", self.mode, self.seg, p))
        return True

    def _may_digest(self, now: float) -> bool:
        """Whether digests have cost at most :data:`DIGEST_SHARE` of this segment's
        time so far (the first :data:`DIGEST_FREE` seconds of them are free)."""
        return self.digesting <= max(DIGEST_SHARE * (now - self.began), DIGEST_FREE)

    def _poll(self, pos: int, block: bool) -> None:
        """Handle what the coordinator sent (waiting for one message if ``block``)."""
        while block or self.conn.poll():
            block = False
            msg = self.conn.recv()
            if msg[0] == "quit":
                raise _Quit
            if msg[1:3] != (self.mode, self.seg):
                continue  # for a segment this worker ran before
            kind = msg[0]
            if kind == "split":
                self._split(pos, msg[3])
            elif kind == "digest":
                self.theirs[msg[3]] = msg[4]
            elif kind == "met":
                self.publish.clear()
            elif kind == "stop":
                raise _Dropped

    def _split(self, pos: int, cut: int) -> None:
        probes = probes_after(self.workload, cut, self.offsets)
        # Not while this segment still owes its digests to the one it relieves: met
        # by a successor first, it would stop before its last probe, and the other
        # would wait for that probe's digest for ever.
        if self.meet or self.publish or not probes or cut <= pos:
            self.conn.send(("split-no", self.mode, self.seg, cut))
            return
        self.meet = list(probes)
        self.theirs = {}
        self.conn.send(("split-ok", self.mode, self.seg, cut))


def _worker(
    conn: Connection,
    workload: Workload,
    options: SimOptions,
    job_rows: bool,
    tuning: tuple[int, tuple[int, ...]],
) -> None:
    # Ctrl-C is the coordinator's to handle (it tells the workers to quit); terminated
    # by it (it waited long enough), a worker ends quietly, through the segment's
    # clean-up (its temporary directory).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _end_quietly)
    with contextlib.suppress(_Quit):
        while True:
            try:
                msg = conn.recv()
            except EOFError:
                return
            if msg[0] == "quit":
                return
            if msg[0] != "run":
                continue  # late news for a segment that is over
            _, mode, seg, first, publish = msg
            try:
                stepper = _Stepper(conn, workload, mode, seg, first, list(publish), *tuning)
                done = _run_segment(workload, options, job_rows, stepper)
            except _Dropped:
                conn.send(("dropped", mode, seg))
            except Exception as exc:
                text = f"{type(exc).__name__}: {exc}"
                conn.send(("error", mode, seg, text, traceback.format_exc()))
            else:
                conn.send(("done", mode, seg, *done))


def _end_quietly(signum: int, frame: object) -> None:
    raise _Quit


def _run_segment(
    workload: Workload, options: SimOptions, job_rows: bool, stepper: _Stepper
) -> tuple[int | None, Gathered | None, dict[int, Mark], JobRows | None, RunResult | None]:
    """Run one segment: where it stopped, and either what it gathered (to be joined)
    or, for a run made whole by this segment alone, its result (made here, in parallel
    with the other runs, rather than by the coordinator once all are over)."""
    mode, seg, first = stepper.mode, stepper.seg, stepper.first
    rows = None
    if job_rows:
        rows = JobRows(mode, {j.id for j in workload.jobs if j.malleable and mode == "elastic"})
    with tempfile.TemporaryDirectory(prefix=f"xce-simulate-{mode}-{seg}-") as tmp:
        gathered = gather_run(
            workload,
            options,
            mode,
            Path(tmp),
            observers=[rows] if rows is not None else (),
            first=first,
            stepper=stepper,
        )
    if first == 0 and gathered.stopped is None:
        return None, None, {}, rows, result_of(gathered)
    return gathered.stopped, gathered, stepper.marks, rows, None


# -- the coordinator ----------------------------------------------------------------


@attrs.define(eq=False)
class _Segment:
    mode: Mode
    seg: int
    first: int
    worker: int
    pos: int
    successor: int | None = None
    state: str = "running"  # running, done, dropped
    #: Once done: where it stopped (None: at the end), and what it gathered or made.
    stopped: int | None = None
    gathered: Gathered | None = None
    marks: dict[int, Mark] = attrs.Factory(dict)
    rows: JobRows | None = None
    result: RunResult | None = None


@attrs.define(eq=False)
class _Coordinator:
    workload: Workload
    conns: list[Connection]
    splitting: bool
    progress: ProgressFn | None
    min_split: int = MIN_SPLIT
    offsets: tuple[int, ...] = PROBE_OFFSETS
    meeting: int = MEETING
    segments: dict[tuple[Mode, int], _Segment] = attrs.Factory(dict)
    idle: list[int] = attrs.Factory(list)
    #: A split asked for and not yet answered: (run, segment, cut, worker reserved).
    asked: tuple[Mode, int, int, int] | None = None
    errors: list[str] = attrs.Factory(list)
    #: The progress last shown, per run.
    shown: dict[str, int] = attrs.Factory(dict)
    #: What happened, in order, each with the ``time.monotonic()`` it was heard:
    #: ("split-ok", run, segment, cut), ("met", run, segment, probe), ("no-meet", run,
    #: segment), ("done", run, segment, the job where it stopped or None).
    history: list[tuple[Any, ...]] = attrs.Factory(list)

    def start(self) -> None:
        for i, _conn in enumerate(self.conns):
            if i < len(MODES):
                self._assign(MODES[i], 0, 0, (), i)
            else:
                self.idle.append(i)

    def _assign(self, mode: Mode, seg: int, first: int, publish: tuple[int, ...], w: int) -> None:
        self.segments[mode, seg] = _Segment(mode, seg, first, w, first)
        self.conns[w].send(("run", mode, seg, first, publish))

    def complete(self) -> bool:
        return not self.errors and all(self._chain(mode) is not None for mode in MODES)

    def _chain(self, mode: Mode) -> list[_Segment] | None:
        """The run's segments from the first, if all of them are done."""
        chain: list[_Segment] = []
        s: _Segment | None = self.segments.get((mode, 0))
        while s is not None and s.state == "done":
            chain.append(s)
            if s.stopped is None:
                return chain
            s = self.segments.get((mode, s.successor)) if s.successor is not None else None
        return None

    def handle(self, w: int, msg: tuple[Any, ...]) -> None:
        kind, mode, seg = msg[0], msg[1], msg[2]
        s = self.segments.get((mode, seg))
        if s is None:
            return
        handler: Callable[[_Segment, int, tuple[Any, ...]], None] = getattr(
            self, "_on_" + kind.replace("-", "_")
        )
        if kind in ("met", "no-meet", "split-ok", "done"):
            self.history.append((*msg[:4], time.monotonic()))
        handler(s, w, msg)

    def _on_progress(self, s: _Segment, w: int, msg: tuple[Any, ...]) -> None:
        s.pos = msg[3]
        if self.progress is not None:
            # Never backwards (a dropped successor's jobs are the old segment's to do).
            done = max(self.shown.get(s.mode, 0), self._covered(s.mode))
            self.shown[s.mode] = done
            self.progress(s.mode, done, len(self.workload.jobs))

    def _covered(self, mode: Mode) -> int:
        """Jobs submitted in the run so far along its chain of segments, each counted
        once: a segment's up to where its successor started, the last one's all."""
        n = len(self.workload.jobs)
        done = 0
        s = self.segments.get((mode, 0))
        while s is not None:
            after = self.segments.get((mode, s.successor)) if s.successor is not None else None
            upto = s.pos if after is None else min(s.pos, after.first)
            done += max(0, upto - s.first)
            s = after
        return min(n - 1, done)

    def _on_digest(self, s: _Segment, w: int, msg: tuple[Any, ...]) -> None:
        before = self._predecessor(s)
        if before is not None and before.state == "running":
            self.conns[before.worker].send(("digest", s.mode, before.seg, msg[3], msg[4]))

    def _publishing(self, s: _Segment) -> bool:
        """Whether ``s`` may still owe digests to a predecessor still running (it takes
        no successor then; see _Stepper._split)."""
        before = self._predecessor(s)
        return before is not None and before.state == "running" and before.successor == s.seg

    def _predecessor(self, s: _Segment) -> _Segment | None:
        return next(
            (p for p in self.segments.values() if p.mode == s.mode and p.successor == s.seg),
            None,
        )

    def _on_met(self, s: _Segment, w: int, msg: tuple[Any, ...]) -> None:
        after = self.segments[s.mode, s.successor] if s.successor is not None else None
        if after is not None and after.state == "running":
            self.conns[after.worker].send(("met", s.mode, after.seg, msg[3]))

    def _on_no_meet(self, s: _Segment, w: int, msg: tuple[Any, ...]) -> None:
        self._drop_after(s)

    def _drop_after(self, s: _Segment) -> None:
        """Drop ``s``'s successor and theirs: ``s`` goes on alone."""
        nxt = s.successor
        s.successor = None
        while nxt is not None:
            after = self.segments[s.mode, nxt]
            if after.state == "running":
                self.conns[after.worker].send(("stop", s.mode, after.seg))
            after.state = "dropped"
            nxt, after.successor = after.successor, None

    def _on_split_ok(self, s: _Segment, w: int, msg: tuple[Any, ...]) -> None:
        assert self.asked is not None
        _, _, cut, worker = self.asked
        self.asked = None
        new = 1 + max(k[1] for k in self.segments if k[0] == s.mode)
        s.successor = new
        self._assign(s.mode, new, cut, probes_after(self.workload, cut, self.offsets), worker)

    def _on_split_no(self, s: _Segment, w: int, msg: tuple[Any, ...]) -> None:
        assert self.asked is not None
        self.idle.append(self.asked[3])
        self.asked = None

    def _on_done(self, s: _Segment, w: int, msg: tuple[Any, ...]) -> None:
        if s.state == "running":
            s.state = "done"
            s.stopped, s.gathered, s.marks, s.rows, s.result = msg[3:8]
            s.pos = len(self.workload.jobs) if s.stopped is None else s.stopped
            if s.stopped is None:
                self._drop_after(s)  # ran to the end: any successor is not needed
        self._release(s, w)

    def _on_dropped(self, s: _Segment, w: int, msg: tuple[Any, ...]) -> None:
        self._release(s, w)

    def _on_error(self, s: _Segment, w: int, msg: tuple[Any, ...]) -> None:
        self.errors.append(f"{s.mode} run: {msg[3]}\n{msg[4]}")
        self._release(s, w)

    def _release(self, s: _Segment, w: int) -> None:
        if self.asked is not None and self.asked[:2] == (s.mode, s.seg):
            self.idle.append(self.asked[3])
            self.asked = None
        self.idle.append(w)

    def split_if_idle(self) -> None:
        """Give an idle worker the end of the run with the most jobs left."""
        if not self.splitting or not self.idle or self.asked is not None:
            return
        n = len(self.workload.jobs)
        running = [
            s
            for s in self.segments.values()
            if s.state == "running" and s.successor is None and not self._publishing(s)
        ]
        if not running:
            return
        s = max(running, key=lambda r: n - r.pos)
        left = n - s.pos
        if left < self.min_split:
            return
        # The old segment also runs on past the cut until the two meet: the cut is
        # that much earlier than half way, so that both end together.
        cut = instant_start(self.workload, s.pos + max(left - self.meeting, 0) // 2)
        if not s.pos < cut < n:
            return
        worker = self.idle.pop()
        self.asked = (s.mode, s.seg, cut, worker)
        self.conns[s.worker].send(("split", s.mode, s.seg, cut))

    def results(self, seconds: float) -> dict[str, tuple[RunResult, JobRows | None]]:
        out: dict[str, tuple[RunResult, JobRows | None]] = {}
        for mode in MODES:
            chain = self._chain(mode)
            assert chain is not None
            head = chain[0]
            if head.result is not None:
                out[mode] = (head.result, head.rows)
                continue
            assert head.gathered is not None
            g, rows = head.gathered, head.rows
            for s in chain[1:]:
                assert s.gathered is not None and g.stopped is not None
                g = joined(g, s.gathered, s.marks, g.stopped, (rows, s.rows))
            if len(chain) > 1:
                # A split run took, in wall time, as long as the simulation.
                g = attrs.evolve(g, seconds=seconds)
            out[mode] = (result_of(g), rows)
        return out


def run_both(
    workload: Workload,
    options: SimOptions,
    progress: ProgressFn | None,
    job_rows: bool,
    workers: int | None = None,
    *,
    min_split: int = MIN_SPLIT,
    chunk: int = CHUNK,
    offsets: tuple[int, ...] = PROBE_OFFSETS,
    meeting: int = MEETING,
    history: list[tuple[Any, ...]] | None = None,
) -> dict[str, RunResult]:
    """Both runs on ``workers`` processes (default: :func:`default_workers`), split
    in time where :func:`can_split` allows (``min_split``, ``chunk``, ``offsets`` and
    ``meeting``: :data:`MIN_SPLIT`, :data:`CHUNK`, :data:`.PROBE_OFFSETS`,
    :data:`MEETING`; tests make them small).
    ``history``, if given, receives what the coordinator did."""
    splitting = can_split(workload, options, job_rows)
    if workers is None:
        # Without splits, a worker per run is all there is to do.
        workers = default_workers() if splitting else len(MODES)
    if workers < len(MODES):
        raise ValueError(f"run_both needs a worker per run at least, not {workers}")
    began = time.perf_counter()
    ctx = multiprocessing.get_context("fork")
    conns: list[Connection] = []
    procs = []
    # What exists now (the workload above all) is frozen for the forks, as the gc
    # module's documentation advises: a child's collections never walk it again, nor
    # write to its pages (which the child would then copy).
    gc.freeze()
    try:
        for i in range(workers):
            mine, theirs = ctx.Pipe(duplex=True)
            proc = ctx.Process(
                target=_worker,
                args=(theirs, workload, options, job_rows, (chunk, offsets)),
                name=f"simulate-{i}",
            )
            proc.start()
            theirs.close()
            conns.append(mine)
            procs.append(proc)
    finally:
        gc.unfreeze()
    coordinator = _Coordinator(workload, conns, splitting, progress, min_split, offsets, meeting)
    try:
        coordinator.start()
        _coordinate(coordinator)
    finally:
        _shut_down(conns, procs)
    if coordinator.errors:
        raise SimulationError("; ".join(coordinator.errors))
    if history is not None:
        history.extend(coordinator.history)
    done = coordinator.results(time.perf_counter() - began)
    results: dict[str, RunResult] = {}
    for mode, (result, rows) in done.items():
        if progress is not None:
            progress(mode, len(workload.jobs), len(workload.jobs))
        results[mode] = attrs.evolve(result, jobs=rows.sorted_rows()) if rows else result
    return results


#: Seconds the workers have to end once told to, before they are terminated.
QUIT_GRACE = 10.0


def _shut_down(conns: list[Connection], procs: list[Any]) -> None:
    """Tell every worker to quit and wait for it, reading (and dropping) what it still
    sends meanwhile: a worker blocked writing a large result into a full pipe would
    otherwise never read ``quit``. One still alive after :data:`QUIT_GRACE` seconds is
    terminated (by its process, which this function started)."""
    for conn in conns:
        with contextlib.suppress(OSError):
            conn.send(("quit",))
    deadline = time.monotonic() + QUIT_GRACE
    open_conns = list(conns)
    while any(p.is_alive() for p in procs) and time.monotonic() < deadline:
        for ready in wait(open_conns, timeout=0.1):
            assert isinstance(ready, Connection)
            try:
                ready.recv()
            except Exception:  # ended, or sent something unreadable: done with it
                open_conns.remove(ready)
    for proc in procs:
        if proc.is_alive():
            proc.terminate()
        proc.join()
    for conn in conns:
        conn.close()


def _coordinate(c: _Coordinator) -> None:
    index = {id(conn): i for i, conn in enumerate(c.conns)}
    live = list(c.conns)
    while live and not c.complete() and not c.errors:
        c.split_if_idle()
        for conn in wait(live):
            assert isinstance(conn, Connection)
            try:
                msg = conn.recv()
            except EOFError:
                live.remove(conn)
                c.errors.append(f"worker {index[id(conn)]} ended without a result")
                continue
            c.handle(index[id(conn)], msg)
    if not c.complete() and not c.errors:
        c.errors.append("the workers ended before both runs did")
