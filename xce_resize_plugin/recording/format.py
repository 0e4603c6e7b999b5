"""Recordings of a controller's inputs, and their replay in simulated time.

A *recording* is everything that came into a controller from outside, with times —
job submissions, resize requests (with their outcome), task process events,
notification outcomes and job ends — plus, for comparison, what came out: the job
starts and the plugin's journal facts. :func:`.replay.replay` feeds the inputs to a
new embedded controller in simulated time and checks that the same starts and the same
sequence of resize facts (placements, commits, releases...) come out.

``xce-resize simulate TRACE --record OUT`` writes one of its elastic run,
``xce-resize scenario run FILE --record OUT`` one of the scenario
(:mod:`.sim_recorder`); the live controller writes one of its run with ``[controller]
record = "OUT"`` or ``xce-resize controller --record OUT`` (:mod:`.live.recorder`);
``xce-resize simulate --replay OUT`` replays either (:mod:`.replay`; docs/simulation.md,
"Reproducing a run").

This module holds the format: its writer (:class:`RecordingWriter`), the ``request``
line's fields, and the reader (:func:`read_recording`) with the checks of every line.

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

- ``submit``: ``job``, ``user``, ``tasks`` ([min, max]), ``start_tasks``,
  ``initial_tasks`` (absent in older recordings), ``estimate``, ``ptile``,
  ``resizable``, ``grow_hosts``, ``notify_cmd``, ``env``, optionally ``autoresize``
  (``true``; absent when not set), ``alloc`` ([[host, tasks], ...] in allocation
  order: the job started at once there) and ``work`` ({``model``: a speedup spec as
  ``--speedup`` takes it, ``ref_procs``, ``estimate``}: the scheduler plans the job
  with that model; its end still comes from an ``end`` line);
- ``host``: ``host``, ``state`` (``down`` | ``up`` | ``closed`` | ``open``: a host
  command the controller accepted, before its effects), and for a close with
  evacuation ``evacuate`` (``true``) and ``principal`` (who asks the releases);
- ``request``: ``job``, ``principal`` ({``name``, ``admin``, ``job_id``}),
  ``request`` ({``type``: ``grow`` | ``release`` | ``cancel`` | ``modify`` |
  ``target`` | ``drained`` | ``ready``, and the request's fields; ``modify`` has
  ``autoresize``, ``target`` ``tasks`` (``null``: cleared) and ``release_prefer``,
  ``drained`` ``task_ids``, ``ready`` ``task_id``}), ``result`` (``"ok"`` or the
  error code);
- ``task``: ``job``, ``task`` (the task id), ``event`` (``started`` | ``start_failed`` |
  ``exited``), ``status``, ``reason``;
- ``notify``: ``job``, ``attempt``, ``status``, ``reason``;
- ``ending`` (live): ``job``, ``tasks`` (task ids), ``grace``, ``state``, ``reason``:
  the job is over (its task 0 ended, or it was killed) and the controller stops these
  live tasks first (replay: ``stop_tasks``); its ``end`` line follows once they are gone;
- ``end``: ``job``, ``state`` (``DONE`` | ``EXIT``, or ``PEND`` for a job a host
  failure requeued once its other tasks were stopped), ``reason``.

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
job's recorded facts must be the first ones the replay produced for it). Either way a
fact of several tasks is compared as the per-task facts it stands for
(:func:`.replay.one_per_task`).

Lines of an unknown ``kind`` are an error (a newer format), not skipped; so are lines
missing a field replay needs, and kinds of the other controller's variant. So are
values no recorder writes (:func:`check_line`): a ``t`` outside the simulated clock's
range (0 to ``MAX_SECONDS``), task counts outside 1 to ``MAX_TASKS`` or a job's range,
negative estimates and drain times, header hosts of more than ``MAX_HOST_SLOTS`` slots
or more than :data:`MAX_HOSTS` of them.
"""

from __future__ import annotations

import io
import json
import math
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

