"""Recordings of a controller's inputs, and their replay in simulated time.

A *recording* is everything that came into a controller from outside, with times —
job submissions, resize requests (with their outcome), task process events,
notification outcomes and job ends — plus, for comparison, what came out: the job
starts and the plugin's journal facts. :func:`replay` feeds the inputs to a new
embedded controller in simulated time and checks that the same starts and the same
sequence of resize facts (placements, commits, releases...) come out.

``xce-resize simulate TRACE --record OUT`` writes one of its elastic run; the live
controller writes one of its run with ``[controller] record = "OUT"`` or
``xce-resize controller --record OUT`` (:mod:`.live.recorder`); ``xce-resize simulate
--replay OUT`` replays either (docs/simulation.md, "Reproducing a run").

Format: JSON lines, UTF-8, one object per line
===============================================

The first line is the header::

    {"kind": "header", "format": "xce-resize-recording", "version": 1,
     "controller": "simulated" | "live", "hosts": [["n001", 1], ...],
     "config": {...the [resize] section...}, "user_slots": {...},
     "protect_reservation": true, "lean_cycles": true}

A live controller's header adds ``t`` (its clock when it started: the replay's clock
starts there), ``task_event_batches`` (how it delivers task events; default true) and,
for the reader, ``state_dir``.

Every input line has ``kind``, ``t`` (the controller clock, seconds) and ``phase``:

- ``"timeline"``: it happened while the controller processed the instant ``t``, before
  the instant's scheduler and dispatch cycles (a job arriving, a job's run time
  elapsing, a task exiting after its stop delay);
- ``"settled"``: it arrived once the instant had settled (a driver's or a user's
  request; everything a live controller receives between its cycles);
- ``"sync"``: the runner answered inside the controller's own call (a simulated task
  starts inside ``launch_tasks``; a scripted notification answers inside
  ``run_notification``; a live launch for a job that is ending fails at once). Replay
  answers the same call the same way.

A simulated controller also writes ``i`` (the instant: how many instants its event loop
had processed) and, for ``settled`` lines, ``r`` (the round of the instant's observers);
replay then reproduces the instants exactly, including ``{"kind": "tick"}`` lines for
instants at which nothing was recorded.

A live controller omits them: its lines are in the order in which the controller took
them (one at a time, under its lock), and ``{"kind": "cycle", "t": T}`` lines say where
it ran its scheduler and dispatch cycles (``settle``). It writes a ``cycle`` line for
every settle that had inputs before it or changed something; the others (the loop
settles every 0.1 s) changed nothing and need no replay. Replay applies the lines in
order, moving its clock forward to each line's ``t``, and settles at each ``cycle``.

Input kinds (fields besides ``kind``, ``t``, ``phase``, ``i``, ``r``):

- ``submit``: ``job``, ``user``, ``tasks`` ([min, max]), ``start_tasks``, ``estimate``,
  ``ptile``, ``resizable``, ``grow_hosts``, ``notify_cmd``, ``env``, optionally
  ``alloc`` ([[host, tasks], ...] in allocation order: the job started at once there)
  and ``work`` ({``model``: a speedup spec as ``--speedup`` takes it, ``ref_procs``,
  ``estimate``}: the scheduler plans the job with that model; its end still comes
  from an ``end`` line);
- ``request``: ``job``, ``principal`` ({``name``, ``admin``, ``job_id``}),
  ``request`` ({``type``: ``grow`` | ``release`` | ``cancel``, and the request's
  fields}), ``result`` (``"ok"`` or the error code);
- ``task``: ``job``, ``task`` (the task id), ``event`` (``started`` | ``start_failed`` |
  ``exited``), ``status``, ``reason``;
- ``notify``: ``job``, ``attempt``, ``status``, ``reason``;
- ``ending`` (live): ``job``, ``tasks`` (task ids), ``grace``, ``state``, ``reason``:
  the job is over (its task 0 ended, or it was killed) and the controller stops these
  live tasks first (replay: ``stop_tasks``); its ``end`` line follows once they are gone;
- ``end``: ``job``, ``state`` (``DONE`` | ``EXIT``), ``reason``.

Output kinds, after the inputs or interleaved (replay compares them):

- ``started``: ``t``, ``job``, ``hosts`` ({host: tasks} in allocation order);
- ``fact``: ``seq``, ``job``, ``fact`` (the journal's fact as JSON, as ``xce-resize
  journal export`` writes it). A simulated recording has them at the end; a live one
  as the journal gets them (after the cycle, request or job end that wrote them), so
  that a crash leaves the facts of what it recorded.

A live recording ends with ``{"kind": "closed", "t": T, "clean": true}`` when the
controller stopped cleanly; nothing may follow it.

What replay compares: for a simulated recording, the starts and the facts exactly and
in order (times included: the replay is instant for instant). For a live recording,
per job and in order: where it started ({host: tasks}), and its facts without their
times (``at`` and every ``*_at`` field: live time never repeats); a live recording
without its ``closed`` line (the controller crashed) is compared as a prefix (each
job's recorded facts must be the first ones the replay produced for it).

Lines of an unknown ``kind`` are an error (a newer format), not skipped; so are lines
missing a field replay needs, and kinds of the other controller's variant.
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
from .errors import EmbeddedError
from .malleable import parse_speedup
from .observer import FinishedJob, Observer
from .runners import (
    NotificationDone,
    NotificationRequest,
    NotificationResult,
    NotificationRunner,
    SimClock,
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
CONTROLLERS = ("simulated", "live")
INPUT_KINDS = ("submit", "request", "task", "notify", "end", "tick", "ending", "cycle")
OUTPUT_KINDS = ("started", "fact")
#: The kinds each variant may hold (a ``tick`` in a live recording is an error).
KINDS = {
    "simulated": frozenset(INPUT_KINDS + OUTPUT_KINDS) - {"ending", "cycle"},
    "live": frozenset(INPUT_KINDS + OUTPUT_KINDS + ("closed",)) - {"tick"},
}
PHASES = ("timeline", "settled", "sync")
TASK_EVENTS = ("started", "start_failed", "exited")
END_STATES = ("DONE", "EXIT")
#: At most this many differences are listed (the first ones per job).
MAX_PROBLEMS = 50


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
    """Writes a recording, line by line (see the module docstring for the fields).

    :param flush: flush after every line, so that a crash of the writing process
        leaves every line written so far in the file (the live controller's recorder).
    """

    def __init__(self, out: IO[str], *, flush: bool = False) -> None:
        self._out = out
        self._flush = flush

    def write(self, record: Mapping[str, Any]) -> None:
        self._out.write(json.dumps(record, separators=(",", ":"), ensure_ascii=False) + "\n")
        if self._flush:
            self._out.flush()

    def header(
        self,
        *,
        controller: str,
        hosts: Sequence[tuple[str, int]],
        config: Mapping[str, Any],
        user_slots: Mapping[str, int],
        protect_reservation: bool,
        lean_cycles: bool,
        extra: Mapping[str, Any] | None = None,
    ) -> None:
        """The first line; ``extra`` adds the live variant's fields (``t``...)."""
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
                **(extra or {}),
            }
        )

    def facts(self, journal_dir: Path, start: int = 1, journal: Journal | None = None) -> int:
        """Append the facts from sequence ``start`` on as output lines; return how many.

        Reads ``journal`` if given (an open handle), else opens the journal in
        ``journal_dir`` read-only for the call.
        """
        if journal is None:
            with Journal.open(journal_dir, readonly=True) as handle:
                return self.facts(journal_dir, start, handle)
        n = 0
        for seq, job_id, payload in journal.facts(start):
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
        self.input("request", None, **request_fields(job_id, principal, request, code))

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


