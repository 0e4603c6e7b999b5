"""The replay of a recording in simulated time, and the comparison with what it recorded.

:func:`replay` reads a recording (:func:`.recording.read_recording`; the format is the
docstring of :mod:`.recording`), feeds its inputs to a new embedded controller in
simulated time, answering the controller's task and notification runners from the
recording, and compares the job starts and the journal facts that come out with the
recorded ones: exactly for a simulated recording, per job and without times for a live
one (:func:`compare_live`). ``xce-resize simulate --replay OUT`` runs it.

A recording is data that may come from someone else: the replay loads no policy file
because the recording names one (:class:`PolicyChoice`; docs/simulation.md, "Policy
files").
"""

from __future__ import annotations

import json
import os
import tempfile
from collections import deque
from collections.abc import Hashable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from attrs import frozen

from xce_resize_plugin.controllers.observer import Observer
from xce_resize_plugin.controllers.runners import (
    NotificationDone,
    NotificationRequest,
    NotificationResult,
    SimClock,
    TaskReporter,
)
from xce_resize_plugin.controllers.sim.sim_controller import EmbeddedController
from xce_resize_plugin.controllers.sim.speedup import parse_speedup
from xce_resize_plugin.controllers.sim.work import PlannedWork
from xce_resize_plugin.controllers.violations import EmbeddedError
from xce_resize_plugin.core.models import LossOutcome, Task, host_counts
from xce_resize_plugin.errors import ResizeError
from xce_resize_plugin.host import Principal
from xce_resize_plugin.journal import Journal
from xce_resize_plugin.manager import get_plugin_manager
from xce_resize_plugin.recording.format import (
    INPUT_KINDS,
    RecordingError,
    read_recording,
    request_from_json,
)

__all__ = ["PolicyChoice", "ReplayResult", "policy_config", "replay"]

_K = TypeVar("_K", bound=Hashable)

#: At most this many differences are listed (the first ones per job).
MAX_PROBLEMS = 50