import attrs

from xce_resize_plugin.controllers.input_files import open_regular
from xce_resize_plugin.controllers.jobs import JobRecord
from xce_resize_plugin.controllers.sim.events import MAX_SECONDS
from xce_resize_plugin.controllers.sim.speedup import parse_speedup
from xce_resize_plugin.controllers.tomlfile import MAX_HOST_SLOTS
from xce_resize_plugin.core.models import (
    AutoresizeRequest,
    CancelRequest,
    DrainedRequest,
    GrowHosts,
    GrowRequest,
    ReadyRequest,
    ReleaseRequest,
    ResizeRequest,
    TargetRequest,
)
from xce_resize_plugin.errors import ConfigError
from xce_resize_plugin.host import Principal
from xce_resize_plugin.journal import Journal
from xce_resize_plugin.lsf.bresize_args import MAX_TASKS

__all__ = [
    "FORMAT",
    "VERSION",
    "RecordingError",
    "RecordingWriter",
    "read_recording",
    "submit_fields",
]

FORMAT = "xce-resize-recording"
VERSION = 1
CONTROLLERS = ("simulated", "live")
INPUT_KINDS = ("submit", "request", "task", "notify", "end", "tick", "ending", "cycle", "host")
OUTPUT_KINDS = ("started", "fact")
#: The kinds each variant may hold (a ``tick`` in a live recording is an error).
KINDS = {
    "simulated": frozenset(INPUT_KINDS + OUTPUT_KINDS) - {"ending", "cycle"},
    "live": frozenset(INPUT_KINDS + OUTPUT_KINDS + ("closed",)) - {"tick"},
}
PHASES = ("timeline", "settled", "sync")
TASK_EVENTS = ("started", "start_failed", "exited")
END_STATES = ("DONE", "EXIT", "PEND")
#: The most hosts a recording's cluster may have: the simulator's cap
#: (``simulation.simulate.MAX_HOSTS``, 2**20; a test checks they agree). This layer is
#: below the simulation (.importlinter), so it cannot import it.
MAX_HOSTS = 1 << 20
#: The longest line a recording may have, in characters (32 Mi). The longest a recorder
#: writes is the header of the simulator's largest cluster, 2**20 hosts at about 16
#: characters each (``["n1048576",64],``): 16 Mi. A longer line (a file without line
#: breaks, ``/dev/zero`` behind a name) is refused instead of read into memory whole.
MAX_LINE_CHARS = 32 << 20


class RecordingError(ConfigError):
    """A recording cannot be read or replayed; the detail says where."""

    message = "Recording error"


# --------------------------------------------------------------------------- writing


def request_json(request: ResizeRequest) -> dict[str, Any]:
    """A resize request as a recording line holds it (``if_version`` only when given,
    so that recordings without it keep their bytes)."""
    if isinstance(request, TargetRequest):
        return {
            "type": "target",
            "tasks": request.tasks,
            "release_prefer": list(request.release_prefer),
        }
    if isinstance(request, GrowRequest):
        data = _without_if_version(attrs.asdict(request))
        if not request.wait_ready:
            # Grows without a readiness wait keep the lines they always had.
            del data["wait_ready"], data["ready_timeout"]
        return {"type": "grow", **data}
    if isinstance(request, ReadyRequest):
        return {"type": "ready", "task_id": request.task_id}
    if isinstance(request, ReleaseRequest):
        data = _without_if_version(attrs.asdict(request))
        if data["hosts"] is not None:
            data["hosts"] = dict(data["hosts"])
        if data["task_ids"] is not None:
            data["task_ids"] = list(data["task_ids"])
        if data["grace"] is None:
            del data["grace"]  # recordings of releases without one read as before
        return {"type": "release", **data}
    if isinstance(request, AutoresizeRequest):
        return {"type": "modify", "autoresize": request.enabled}
    if isinstance(request, DrainedRequest):
        return {"type": "drained", "task_ids": list(request.task_ids)}
    return {"type": "cancel"}