def request_fields(
    job_id: str, principal: Principal, request: ResizeRequest, code: str | None
) -> dict[str, Any]:
    """The fields of a ``request`` line (both recorders write the same)."""
    return {
        "job": job_id,
        "principal": {"name": principal.name, "admin": principal.admin, "job_id": principal.job_id},
        "request": request_json(request),
        "result": code or "ok",
    }


# --------------------------------------------------------------------------- reading


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _str(value: Any) -> bool:
    return isinstance(value, str)


def _task_range(value: Any) -> bool:
    return isinstance(value, list) and len(value) == 2 and all(_int(v) for v in value)


def _principal(value: Any) -> bool:
    return isinstance(value, dict) and _str(value.get("name"))


def _request(value: Any) -> bool:
    return isinstance(value, dict) and value.get("type") in ("grow", "release", "cancel")


def _ids(value: Any) -> bool:
    return isinstance(value, list) and all(_int(v) for v in value)


def _hosts_map(value: Any) -> bool:
    return isinstance(value, dict) and all(_int(v) for v in value.values())


def _fact(value: Any) -> bool:
    return isinstance(value, dict) and _str(value.get("type"))


def _one_of(*allowed: str) -> Callable[[Any], bool]:
    def check(value: Any) -> bool:
        return value in allowed

    return check