@frozen
class ReplayResult:
    """What a replay found: counts and, if any, the differences.

    ``controller`` is the recording's variant: it decides what was compared (the
    docstring of :mod:`.recording`, "What replay compares").
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
        # In recorded order per key: a job requeued after a host failure runs again
        # from task 0, so the same task id can stop (and a notification attempt can
        # run) once per run; each answers its own call, first come first served.
        self._sync_tasks: dict[tuple[str, int, str], deque[dict[str, Any]]] = {}
        self._sync_notes: dict[tuple[str, int], deque[dict[str, Any]]] = {}
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
                _queue(self._sync_tasks, (rec["job"], rec["task"], rec["event"]), rec)
            else:
                _queue(self._sync_notes, (rec["job"], rec["attempt"]), rec)
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
            elif kind == "host":
                self._host(ctl, rec)
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
                elif rec["state"] == "PEND":
                    ctl.requeue(rec["job"])
                else:
                    ctl.kill(rec["job"], rec.get("reason", "killed"))
        except (KeyError, TypeError, ValueError, AttributeError, EmbeddedError) as exc:
            # AttributeError: a field of another shape than the recorder writes (a
            # release's hosts as a list), found where it is read.
            self._bad(rec, f"cannot apply: {type(exc).__name__}: {exc}")
        except ResizeError as exc:  # the plugin refused a job the recording says started
            self._bad(rec, f"cannot apply: {exc.code}: {exc.text}")

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
            autoresize=bool(rec.get("autoresize", False)),
            grow_hosts=rec.get("grow_hosts", "prefer-existing"),
            notify_cmd=rec.get("notify_cmd"),
            env=rec.get("env") or {},
            alloc=None if alloc is None else [(str(h), int(n)) for h, n in alloc],
            job_id=rec["job"],
            start_tasks=rec.get("start_tasks"),
            initial_tasks=rec.get("initial_tasks"),
            work=work,
            release_exited=bool(rec.get("release_exited", False)),
            grace=float(rec.get("grace", 0.0)),
        )

    def _host(self, ctl: EmbeddedController, rec: Mapping[str, Any]) -> None:
        name, state = rec["host"], rec["state"]
        if state == "closed":
            evacuate = bool(rec.get("evacuate", False))
            ctl.host_close(name, evacuate, _principal(rec["principal"]) if evacuate else None)
            return
        # The other states need only the name (format.py has checked the state).
        {"down": ctl.host_down, "up": ctl.host_up, "open": ctl.host_open}[state](name)

    def _request(self, ctl: EmbeddedController, rec: Mapping[str, Any]) -> None:
        principal = _principal(rec["principal"])
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
            rec = _next(self._sync_tasks, (job_id, task_id, event))
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
        rec = _next(self._sync_notes, key)
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

    def job_started(self, job_id: str, time: float, tasks: Sequence[Task]) -> None:
        self.started.append((job_id, host_counts(tasks)))


def _queue(queues: dict[_K, deque[dict[str, Any]]], key: _K, rec: dict[str, Any]) -> None:
    queues.setdefault(key, deque()).append(rec)


def _next(queues: dict[_K, deque[dict[str, Any]]], key: _K) -> dict[str, Any] | None:
    """The first line still queued for ``key`` (taken out), or ``None``."""
    queue = queues.get(key)
    if not queue:
        return None
    rec = queue.popleft()
    if not queue:
        del queues[key]
    return rec


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
        # Instant 0 (exact recordings) is the settle at the start of run(): its timeline
        # lines came in before it (a scenario's jobs submitted up front) and are applied
        # now; its settled lines are applied by settled().
        if self._instants and self._instants[0] is self._by_index.get(0):
            self._current = self._instants[0]
            self._next = 1
            for rec in self._current.timeline:
                self._apply(rec)
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
    time, a settle at each ``cycle`` line (the docstring of :mod:`.recording`)."""

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


@frozen
class PolicyChoice:
    """Which site policy files a replay loads (docs/simulation.md, "Policy files").

    A recording is data that may come from someone else, and a policy file is Python
    that runs with the replaying user's rights (root's, for an administrator): a
    replay loads none of the files the recording's ``[resize] policy_files`` names
    unless the user says so. ``files``: the ones given on the command line
    (``--policy``), loaded instead of the recorded ones; ``trust_recorded``: load the
    recorded names (``--trust-policy-files``), relative ones from the recording's
    directory. Entry-point policies (``xce_resize.policies``) are never loaded.
    """

    files: tuple[Path, ...] = ()
    trust_recorded: bool = False


def replay(
    path: str | os.PathLike[str],
    state_dir: Path | None = None,
    policies: PolicyChoice | None = None,
) -> ReplayResult:
    """Replay a recording in simulated time; compare its starts and facts."""
    header, lines = read_recording(path)
    policy_config(path, header, policies or PolicyChoice())  # refused before any run
    if state_dir is None:
        with tempfile.TemporaryDirectory(prefix="xce-replay-") as tmp:
            return replay(path, Path(tmp), policies)
    if header["controller"] == "live":
        return _replay_live(path, header, lines, state_dir, policies)
    rep = _Replayer(header, lines)
    ctl = _controller(path, header, state_dir, rep, policies=policies)
    try:
        rep.start(ctl)
        ctl.run()
    finally:
        ctl.stop()
    got_facts = [(job, fact) for job, fact in _facts(state_dir / "resize")]
    problems = list(rep.problems)
    problems.extend(_compare("start", rep.expected_starts, rep.started))
    problems.extend(_compare("fact", one_per_task(rep.expected_facts), one_per_task(got_facts)))
    return ReplayResult(rep.inputs, len(rep.started), len(got_facts), tuple(problems))