def _without_if_version(data: dict[str, Any]) -> dict[str, Any]:
    if data.get("if_version") is None:
        data.pop("if_version", None)
    return data


def request_from_json(data: Mapping[str, Any]) -> ResizeRequest:
    body = dict(data)
    kind = body.pop("type", None)
    if kind == "target" and set(body) == {"tasks", "release_prefer"}:
        return TargetRequest(body["tasks"], tuple(body["release_prefer"]))
    if kind == "grow":
        return GrowRequest(**body)
    if kind == "release":
        if body.get("task_ids") is not None:
            body["task_ids"] = tuple(body["task_ids"])
        return ReleaseRequest(**body)
    if kind == "cancel" and not body:
        return CancelRequest()
    if kind == "drained" and set(body) == {"task_ids"} and isinstance(body["task_ids"], list):
        return DrainedRequest(tuple(int(i) for i in body["task_ids"]))
    if kind == "modify" and set(body) == {"autoresize"} and isinstance(body["autoresize"], bool):
        return AutoresizeRequest(body["autoresize"])
    if kind == "ready" and set(body) == {"task_id"} and type(body["task_id"]) is int:
        return ReadyRequest(body["task_id"])
    raise ValueError(f"bad request {dict(data)!r}")


def submit_fields(job: JobRecord) -> dict[str, Any]:
    """A ``submit`` line's fields for a job as the controller accepted it. Its run time,
    if the driver gave one, is recorded as the estimate: the job's end is an ``end``
    line of its own, so the replay must not end it by itself."""
    estimate = job.estimate if job.estimate is not None else job.runtime
    fields = {
        "job": job.id,
        "user": job.user,
        "tasks": [job.min_tasks, job.max_tasks],
        "start_tasks": job.start_tasks,
        "initial_tasks": job.initial_tasks,
        "estimate": estimate,
        "ptile": job.ptile,
        "resizable": job.resizable,
        "grow_hosts": job.grow_hosts.value,
        "notify_cmd": job.notify_cmd,
        "env": dict(job.env),
        "alloc": None if job.alloc is None else [[h, n] for h, n in job.alloc],
    }
    if job.autoresize:
        # Only when set, so recordings of runs without autoresize read as before.
        fields["autoresize"] = True
    if job.release_exited:
        fields["release_exited"] = True  # likewise
    if job.grace:
        fields["grace"] = job.grace  # likewise: only a job with a drain time
    return fields


def principal_fields(principal: Principal) -> dict[str, Any]:
    """Who asked, as request and host lines record it."""
    return {"name": principal.name, "admin": principal.admin, "job_id": principal.job_id}


def request_fields(
    job_id: str, principal: Principal, request: ResizeRequest, code: str | None
) -> dict[str, Any]:
    """The fields of a ``request`` line (both recorders write the same)."""
    return {
        "job": job_id,
        "principal": principal_fields(principal),
        "request": request_json(request),
        "result": code or "ok",
    }


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


# --------------------------------------------------------------------------- reading

GROW_HOSTS = tuple(g.value for g in GrowHosts)


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _int(value: Any) -> bool:
    # Within 64 bits: the journal's records hold them (a larger status replayed was a
    # "cannot be written to the journal" naming neither the line nor the field).
    return isinstance(value, int) and not isinstance(value, bool) and -(2**63) <= value < 2**63


def _seconds(value: Any) -> bool:
    """A time or duration in the simulated clock's range (what traces and scenario
    files are held to: :data:`~xce_resize_plugin.controllers.sim.events.MAX_SECONDS`)."""
    return _number(value) and 0 <= value <= MAX_SECONDS


def _duration(value: Any) -> bool:
    """A job's estimate or drain time: a number >= 0. Not bounded by the clock's range:
    the live API takes any (the replay only plans with it, and never runs the clock to
    it)."""
    return _number(value) and value >= 0