#: What replay reads of each kind: field -> (check, what it must be). ``t`` is checked
#: for every kind but ``header``, ``fact`` and ``closed`` (``closed`` has its own).
_FIELDS: dict[str, dict[str, tuple[Callable[[Any], bool], str]]] = {
    "submit": {
        "job": (_str, "a job id (string)"),
        "user": (_str, "a user name (string)"),
        "tasks": (_task_range, "[min, max] (integers)"),
    },
    "request": {
        "job": (_str, "a job id (string)"),
        "principal": (_principal, "an object with a name"),
        "request": (_request, "an object whose type is grow, release or cancel"),
    },
    "task": {
        "job": (_str, "a job id (string)"),
        "task": (_int, "a task id (integer)"),
        "event": (_one_of(*TASK_EVENTS), " | ".join(TASK_EVENTS)),
    },
    "notify": {"job": (_str, "a job id (string)"), "attempt": (_int, "an integer")},
    "end": {
        "job": (_str, "a job id (string)"),
        "state": (_one_of(*END_STATES), " | ".join(END_STATES)),
    },
    "ending": {
        "job": (_str, "a job id (string)"),
        "tasks": (_ids, "a list of task ids (integers)"),
        "grace": (_number, "seconds (a number)"),
    },
    "tick": {},
    "cycle": {},
    "started": {"job": (_str, "a job id (string)"), "hosts": (_hosts_map, "{host: tasks}")},
    "fact": {
        "seq": (_int, "an integer"),
        "job": (_str, "a job id (string)"),
        "fact": (_fact, "an object with a type"),
    },
    "closed": {"clean": (lambda v: isinstance(v, bool), "true or false")},
}


def check_line(rec: Mapping[str, Any], controller: str) -> str | None:
    """What is wrong with one (non-header) line of a ``controller`` recording, if
    anything: the message names the field and what it must be."""
    kind = rec.get("kind")
    if kind not in INPUT_KINDS + OUTPUT_KINDS + ("closed",):
        return f"unknown kind {kind!r}"
    if kind not in KINDS[controller]:
        return f"kind {kind!r} is not part of a {controller} recording"
    if kind not in ("fact",) and not _number(rec.get("t")):
        return f"{kind}: t must be the controller's clock (a number), got {rec.get('t')!r}"
    phase = rec.get("phase")
    if phase is not None and phase not in PHASES:
        return f"{kind}: phase must be one of {', '.join(PHASES)}, got {phase!r}"
    if phase == "sync" and kind not in ("task", "notify"):
        return f"{kind}: only task and notify lines can be sync"
    for name, (ok, what) in _FIELDS[kind].items():
        if name not in rec:
            return f"{kind}: missing field {name!r}"
        if not ok(rec[name]):
            return f"{kind}: {name} must be {what}, got {rec[name]!r}"
    return None