def policy_config(
    path: str | os.PathLike[str], header: Mapping[str, Any], policies: PolicyChoice
) -> tuple[dict[str, Any], Path | None]:
    """The ``[resize]`` section the replay's controller gets, with the policy files
    ``policies`` chooses, and the directory relative ones are taken from; a
    :class:`RecordingError` for a recording whose controller ran policy files that
    the user did not choose how to replay."""
    name = os.fspath(path)
    config = dict(header.get("config") or {})
    recorded = config.get("policy_files", [])
    if not isinstance(recorded, list) or not all(isinstance(f, str) for f in recorded):
        raise RecordingError(f"{name}: header: config.policy_files must be a list of paths")
    if policies.files:
        config["policy_files"] = [os.fspath(f) for f in policies.files]
        return config, None  # as given on the command line: from the current directory
    if policies.trust_recorded:
        return config, Path(path).parent
    if recorded:
        raise RecordingError(
            f"{name}: its controller ran the policy files {', '.join(recorded)}; a replay "
            "runs no code a recording names: give them with --policy FILE (one per file), "
            "or --trust-policy-files to load the recorded names"
        )
    return config, None


def _controller(
    path: str | os.PathLike[str],
    header: Mapping[str, Any],
    state_dir: Path,
    rep: _Inputs,
    clock: SimClock | None = None,
    policies: PolicyChoice | None = None,
) -> EmbeddedController:
    """The replay's controller, as the header describes the recorded one."""
    config, base_dir = policy_config(path, header, policies or PolicyChoice())
    try:
        pm = get_plugin_manager(config, base_dir=base_dir, entry_points=False)
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
            # A live controller ends a job that a host failure ends only once its other
            # tasks are stopped: the recording's ending and end lines say when.
            loss_ender=_recorded_end if header["controller"] == "live" else None,
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise RecordingError(f"{os.fspath(path)}: bad header ({exc})") from exc


def _recorded_end(job_id: str, outcome: LossOutcome) -> None:
    """A live recording's host failure: its ``ending`` and ``end`` lines end the job."""


def _replay_live(
    path: str | os.PathLike[str],
    header: Mapping[str, Any],
    lines: Sequence[dict[str, Any]],
    state_dir: Path,
    policies: PolicyChoice | None = None,
) -> ReplayResult:
    rep = _LiveReplayer(header, lines)
    first = next((float(rec["t"]) for rec in rep.sequence), 0.0)
    clock = SimClock(float(header.get("t", first)))
    ctl = _controller(path, header, state_dir, rep, clock, policies)
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


#: The facts of several tasks (journal schema 3) and the per-task fact each stands for.
_PER_TASK = {"TasksStarted": "TaskStarted", "TasksStopped": "TaskStopped"}


def one_per_task(
    facts: Sequence[tuple[str, Mapping[str, Any]]],
) -> list[tuple[str, Mapping[str, Any]]]:
    """The facts with each fact of several tasks as the per-task facts it stands for
    (docs/journal-format.md). How a host's reports of task starts and stops are
    batched is not part of what a run decided: a live run's agents report them as they
    come, its replay all at once, and a recording made before schema 3 has one fact
    per task. Compared this way, all of them agree."""
    out: list[tuple[str, Mapping[str, Any]]] = []
    for job, fact in facts:
        single = _PER_TASK.get(str(fact.get("type")))
        ids = fact.get("task_ids")
        if single is None or not isinstance(ids, list):
            out.append((job, fact))
            continue
        rest = {k: v for k, v in fact.items() if k not in ("task_ids", "type")}
        out.extend((job, {**rest, "task_id": i, "type": single}) for i in ids)
    return out


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
    want = _per_job(one_per_task(expected_facts))
    got = _per_job(one_per_task(got_facts))
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


def _principal(p: Mapping[str, Any]) -> Principal:
    """A recorded ``principal`` ({name, admin, job_id})."""
    return Principal(p["name"], admin=bool(p.get("admin")), job_id=p.get("job_id"))