def _count(value: Any) -> bool:
    """A task count: 1 to :data:`~xce_resize_plugin.lsf.bresize_args.MAX_TASKS`, the
    largest a submission or a request takes."""
    return _int(value) and 1 <= value <= MAX_TASKS


def _str(value: Any) -> bool:
    return isinstance(value, str)


def _task_range(value: Any) -> bool:
    return (
        isinstance(value, list)
        and len(value) == 2
        and all(_count(v) for v in value)
        and value[0] <= value[1]
    )


def _principal(value: Any) -> bool:
    return isinstance(value, dict) and _str(value.get("name"))


#: The ``type`` of a request line's request, one per kind :func:`request_json` writes.
REQUEST_TYPES = ("grow", "release", "cancel", "target", "modify", "drained", "ready")


def _request(value: Any) -> bool:
    return isinstance(value, dict) and value.get("type") in REQUEST_TYPES


def _ids(value: Any) -> bool:
    return isinstance(value, list) and all(_int(v) for v in value)


def _hosts_map(value: Any) -> bool:
    return isinstance(value, dict) and all(_int(v) for v in value.values())


def _fact(value: Any) -> bool:
    return isinstance(value, dict) and _str(value.get("type"))


def _or_null(check: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda value: value is None or check(value)


def _env(value: Any) -> bool:
    return isinstance(value, dict) and all(_str(v) for v in value.values())


def _bool(value: Any) -> bool:
    return isinstance(value, bool)


def _alloc(value: Any) -> bool:
    return isinstance(value, list) and all(
        isinstance(pair, list) and len(pair) == 2 and _str(pair[0]) and _count(pair[1])
        for pair in value
    )


def _work(value: Any) -> bool:
    if not (
        isinstance(value, dict) and _count(value.get("ref_procs")) and _str(value.get("model"))
    ):
        return False
    if not (_seconds(value.get("estimate")) and value["estimate"] > 0):
        return False
    try:
        parse_speedup(value["model"])
    except ConfigError:
        return False
    return True


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
        "tasks": (_task_range, f"[min, max] (integers, 1 <= min <= max <= {MAX_TASKS})"),
    },
    "request": {
        "job": (_str, "a job id (string)"),
        "principal": (_principal, "an object with a name"),
        "request": (_request, f"an object whose type is {' | '.join(REQUEST_TYPES)}"),
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
        "grace": (_duration, "seconds (a number >= 0)"),
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
    "host": {
        "host": (_str, "a host name (string)"),
        "state": (lambda v: v in ("down", "up", "closed", "open"), "down, up, closed or open"),
    },
}


#: Fields of a kind that replay reads when they are there: checked only if present.
_OPTIONAL: dict[str, dict[str, tuple[Callable[[Any], bool], str]]] = {
    "submit": {
        "notify_cmd": (_or_null(_str), "a string or null"),
        "ptile": (_or_null(_count), f"an integer from 1 to {MAX_TASKS} or null"),
        "start_tasks": (_or_null(_int), "an integer or null"),
        "initial_tasks": (_or_null(_int), "an integer or null"),
        "estimate": (_or_null(_duration), "seconds (a number >= 0) or null"),
        "grace": (_duration, "seconds (a number >= 0)"),
        "env": (_env, "an object of strings"),
        "resizable": (_bool, "true or false"),
        "autoresize": (_bool, "true or false"),
        "release_exited": (_bool, "true or false"),
        "grow_hosts": (_one_of(*GROW_HOSTS), " | ".join(GROW_HOSTS)),
        "alloc": (_or_null(_alloc), "null or a list of [host, tasks] pairs (tasks >= 1)"),
        "work": (
            _or_null(_work),
            "null or {model: a speedup model, ref_procs (>= 1), estimate (seconds > 0)}",
        ),
    },
    # The status the replay hands to the plugin, which records it in its journal.
    "task": {"status": (_or_null(_int), "a 64-bit integer or null")},
    "notify": {"status": (_or_null(_int), "a 64-bit integer or null")},
}