def read_recording(path: str | os.PathLike[str]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The header and the other lines of a recording, each checked (:func:`check_line`)
    for what replay reads; :class:`RecordingError` names the file, line and field."""
    lines: list[dict[str, Any]] = []
    header: dict[str, Any] | None = None
    closed_at: int | None = None
    name = os.fspath(path)
    try:
        with open(path, encoding="utf-8") as fh:
            for n, raw in enumerate(fh, 1):
                if not raw.strip():
                    continue
                try:
                    rec = json.loads(raw)
                except ValueError as exc:
                    if not raw.endswith("\n"):
                        raise RecordingError(
                            f"{name}:{n}: the last line is cut short (the writer stopped in "
                            "the middle of it); remove it to replay the lines before"
                        ) from None
                    raise RecordingError(f"{name}:{n}: not JSON ({exc})") from None
                if not isinstance(rec, dict) or "kind" not in rec:
                    raise RecordingError(f"{name}:{n}: a line must be an object with a kind")
                if header is None:
                    header = _check_header(rec, name, n)
                    continue
                if closed_at is not None:
                    raise RecordingError(
                        f"{name}:{n}: a line after the closing line (line {closed_at})"
                    )
                problem = check_line(rec, header["controller"])
                if problem is not None:
                    raise RecordingError(f"{name}:{n}: {problem}")
                if rec["kind"] == "closed":
                    closed_at = n
                rec["_line"] = n
                lines.append(rec)
    except OSError as exc:
        raise RecordingError(f"{name}: cannot read ({exc})") from exc
    except UnicodeDecodeError as exc:
        raise RecordingError(f"{name}: not UTF-8 text ({exc})") from None
    if header is None:
        raise RecordingError(f"{name}: empty recording")
    return header, lines


def _check_header(rec: dict[str, Any], name: str, n: int) -> dict[str, Any]:
    if rec["kind"] != "header" or rec.get("format") != FORMAT:
        raise RecordingError(f"{name}:{n}: not an {FORMAT} (no header line)")
    if rec.get("version") != VERSION:
        raise RecordingError(f"{name}:{n}: version {rec.get('version')!r}, this reads {VERSION}")
    controller = rec.get("controller", "simulated")
    if controller not in CONTROLLERS:
        raise RecordingError(
            f"{name}:{n}: header: controller must be simulated or live, got {controller!r}"
        )
    rec["controller"] = controller
    hosts = rec.get("hosts")
    if not isinstance(hosts, list) or not all(
        isinstance(h, list) and len(h) == 2 and _str(h[0]) and _int(h[1]) for h in hosts
    ):
        raise RecordingError(f"{name}:{n}: header: hosts must be [[name, slots], ...]")
    if "t" in rec and not _number(rec["t"]):
        raise RecordingError(f"{name}:{n}: header: t must be a number, got {rec['t']!r}")
    return rec


@frozen
class ReplayResult:
    """What a replay found: counts and, if any, the differences.

    ``controller`` is the recording's variant: it decides what was compared (module
    docstring, "What replay compares").
    """

    inputs: int
    starts: int
    facts: int
    problems: tuple[str, ...]
    controller: str = "simulated"

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

    def __init__(self, owner: _Inputs) -> None:
        self._owner = owner
        self._reporter: TaskReporter | None = None

    def bind(self, reporter: TaskReporter) -> None:
        self._reporter = reporter

    def start(self, job_id: str, task: Task, env: Mapping[str, str]) -> None:
        self._owner.sync_task(job_id, task.id, ("started", "start_failed"))

    def stop(self, job_id: str, task_id: int, grace: float, since: float) -> None:
        self._owner.sync_task(job_id, task_id, ("exited",))


class _ReplayNotifier:
    def __init__(self, owner: _Inputs) -> None:
        self._owner = owner

    def run(self, request: NotificationRequest, done: NotificationDone) -> None:
        self._owner.notification(request, done)


class _Inputs(Observer):
    """What both replays share: applying input lines, answering the runners from the
    recording, and collecting the replay's job starts."""

    #: Whether a notification the recording has no outcome for is a problem (a
    #: simulated run answers every one; a live run may stop while one runs).
    outcomes_required = True

    def __init__(self, header: Mapping[str, Any]) -> None:
        self.header = header
        self.problems: list[str] = []
        self.inputs = 0
        self.started: list[tuple[str, dict[str, int]]] = []
        self.expected_starts: list[tuple[str, dict[str, int]]] = []
        self.expected_facts: list[tuple[str, Any]] = []
        self._sync_tasks: dict[tuple[str, int, str], dict[str, Any]] = {}
        self._sync_notes: dict[tuple[str, int], dict[str, Any]] = {}
        self._later_notes: dict[tuple[str, int], dict[str, Any]] = {}
        self._waiting_notes: dict[tuple[str, int], NotificationDone] = {}
        self.ctl: EmbeddedController | None = None

    def _take(self, rec: dict[str, Any]) -> bool:
        """Keep an output or sync line where replay looks for it; ``False`` for the
        lines that are applied in turn."""
        kind = rec["kind"]
        if kind == "started":
            self.expected_starts.append((rec["job"], dict(rec["hosts"])))
            return True
        if kind == "fact":
            self.expected_facts.append((rec["job"], rec["fact"]))
            return True
        if rec.get("phase") == "sync":
            if kind == "task":
                self._sync_tasks[(rec["job"], rec["task"], rec["event"])] = rec
            else:
                self._sync_notes[(rec["job"], rec["attempt"])] = rec
            return True
        if kind == "notify":
            self._later_notes[(rec["job"], rec["attempt"])] = rec
        return False

    def _bad(self, rec: Mapping[str, Any], why: str) -> None:
        if len(self.problems) < 20:
            self.problems.append(f"line {rec.get('_line', '?')}: {why}")

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
            elif kind == "ending":
                if rec["tasks"]:
                    ctl.stop_tasks(rec["job"], list(rec["tasks"]), float(rec["grace"]))
            elif kind == "end":
                if rec["state"] == "DONE":
                    ctl.finish(rec["job"], rec.get("reason", "done"))
                else:
                    ctl.kill(rec["job"], rec.get("reason", "killed"))
        except (KeyError, TypeError, ValueError, EmbeddedError) as exc:
            self._bad(rec, f"cannot apply: {type(exc).__name__}: {exc}")

    def _submit(self, ctl: EmbeddedController, rec: Mapping[str, Any]) -> None:
        lo, hi = rec["tasks"]
        work = None
        if rec.get("work"):
            w = rec["work"]
            work = PlannedWork(parse_speedup(w["model"]), int(w["ref_procs"]), float(w["estimate"]))
        alloc = rec.get("alloc")
        ctl.submit(
            rec["user"],
            (int(lo), int(hi)),
            estimate=rec.get("estimate"),
            ptile=rec.get("ptile"),
            resizable=bool(rec.get("resizable", False)),
            grow_hosts=rec.get("grow_hosts", "prefer-existing"),
            notify_cmd=rec.get("notify_cmd"),
            env=rec.get("env") or {},
            alloc=None if alloc is None else [(str(h), int(n)) for h, n in alloc],
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
        if key not in self._later_notes and self.outcomes_required:
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


class _Replayer(_Inputs):
    """Replays a simulated recording instant for instant."""

    def __init__(self, header: Mapping[str, Any], lines: Sequence[dict[str, Any]]) -> None:
        super().__init__(header)
        self._instants: list[_Instant] = []
        self._by_index: dict[int, _Instant] = {}
        self._next = 0
        self._current = _Instant(0.0)
        self._split(lines)

    def _split(self, lines: Sequence[dict[str, Any]]) -> None:
        exact = any("i" in rec for rec in lines if rec["kind"] in INPUT_KINDS)
        live_round = 0
        last_t: float | None = None
        for rec in lines:
            if self._take(rec):
                continue
            phase = rec.get("phase", "settled")
            t = float(rec["t"])
            if exact:
                index = int(rec["i"])
                inst = self._by_index.get(index)
                if inst is None:
                    inst = self._by_index[index] = _Instant(t)
            else:
                # No instants recorded: one instant per distinct time, every settled
                # line its own round.
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


class _LiveReplayer(_Inputs):
    """Replays a live recording: its lines in order on a clock moved to each line's
    time, a settle at each ``cycle`` line (module docstring)."""

    outcomes_required = False

    def __init__(self, header: Mapping[str, Any], lines: Sequence[dict[str, Any]]) -> None:
        super().__init__(header)
        self.sequence: list[dict[str, Any]] = []
        self.closed: dict[str, Any] | None = None
        for rec in lines:
            if rec["kind"] == "closed":
                self.closed = rec
            elif not self._take(rec):
                self.sequence.append(rec)

    def run(self, ctl: EmbeddedController, clock: SimClock) -> None:
        self.ctl = ctl
        ctl.add_observer(self)
        for rec in self.sequence:
            t = float(rec["t"])
            if t > clock.now():
                clock.advance_to(t)
            if rec["kind"] != "cycle":
                self._apply(rec)
                continue
            self.inputs += 1
            try:
                ctl.settle()
            except EmbeddedError as exc:
                # The replay went somewhere the run did not: what follows would only
                # repeat the consequences.
                self._bad(rec, f"the controller's cycle failed: {type(exc).__name__}: {exc}")
                return


def replay(path: str | os.PathLike[str], state_dir: Path | None = None) -> ReplayResult:
    """Replay a recording in simulated time; compare its starts and facts."""
    header, lines = read_recording(path)
    if state_dir is None:
        with tempfile.TemporaryDirectory(prefix="xce-replay-") as tmp:
            return replay(path, Path(tmp))
    if header["controller"] == "live":
        return _replay_live(path, header, lines, state_dir)
    rep = _Replayer(header, lines)
    ctl = _controller(path, header, state_dir, rep)
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


def _controller(
    path: str | os.PathLike[str],
    header: Mapping[str, Any],
    state_dir: Path,
    rep: _Inputs,
    clock: SimClock | None = None,
) -> EmbeddedController:
    """The replay's controller, as the header describes the recorded one."""
    config = dict(header.get("config") or {})
    try:
        pm = get_plugin_manager(config, base_dir=Path(path).parent, entry_points=False)
        return EmbeddedController(
            pm,
            state_dir,
            hosts=[(str(h), int(n)) for h, n in header["hosts"]],
            config=config,
            user_slots=dict(header.get("user_slots") or {}),
            store="none",
            clock=clock,
            task_runner=_ReplayRunner(rep),
            notification_runner=_ReplayNotifier(rep),
            protect_reservation=bool(header.get("protect_reservation", False)),
            lean_cycles=bool(header.get("lean_cycles", False)),
            task_event_batches=bool(header.get("task_event_batches", True)),
            # A trace replay drops finished jobs to save memory; a live controller keeps
            # them, and a request about a finished job must get the same answer.
            keep_finished=header["controller"] == "live",
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise RecordingError(f"{os.fspath(path)}: bad header ({exc})") from exc


def _replay_live(
    path: str | os.PathLike[str],
    header: Mapping[str, Any],
    lines: Sequence[dict[str, Any]],
    state_dir: Path,
) -> ReplayResult:
    rep = _LiveReplayer(header, lines)
    first = next((float(rec["t"]) for rec in rep.sequence), 0.0)
    clock = SimClock(float(header.get("t", first)))
    ctl = _controller(path, header, state_dir, rep, clock)
    try:
        rep.run(ctl, clock)
    finally:
        ctl.stop()
    got_facts = [(job, fact) for job, fact in _facts(state_dir / "resize")]
    problems = list(rep.problems)
    prefix = rep.closed is None
    if prefix and not rep.expected_facts:
        problems.append(
            "the recording has no closing line and no facts (the controller stopped "
            "before writing any): there is nothing to compare the replay with"
        )
    problems.extend(
        compare_live(rep.expected_starts, rep.started, rep.expected_facts, got_facts, prefix)
    )
    return ReplayResult(rep.inputs, len(rep.started), len(got_facts), tuple(problems), "live")


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


# --------------------------------------------------------------------------- live comparison


def timeless(fact: Mapping[str, Any]) -> dict[str, Any]:
    """A fact without its times (``at``, ``*_at``), which live runs never repeat."""
    return {k: v for k, v in fact.items() if k != "at" and not k.endswith("_at")}


def show_fact(fact: Mapping[str, Any]) -> str:
    """One fact, short: ``GrowPlaced tasks=[3@h2, 4@h2]`` (no job id, no times)."""
    parts = []
    for key, value in timeless(fact).items():
        if key in ("type", "job_id"):
            continue
        if key == "tasks" and isinstance(value, list):
            shown = "[" + ", ".join(_task_text(t) for t in value) + "]"
        else:
            shown = json.dumps(value, ensure_ascii=False)
        parts.append(f"{key}={shown}")
    return " ".join([str(fact.get("type", "?")), *parts])


def _task_text(task: Any) -> str:
    if isinstance(task, list) and len(task) == 2:
        return f"{task[0]}@{task[1]}"
    return json.dumps(task, ensure_ascii=False)


def _show_hosts(hosts: Mapping[str, int]) -> str:
    return " ".join(f"{h} {n}" for h, n in hosts.items()) or "(nothing)"


def compare_live(
    expected_starts: Sequence[tuple[str, Mapping[str, int]]],
    got_starts: Sequence[tuple[str, Mapping[str, int]]],
    expected_facts: Sequence[tuple[str, Mapping[str, Any]]],
    got_facts: Sequence[tuple[str, Mapping[str, Any]]],
    prefix: bool = False,
) -> list[str]:
    """The differences between a live run and its replay, per job and in order: where
    each job started, and its facts without times (:func:`timeless`); the first
    difference of each job is listed (a later one usually follows from it).

    With ``prefix`` (the run crashed), a job's replay may go further than the
    recording: what was recorded must be the beginning of what the replay produced.
    """
    problems: list[str] = []
    want_start = dict(expected_starts)
    got_start = dict(got_starts)
    for job, hosts in want_start.items():
        if job not in got_start:
            problems.append(
                f"job {job}: started on {_show_hosts(hosts)} live, not started in the replay"
            )
        elif dict(got_start[job]) != dict(hosts):
            problems.append(
                f"job {job}: started on {_show_hosts(hosts)} live, "
                f"on {_show_hosts(got_start[job])} in the replay"
            )
    if not prefix:
        problems.extend(
            f"job {job}: started on {_show_hosts(hosts)} in the replay, not live"
            for job, hosts in got_start.items()
            if job not in want_start
        )
    want = _per_job(expected_facts)
    got = _per_job(got_facts)
    for job in list(want) + [j for j in got if j not in want]:
        a, b = want.get(job, []), got.get(job, [])
        for n, (x, y) in enumerate(zip(a, b, strict=False)):
            if x != y:
                problems.append(
                    f"job {job} fact {n + 1}: live {show_fact(x)}; replay {show_fact(y)}"
                )
                break
        else:
            if len(a) > len(b):
                problems.append(
                    f"job {job}: {len(a)} facts live, {len(b)} in the replay; "
                    f"fact {len(b) + 1} not replayed: {show_fact(a[len(b)])}"
                )
            elif len(b) > len(a) and not prefix:
                problems.append(
                    f"job {job}: {len(a)} facts live, {len(b)} in the replay; "
                    f"fact {len(a) + 1} only in the replay: {show_fact(b[len(a)])}"
                )
    if len(problems) > MAX_PROBLEMS:
        problems[MAX_PROBLEMS:] = [f"... and {len(problems) - MAX_PROBLEMS} more"]
    return problems


def _per_job(facts: Sequence[tuple[str, Mapping[str, Any]]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for job, fact in facts:
        out.setdefault(job, []).append(timeless(fact))
    return out
