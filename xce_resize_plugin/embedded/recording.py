"""Recordings of a controller's inputs, and their replay in simulated time.

A *recording* is everything that came into a controller from outside, with times —
job submissions, resize requests (with their outcome), task process events,
notification outcomes and job ends — plus, for comparison, what came out: the job
starts and the plugin's journal facts. :func:`replay` feeds the inputs to a new
embedded controller in simulated time and checks that the same starts and the same
sequence of resize facts (placements, commits, releases...) come out.

``xce-resize simulate TRACE --record OUT`` writes one of its elastic run;
``xce-resize simulate --replay OUT`` replays it. The live controller writes the same
format (docs/simulation.md, "Recordings").

Format: JSON lines, UTF-8, one object per line
===============================================

The first line is the header::

    {"kind": "header", "format": "xce-resize-recording", "version": 1,
     "controller": "simulated" | "live", "hosts": [["n001", 1], ...],
     "config": {...the [resize] section...}, "user_slots": {...},
     "protect_reservation": true, "lean_cycles": true}

Every input line has ``kind``, ``t`` (the controller clock, seconds) and ``phase``:

- ``"timeline"``: it happened while the controller processed the instant ``t``, before
  the instant's scheduler and dispatch cycles (a job arriving, a job's run time
  elapsing, a task exiting after its stop delay);
- ``"settled"``: it arrived once the instant had settled (a driver's or a user's
  request; everything a live controller receives between its cycles);
- ``"sync"``: the runner answered inside the controller's own call (a simulated task
  starts inside ``launch_tasks``; a scripted notification answers inside
  ``run_notification``). Replay answers the same call the same way.

A simulated controller also writes ``i`` (the instant: how many instants its event loop
had processed) and, for ``settled`` lines, ``r`` (the round of the instant's observers);
replay then reproduces the instants exactly, including ``{"kind": "tick"}`` lines for
instants at which nothing was recorded. A live controller omits them: its lines are
grouped by ``t`` and each ``settled`` line is applied after the previous one settled.

Input kinds (fields besides ``kind``, ``t``, ``phase``, ``i``, ``r``):

- ``submit``: ``job``, ``user``, ``tasks`` ([min, max]), ``start_tasks``, ``estimate``,
  ``ptile``, ``resizable``, ``grow_hosts``, ``notify_cmd``, ``env``, and optionally
  ``work`` ({``model``: a speedup spec as ``--speedup`` takes it, ``ref_procs``,
  ``estimate``}: the scheduler plans the job with that model; its end still comes
  from an ``end`` line);
- ``request``: ``job``, ``principal`` ({``name``, ``admin``, ``job_id``}),
  ``request`` ({``type``: ``grow`` | ``release`` | ``cancel``, and the request's
  fields}), ``result`` (``"ok"`` or the error code);
- ``task``: ``job``, ``task`` (the task id), ``event`` (``started`` | ``start_failed`` |
  ``exited``), ``status``, ``reason``;
- ``notify``: ``job``, ``attempt``, ``status``, ``reason``;
- ``end``: ``job``, ``state`` (``DONE`` | ``EXIT``), ``reason``.

Output kinds, after the inputs or interleaved (replay compares them, in order):

- ``started``: ``t``, ``job``, ``hosts`` ({host: tasks} in allocation order);
- ``fact``: ``seq``, ``job``, ``fact`` (the journal's fact as JSON, as ``xce-resize
  journal export`` writes it).

Lines of an unknown ``kind`` are an error (a newer format), not skipped.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

import attrs
from attrs import frozen

from ..errors import ConfigError, ResizeError
from ..host import Principal
from ..journal import Journal
from ..manager import get_plugin_manager
from ..models import CancelRequest, GrowRequest, ReleaseRequest, ResizeRequest, Task, host_counts
from .controller import EmbeddedController
from .malleable import parse_speedup
from .observer import FinishedJob, Observer
from .runners import (
    NotificationDone,
    NotificationRequest,
    NotificationResult,
    NotificationRunner,
    TaskReporter,
    TaskRunner,
)
from .work import PlannedWork, SpeedupWork

__all__ = [
    "FORMAT",
    "VERSION",
    "RecordingError",
    "RecordingWriter",
    "ReplayResult",
    "SimRecorder",
    "read_recording",
    "replay",
]

FORMAT = "xce-resize-recording"
VERSION = 1
INPUT_KINDS = ("submit", "request", "task", "notify", "end", "tick")
OUTPUT_KINDS = ("started", "fact")


class RecordingError(ConfigError):
    """A recording cannot be read or replayed; the detail says where."""

    message = "Recording error"


# --------------------------------------------------------------------------- writing


def request_json(request: ResizeRequest) -> dict[str, Any]:
    """A resize request as a recording line holds it."""
    if isinstance(request, GrowRequest):
        return {"type": "grow", **attrs.asdict(request)}
    if isinstance(request, ReleaseRequest):
        data = attrs.asdict(request)
        if data["hosts"] is not None:
            data["hosts"] = dict(data["hosts"])
        if data["task_ids"] is not None:
            data["task_ids"] = list(data["task_ids"])
        return {"type": "release", **data}
    return {"type": "cancel"}


def request_from_json(data: Mapping[str, Any]) -> ResizeRequest:
    body = dict(data)
    kind = body.pop("type", None)
    if kind == "grow":
        return GrowRequest(**body)
    if kind == "release":
        if body.get("task_ids") is not None:
            body["task_ids"] = tuple(body["task_ids"])
        return ReleaseRequest(**body)
    if kind == "cancel" and not body:
        return CancelRequest()
    raise ValueError(f"bad request {dict(data)!r}")


class RecordingWriter:
    """Writes a recording, line by line (see the module docstring for the fields)."""

    def __init__(self, out: IO[str]) -> None:
        self._out = out

    def write(self, record: Mapping[str, Any]) -> None:
        self._out.write(json.dumps(record, separators=(",", ":"), ensure_ascii=False) + "\n")

    def header(
        self,
        *,
        controller: str,
        hosts: Sequence[tuple[str, int]],
        config: Mapping[str, Any],
        user_slots: Mapping[str, int],
        protect_reservation: bool,
        lean_cycles: bool,
    ) -> None:
        self.write(
            {
                "kind": "header",
                "format": FORMAT,
                "version": VERSION,
                "controller": controller,
                "hosts": [[h, n] for h, n in hosts],
                "config": {k: config[k] for k in sorted(config)},
                "user_slots": dict(sorted(user_slots.items())),
                "protect_reservation": protect_reservation,
                "lean_cycles": lean_cycles,
            }
        )

    def facts(self, journal_dir: Path) -> int:
        """Append every fact of the journal in ``journal_dir`` (closed) as output lines."""
        n = 0
        with Journal.open(journal_dir, readonly=True) as journal:
            for seq, job_id, payload in journal.facts():
                self.write({"kind": "fact", "seq": seq, "job": job_id, "fact": json.loads(payload)})
                n += 1
        return n


class _RecordingTaskRunner:
    """Wraps the controller's task runner: every report goes to the recording first,
    with the phase it happened in (inside the controller's call: ``sync``)."""

    def __init__(self, inner: TaskRunner, recorder: SimRecorder) -> None:
        self._inner = inner
        self._rec = recorder
        self._reporter: TaskReporter | None = None
        self._inside = 0

    # TaskRunner
    def bind(self, reporter: TaskReporter) -> None:
        self._reporter = reporter
        self._inner.bind(self)

    def start(self, job_id: str, task: Task, env: Mapping[str, str]) -> None:
        self._inside += 1
        try:
            self._inner.start(job_id, task, env)
        finally:
            self._inside -= 1

    def stop(self, job_id: str, task_id: int, grace: float, since: float) -> None:
        self._inside += 1
        try:
            self._inner.stop(job_id, task_id, grace, since)
        finally:
            self._inside -= 1

    # TaskReporter, for the inner runner
    @property
    def _to(self) -> TaskReporter:
        assert self._reporter is not None, "bind() first"
        return self._reporter

    def now(self) -> float:
        return self._to.now()

    def at(self, time: float, fn: Callable[[], None]) -> None:
        self._to.at(time, fn)

    def _record(
        self, job_id: str, task_id: int, event: str, status: int | None, reason: str
    ) -> None:
        self._rec.input(
            "task",
            "sync" if self._inside else None,
            job=job_id,
            task=task_id,
            event=event,
            status=status,
            reason=reason,
        )

    def task_started(self, job_id: str, task_id: int) -> None:
        self._record(job_id, task_id, "started", None, "")
        self._to.task_started(job_id, task_id)

    def task_start_failed(self, job_id: str, task_id: int, reason: str) -> None:
        self._record(job_id, task_id, "start_failed", None, reason)
        self._to.task_start_failed(job_id, task_id, reason)

    def task_exited(self, job_id: str, task_id: int, status: int | None, reason: str) -> None:
        self._record(job_id, task_id, "exited", status, reason)
        self._to.task_exited(job_id, task_id, status, reason)


class _RecordingNotifier:
    def __init__(self, inner: NotificationRunner, recorder: SimRecorder) -> None:
        self._inner = inner
        self._rec = recorder

    def run(self, request: NotificationRequest, done: NotificationDone) -> None:
        inside = [True]

        def answer(result: NotificationResult) -> None:
            self._rec.input(
                "notify",
                "sync" if inside[0] else None,
                job=request.job_id,
                attempt=request.attempt,
                status=result.status,
                reason=result.reason,
            )
            done(result)

        try:
            self._inner.run(request, answer)
        finally:
            inside[0] = False


class SimRecorder(Observer):
    """Records a simulated controller's inputs (and its starts) as it runs.

    Use: wrap the runners with :meth:`task_runner` and :meth:`notification_runner`
    before building the controller, then :meth:`attach` it (writes the header, starts
    observing), submit through :meth:`submit`, have drivers report their requests to
    :meth:`request`, and call :meth:`finish` with the journal's directory once the
    controller stopped (writes the facts).
    """

    def __init__(self, writer: RecordingWriter) -> None:
        self.writer = writer
        self._ctl: EmbeddedController | None = None
        self._settled_at = -1  # the last instant whose observers ran
        self._written_at = -1  # the last instant with a timeline line

    @property
    def ctl(self) -> EmbeddedController:
        assert self._ctl is not None, "attach() first"
        return self._ctl

    def task_runner(self, inner: TaskRunner) -> TaskRunner:
        return _RecordingTaskRunner(inner, self)

    def notification_runner(self, inner: NotificationRunner) -> NotificationRunner:
        return _RecordingNotifier(inner, self)

    def attach(
        self,
        ctl: EmbeddedController,
        hosts: Sequence[tuple[str, int]],
        user_slots: Mapping[str, int] | None = None,
    ) -> None:
        self._ctl = ctl
        self.writer.header(
            controller="simulated",
            hosts=hosts,
            config=ctl.config,
            user_slots=user_slots or {},
            protect_reservation=ctl.protect_reservation,
            lean_cycles=ctl.lean_cycles,
        )
        ctl.add_observer(self)

    def input(self, kind: str, phase: str | None, **fields: Any) -> None:
        """Write one input line at the controller's current instant."""
        ctl = self.ctl
        instant = ctl.instant
        if phase is None:
            phase = "settled" if self._settled_at == instant else "timeline"
        line: dict[str, Any] = {"kind": kind, "t": ctl.now(), "phase": phase, "i": instant}
        if phase == "settled":
            line["r"] = ctl.settle_round
        elif phase == "timeline":
            self._written_at = instant
        line.update(fields)
        self.writer.write(line)

    def submit(
        self,
        job_id: str,
        *,
        user: str,
        tasks: tuple[int, int],
        estimate: float | None,
        start_tasks: int | None = None,
        resizable: bool = False,
        work: SpeedupWork | None = None,
    ) -> None:
        """Record a submission about to be made (before ``ctl.submit``)."""
        self.input(
            "submit",
            None,
            job=job_id,
            user=user,
            tasks=list(tasks),
            start_tasks=start_tasks,
            estimate=estimate,
            ptile=None,
            resizable=resizable,
            grow_hosts="prefer-existing",
            notify_cmd=None,
            env={},
            work=None
            if work is None
            else {
                "model": work.model.spec(),
                "ref_procs": work.ref_procs,
                "estimate": work.estimate,
            },
        )

    def request(
        self, job_id: str, principal: Principal, request: ResizeRequest, code: str | None
    ) -> None:
        """Record a resize request that was just made and its outcome."""
        self.input(
            "request",
            None,
            job=job_id,
            principal={
                "name": principal.name,
                "admin": principal.admin,
                "job_id": principal.job_id,
            },
            request=request_json(request),
            result=code or "ok",
        )

    # observer
    def job_started(self, job_id: str, time: float, tasks: tuple[Task, ...]) -> None:
        self.writer.write(
            {
                "kind": "started",
                "t": time,
                "i": self.ctl.instant,
                "job": job_id,
                "hosts": host_counts(tasks),
            }
        )

    def job_ended(self, job: FinishedJob) -> None:
        self.input("end", None, job=job.id, state=job.state.value, reason=job.exit_reason)

    def settled(self, controller: EmbeddedController) -> None:
        instant = controller.instant
        if controller.settle_round == 0 and self._written_at != instant and instant > 0:
            # Nothing came in at this instant before it settled: keep the instant.
            self.writer.write(
                {"kind": "tick", "t": controller.now(), "phase": "timeline", "i": instant}
            )
            self._written_at = instant
        self._settled_at = instant

    def finish(self, journal_dir: Path) -> int:
        return self.writer.facts(journal_dir)


# --------------------------------------------------------------------------- reading


def read_recording(path: str | os.PathLike[str]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The header and the other lines of a recording (checked for kind and format)."""
    lines: list[dict[str, Any]] = []
    header: dict[str, Any] | None = None
    name = os.fspath(path)
    try:
        with open(path, encoding="utf-8") as fh:
            for n, raw in enumerate(fh, 1):
                if not raw.strip():
                    continue
                try:
                    rec = json.loads(raw)
                except ValueError as exc:
                    raise RecordingError(f"{name}:{n}: not JSON ({exc})") from None
                if not isinstance(rec, dict) or "kind" not in rec:
                    raise RecordingError(f"{name}:{n}: a line must be an object with a kind")
                if header is None:
                    if rec["kind"] != "header" or rec.get("format") != FORMAT:
                        raise RecordingError(f"{name}:{n}: not an {FORMAT} (no header line)")
                    if rec.get("version") != VERSION:
                        raise RecordingError(
                            f"{name}:{n}: version {rec.get('version')!r}, this reads {VERSION}"
                        )
                    header = rec
                    continue
                if rec["kind"] not in INPUT_KINDS + OUTPUT_KINDS:
                    raise RecordingError(f"{name}:{n}: unknown kind {rec['kind']!r}")
                rec["_line"] = n
                lines.append(rec)
    except OSError as exc:
        raise RecordingError(f"{name}: cannot read ({exc})") from exc
    if header is None:
        raise RecordingError(f"{name}: empty recording")
    return header, lines


@frozen
class ReplayResult:
    """What a replay found: counts and, if any, the first differences."""

    inputs: int
    starts: int
    facts: int
    problems: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not self.problems


class _Instant:
    __slots__ = ("rounds", "t", "timeline")

    def __init__(self, t: float) -> None:
        self.t = t
        self.timeline: list[dict[str, Any]] = []
        self.rounds: dict[int, list[dict[str, Any]]] = {}


class _ReplayRunner:
    """Answers the controller's task launches and stops from the recording."""

    def __init__(self, owner: _Replayer) -> None:
        self._owner = owner
        self._reporter: TaskReporter | None = None

    def bind(self, reporter: TaskReporter) -> None:
        self._reporter = reporter

    def start(self, job_id: str, task: Task, env: Mapping[str, str]) -> None:
        self._owner.sync_task(job_id, task.id, ("started", "start_failed"))

    def stop(self, job_id: str, task_id: int, grace: float, since: float) -> None:
        self._owner.sync_task(job_id, task_id, ("exited",))


class _ReplayNotifier:
    def __init__(self, owner: _Replayer) -> None:
        self._owner = owner

    def run(self, request: NotificationRequest, done: NotificationDone) -> None:
        self._owner.notification(request, done)


class _Replayer(Observer):
    def __init__(self, header: Mapping[str, Any], lines: Sequence[dict[str, Any]]) -> None:
        self.header = header
        self.problems: list[str] = []
        self.inputs = 0
        self.started: list[tuple[str, dict[str, int]]] = []
        self._sync_tasks: dict[tuple[str, int, str], dict[str, Any]] = {}
        self._sync_notes: dict[tuple[str, int], dict[str, Any]] = {}
        self._later_notes: dict[tuple[str, int], dict[str, Any]] = {}
        self._waiting_notes: dict[tuple[str, int], NotificationDone] = {}
        self.expected_starts: list[tuple[str, dict[str, int]]] = []
        self.expected_facts: list[tuple[str, Any]] = []
        self._instants: list[_Instant] = []
        self._by_index: dict[int, _Instant] = {}
        self.ctl: EmbeddedController | None = None
        self._next = 0
        self._current = _Instant(0.0)
        self._split(lines)

    def _split(self, lines: Sequence[dict[str, Any]]) -> None:
        exact = any("i" in rec for rec in lines if rec["kind"] in INPUT_KINDS)
        live_round = 0
        last_t: float | None = None
        for rec in lines:
            kind = rec["kind"]
            if kind == "started":
                self.expected_starts.append((rec["job"], dict(rec["hosts"])))
                continue
            if kind == "fact":
                self.expected_facts.append((rec["job"], rec["fact"]))
                continue
            phase = rec.get("phase", "settled")
            if phase == "sync":
                if kind == "task":
                    self._sync_tasks[(rec["job"], rec["task"], rec["event"])] = rec
                elif kind == "notify":
                    self._sync_notes[(rec["job"], rec["attempt"])] = rec
                else:
                    self._bad(rec, "only task and notify lines can be sync")
                continue
            if kind == "notify":
                self._later_notes[(rec["job"], rec["attempt"])] = rec
            t = float(rec["t"])
            if exact:
                index = int(rec["i"])
                inst = self._by_index.get(index)
                if inst is None:
                    inst = self._by_index[index] = _Instant(t)
            else:
                # A live recording: one instant per distinct time, every settled line
                # its own round.
                if last_t != t:
                    inst = _Instant(t)
                    self._instants.append(inst)
                    live_round = 0
                    last_t = t
                inst = self._instants[-1]
            if phase == "timeline":
                inst.timeline.append(rec)
            else:
                r = int(rec["r"]) if exact else live_round
                live_round += 1
                inst.rounds.setdefault(r, []).append(rec)
        if exact:
            self._instants = [self._by_index[i] for i in sorted(self._by_index)]

    def _bad(self, rec: Mapping[str, Any], why: str) -> None:
        if len(self.problems) < 20:
            self.problems.append(f"line {rec.get('_line', '?')}: {why}")

    # -- the timeline: one instant at a time, in order --------------------------------

    def start(self, ctl: EmbeddedController) -> None:
        self.ctl = ctl
        ctl.add_observer(self)
        # Instant 0 (exact recordings) is the settle at the start of run(): its lines
        # are applied by settled() without a timeline entry.
        if self._instants and self._instants[0] is self._by_index.get(0):
            self._current = self._instants[0]
            self._next = 1
        self._schedule_next()

    def _schedule_next(self) -> None:
        if self._next < len(self._instants):
            inst = self._instants[self._next]
            assert self.ctl is not None
            self.ctl.at(max(inst.t, self.ctl.now()), self._run_instant)

    def _run_instant(self) -> None:
        inst = self._instants[self._next]
        self._next += 1
        self._current = inst
        for rec in inst.timeline:
            self._apply(rec)
        self._schedule_next()

    def settled(self, controller: EmbeddedController) -> None:
        for rec in self._current.rounds.pop(controller.settle_round, []):
            self._apply(rec)

    # -- inputs -----------------------------------------------------------------------

    def _apply(self, rec: dict[str, Any]) -> None:
        ctl = self.ctl
        assert ctl is not None
        self.inputs += 1
        kind = rec["kind"]
        try:
            if kind == "tick":
                return
            if kind == "submit":
                self._submit(ctl, rec)
            elif kind == "request":
                self._request(ctl, rec)
            elif kind == "task":
                event = rec["event"]
                if event == "started":
                    ctl.task_started(rec["job"], rec["task"])
                elif event == "start_failed":
                    ctl.task_start_failed(rec["job"], rec["task"], rec.get("reason", ""))
                else:
                    ctl.task_exited(
                        rec["job"], rec["task"], rec.get("status"), rec.get("reason", "")
                    )
            elif kind == "notify":
                self._answer_later(rec)
            elif kind == "end":
                if rec["state"] == "DONE":
                    ctl.finish(rec["job"], rec.get("reason", "done"))
                else:
                    ctl.kill(rec["job"], rec.get("reason", "killed"))
        except (KeyError, TypeError, ValueError) as exc:
            self._bad(rec, f"cannot apply: {type(exc).__name__}: {exc}")

    def _submit(self, ctl: EmbeddedController, rec: Mapping[str, Any]) -> None:
        lo, hi = rec["tasks"]
        work = None
        if rec.get("work"):
            w = rec["work"]
            work = PlannedWork(parse_speedup(w["model"]), int(w["ref_procs"]), float(w["estimate"]))
        ctl.submit(
            rec["user"],
            (int(lo), int(hi)),
            estimate=rec.get("estimate"),
            ptile=rec.get("ptile"),
            resizable=bool(rec.get("resizable", False)),
            grow_hosts=rec.get("grow_hosts", "prefer-existing"),
            notify_cmd=rec.get("notify_cmd"),
            env=rec.get("env") or {},
            job_id=rec["job"],
            start_tasks=rec.get("start_tasks"),
            work=work,
        )

    def _request(self, ctl: EmbeddedController, rec: Mapping[str, Any]) -> None:
        p = rec["principal"]
        principal = Principal(p["name"], admin=bool(p.get("admin")), job_id=p.get("job_id"))
        request = request_from_json(rec["request"])
        try:
            ctl.request_resize(principal, rec["job"], request)
            got = "ok"
        except ResizeError as exc:
            got = exc.code
        if got != rec.get("result", "ok"):
            self._bad(
                rec, f"request on job {rec['job']} answered {got}, recorded {rec.get('result')}"
            )

    # -- runner answers ---------------------------------------------------------------

    def sync_task(self, job_id: str, task_id: int, events: Sequence[str]) -> None:
        ctl = self.ctl
        assert ctl is not None
        for event in events:
            rec = self._sync_tasks.pop((job_id, task_id, event), None)
            if rec is None:
                continue
            if event == "started":
                ctl.task_started(job_id, task_id)
            elif event == "start_failed":
                ctl.task_start_failed(job_id, task_id, rec.get("reason", ""))
            else:
                ctl.task_exited(job_id, task_id, rec.get("status"), rec.get("reason", ""))
            return
        # Not answered in the call: the recording has it later (or the replay diverged,
        # which the comparison of facts will show).

    def notification(self, request: NotificationRequest, done: NotificationDone) -> None:
        key = (request.job_id, request.attempt)
        rec = self._sync_notes.pop(key, None)
        if rec is not None:
            done(NotificationResult(rec.get("status"), rec.get("reason", "")))
            return
        if key not in self._later_notes:
            self.problems.append(
                f"job {request.job_id}: notification attempt {request.attempt} ran, "
                "the recording has no outcome for it"
            )
        self._waiting_notes[key] = done

    def _answer_later(self, rec: Mapping[str, Any]) -> None:
        key = (rec["job"], rec["attempt"])
        done = self._waiting_notes.pop(key, None)
        if done is None:
            self._bad(rec, f"job {rec['job']}: outcome of a notification that did not run")
            return
        done(NotificationResult(rec.get("status"), rec.get("reason", "")))

    # -- outputs ----------------------------------------------------------------------

    def job_started(self, job_id: str, time: float, tasks: tuple[Task, ...]) -> None:
        self.started.append((job_id, host_counts(tasks)))


def replay(path: str | os.PathLike[str], state_dir: Path | None = None) -> ReplayResult:
    """Replay a recording in simulated time; compare its starts and facts."""
    header, lines = read_recording(path)
    if state_dir is None:
        with tempfile.TemporaryDirectory(prefix="xce-replay-") as tmp:
            return replay(path, Path(tmp))
    rep = _Replayer(header, lines)
    config = dict(header.get("config") or {})
    try:
        pm = get_plugin_manager(config, base_dir=Path(path).parent, entry_points=False)
        ctl = EmbeddedController(
            pm,
            state_dir,
            hosts=[(str(h), int(n)) for h, n in header["hosts"]],
            config=config,
            user_slots=dict(header.get("user_slots") or {}),
            store="none",
            task_runner=_ReplayRunner(rep),
            notification_runner=_ReplayNotifier(rep),
            protect_reservation=bool(header.get("protect_reservation", False)),
            lean_cycles=bool(header.get("lean_cycles", False)),
            keep_finished=False,
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise RecordingError(f"{os.fspath(path)}: bad header ({exc})") from exc
    try:
        rep.start(ctl)
        ctl.run()
    finally:
        ctl.stop()
    got_facts = [(job, fact) for job, fact in _facts(state_dir / "resize")]
    problems = list(rep.problems)
    problems.extend(_compare("start", rep.expected_starts, rep.started))
    problems.extend(_compare("fact", rep.expected_facts, got_facts))
    return ReplayResult(rep.inputs, len(rep.started), len(got_facts), tuple(problems))


def _facts(journal_dir: Path) -> Iterator[tuple[str, Any]]:
    with Journal.open(journal_dir, readonly=True) as journal:
        for _seq, job_id, payload in journal.facts():
            yield job_id, json.loads(payload)


def _compare(what: str, expected: Sequence[Any], got: Sequence[Any]) -> list[str]:
    for n, (a, b) in enumerate(zip(expected, got, strict=False)):
        if a != b:
            return [f"{what} {n + 1} differs: recorded {a!r}, replayed {b!r}"]
    if len(expected) != len(got):
        return [f"{len(expected)} {what}(s) recorded, {len(got)} replayed"]
    return []