def check_line(rec: Mapping[str, Any], controller: str) -> str | None:
    """What is wrong with one (non-header) line of a ``controller`` recording, if
    anything: the message names the field and what it must be."""
    kind = rec.get("kind")
    if kind not in INPUT_KINDS + OUTPUT_KINDS + ("closed",):
        return f"unknown kind {kind!r}"
    if kind not in KINDS[controller]:
        return f"kind {kind!r} is not part of a {controller} recording"
    if kind not in ("fact",) and not _seconds(rec.get("t")):
        return (
            f"{kind}: t must be the controller's clock (a number from 0 to "
            f"{MAX_SECONDS:.0e} s), got {_shown(rec.get('t'))}"
        )
    phase = rec.get("phase")
    if phase is not None and phase not in PHASES:
        return f"{kind}: phase must be one of {', '.join(PHASES)}, got {phase!r}"
    if phase == "sync" and kind not in ("task", "notify"):
        return f"{kind}: only task and notify lines can be sync"
    for name, (ok, what) in _FIELDS[kind].items():
        if name not in rec:
            return f"{kind}: missing field {name!r}"
        if not ok(rec[name]):
            return f"{kind}: {name} must be {what}, got {_shown(rec[name])}"
    for name, (ok, what) in _OPTIONAL.get(kind, {}).items():
        if name in rec and not ok(rec[name]):
            return f"{kind}: {name} must be {what}, got {_shown(rec[name])}"
    return _submit_sizes(rec) if kind == "submit" else None


def _submit_sizes(rec: Mapping[str, Any]) -> str | None:
    """What a submission's sizes must satisfy together, as the controller's own
    checks of a submission (``start_tasks``, ``initial``, ``alloc`` within the job's
    range): a recorder writes only submissions the controller accepted."""
    lo, hi = rec["tasks"]
    for name in ("start_tasks", "initial_tasks"):
        size = rec.get(name)
        if size is not None and not lo <= size <= hi:
            return f"submit: {name} must be within the job's tasks {lo},{hi}, got {size}"
    alloc = rec.get("alloc")
    if alloc is not None and not lo <= sum(n for _, n in alloc) <= hi:
        return f"submit: alloc must hold {lo} to {hi} tasks, got {sum(n for _, n in alloc)}"
    return None


#: How much of a bad value a message shows: one line, whatever the value's size.
SHOWN_CHARS = 80


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= SHOWN_CHARS else f"{text[: SHOWN_CHARS - 3]}..."


def read_recording(path: str | os.PathLike[str]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The header and the other lines of a recording, each checked (:func:`check_line`)
    for what replay reads; :class:`RecordingError` names the file, line and field."""
    name = os.fspath(path)
    try:
        with _open_regular(name) as fh:
            return _read_lines(fh, name)
    except OSError as exc:
        raise RecordingError(f"{name}: cannot read ({exc})") from exc
    except UnicodeDecodeError as exc:
        raise RecordingError(f"{name}: not UTF-8 text ({exc})") from None


def _open_regular(name: str) -> IO[str]:
    """The file ``name`` for reading as text, if it is a regular file: a FIFO (opened
    without waiting for a writer) or a device such as ``/dev/zero`` is refused
    (:class:`~xce_resize_plugin.controllers.input_files.NotRegularFile`), not read."""
    return io.TextIOWrapper(open_regular(name), encoding="utf-8")  # the caller closes it


def _read_lines(fh: IO[str], name: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    lines: list[dict[str, Any]] = []
    header: dict[str, Any] | None = None
    closed_at: int | None = None
    n = 0
    while raw := fh.readline(MAX_LINE_CHARS + 1):
        n += 1
        if len(raw) > MAX_LINE_CHARS:
            raise RecordingError(
                f"{name}:{n}: a line longer than {MAX_LINE_CHARS:,} characters "
                "(no recorder writes one)"
            )
        if not raw.strip():
            continue
        rec = _parse_line(raw, name, n)
        if header is None:
            header = _check_header(rec, name, n)
            continue
        if closed_at is not None:
            raise RecordingError(f"{name}:{n}: a line after the closing line (line {closed_at})")
        problem = check_line(rec, header["controller"])
        if problem is not None:
            raise RecordingError(f"{name}:{n}: {problem}")
        if rec["kind"] == "closed":
            closed_at = n
        rec["_line"] = n
        lines.append(rec)
    if header is None:
        raise RecordingError(f"{name}: empty recording")
    _check_instants(lines, name)
    return header, lines


def _parse_line(raw: str, name: str, n: int) -> dict[str, Any]:
    try:
        rec = json.loads(raw)
    except RecursionError:
        raise RecordingError(f"{name}:{n}: not JSON (nested too deeply)") from None
    except ValueError as exc:
        if not raw.endswith("\n"):
            raise RecordingError(
                f"{name}:{n}: the last line is cut short (the writer stopped in "
                "the middle of it); remove it to replay the lines before"
            ) from None
        raise RecordingError(f"{name}:{n}: not JSON ({exc})") from None
    if not isinstance(rec, dict) or "kind" not in rec:
        raise RecordingError(f"{name}:{n}: a line must be an object with a kind")
    return rec


def _check_instants(lines: list[dict[str, Any]], name: str) -> None:
    """A recording that numbers its instants (``i``) numbers every input line, and
    every one not of the timeline gives its round (``r``): replay orders by them."""
    if not any("i" in rec for rec in lines if rec["kind"] in INPUT_KINDS):
        return
    for rec in lines:
        phase = rec.get("phase", "settled")
        if rec["kind"] not in INPUT_KINDS or phase == "sync":  # sync lines are looked up
            continue
        needed = ("i",) if phase == "timeline" else ("i", "r")
        for field in needed:
            value = rec.get(field)
            if not (isinstance(value, int) and not isinstance(value, bool) and value >= 0):
                raise RecordingError(
                    f"{name}:{rec['_line']}: {rec['kind']}: {field} must be a whole number >= 0 "
                    f"(the other lines number their instants), got {value!r}"
                )


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
    _check_hosts(rec.get("hosts"), f"{name}:{n}: header")
    if "t" in rec and not _seconds(rec["t"]):
        raise RecordingError(
            f"{name}:{n}: header: t must be a number from 0 to {MAX_SECONDS:.0e}, "
            f"got {_shown(rec['t'])}"
        )
    for key in ("config", "user_slots"):
        if rec.get(key) is not None and not isinstance(rec[key], dict):
            raise RecordingError(
                f"{name}:{n}: header: {key} must be an object, got {_shown(rec[key])}"
            )
    slots = rec.get("user_slots") or {}
    for user, limit in slots.items():
        if not (_int(limit) and limit >= 0):
            raise RecordingError(
                f"{name}:{n}: header: user_slots.{user} must be an integer >= 0, "
                f"got {_shown(limit)}"
            )
    return rec


def _check_hosts(hosts: Any, where: str) -> None:
    """The header's cluster: the limits a cluster file and the simulator hold it to."""
    if not isinstance(hosts, list) or not all(
        isinstance(h, list) and len(h) == 2 and _str(h[0]) and _int(h[1]) for h in hosts
    ):
        raise RecordingError(f"{where}: hosts must be [[name, slots], ...]")
    if len(hosts) > MAX_HOSTS:
        raise RecordingError(
            f"{where}: hosts: {len(hosts):,} hosts, more than the simulator takes ({MAX_HOSTS:,})"
        )
    for i, (host, slots) in enumerate(hosts):
        if not 1 <= slots <= MAX_HOST_SLOTS:
            raise RecordingError(
                f"{where}: hosts[{i}] ({_shown(host)}): slots must be 1 to {MAX_HOST_SLOTS}, "
                f"got {slots}"
            )
