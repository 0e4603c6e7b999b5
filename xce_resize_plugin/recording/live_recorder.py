"""The live controller's recording of its inputs (``[controller] record``, ``--record``).

A :class:`LiveRecorder` writes the ``"controller": "live"`` variant of the format that
:mod:`..recording` specifies (its docstring): submissions, resize requests with their
outcome, task events from the agents, notification outcomes, job endings, each with
the controller's clock, ``cycle`` lines where the controller settled, and for
comparison the job starts and the plugin's journal facts. ``xce-resize simulate
--replay FILE`` replays it in simulated time.

It is a :class:`~xce_resize_plugin.controllers.observer.LiveObserver` of the
:class:`~xce_resize_plugin.controllers.live.live_controller.LiveController`, attached
by :func:`record_live_run` before the controller opens (the ``xce-resize controller``
command does it); the controller calls it always under its lock, so the lines are in
the order the controller took things:

- :meth:`header` when it is attached, before any agent or the plugin starts;
- ``job_submitted`` / ``job_started`` / ``job_ending`` (the job end): input lines and
  the starts;
- ``hook_decided``: an accepted resize request, when it is decided (the controller
  then releases its lock while the request's fsync runs);
- ``hook_returned``: a resize request refused, with its outcome; then the facts the
  journal has (after a request and after ``xce_job_end``); ``task_reported``,
  ``notification_answered`` and ``job_over`` (a job's tasks stopped before its end):
  input lines;
- ``cycles_started`` / ``cycles_ended`` around every settle (:meth:`before_cycle` /
  :meth:`after_cycle`), ``controller_started``: the facts of the plugin's recovery;
- ``controller_closed``: :meth:`finish` after a clean stop (the last facts and the
  ``closed`` line), or :meth:`close` (fenced, or stopping on an error: the file ends
  as after a crash).

**Crash safety.** Every line is flushed as it is written (not fsynced: a controller
crash loses nothing written, a power cut may). A fact line is written only after the
line of the input that caused it, so a crash leaves a prefix that replays: the facts
it holds are each job's first facts in the replay (the replay may go further, e.g. when
the crash interrupted a cycle).

**One run, from an empty state directory.** The replay starts from an empty cluster,
so a recording must start with the state directory: the controller refuses to start
with recording on when the state directory already has jobs (a restart), and never
overwrites or appends to an existing non-empty file. It holds an exclusive ``flock`` on
the file while it writes, so two controllers cannot write one recording.

**Failures.** A line that cannot be written (disk full...) stops the recording with an
error in the log; the controller goes on (the recording is then a prefix, like after a
crash).

A submission's line is made from the job's record (the embedded controller's
:meth:`~xce_resize_plugin.controllers.sim.sim_controller.EmbeddedController.record`),
for ``alloc`` and ``start_tasks``, which the public job view does not carry.
"""

from __future__ import annotations

import fcntl
import json
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from xce_resize_plugin.controllers.live.live_controller import LiveController
from xce_resize_plugin.controllers.observer import LiveObserver
from xce_resize_plugin.controllers.runners import NotificationRequest, NotificationResult
from xce_resize_plugin.core.models import JobState, Principal, Task, TaskEvent, host_counts
from xce_resize_plugin.errors import ResizeError
from xce_resize_plugin.journal import Journal
from xce_resize_plugin.recording.format import (
    FORMAT,
    RecordingError,
    RecordingWriter,
    request_fields,
    submit_fields,
)

log = logging.getLogger(__name__)

__all__ = ["LiveRecorder", "RecordingRefused", "record_live_run"]


class RecordingRefused(RecordingError):
    """Recording was asked for but cannot be done; the controller does not start."""

    message = "Cannot record this run"


def record_live_run(ctl: LiveController) -> LiveRecorder | None:
    """Record ``ctl``'s run when its configuration says so (``[controller] record``):
    open the file, write the header and attach the recorder. Call it before
    :meth:`~LiveController.open`; it raises :class:`RecordingRefused` (nothing is
    started then) when the run cannot be recorded."""
    if ctl.cfg.record is None:
        return None
    with ctl.lock:
        recorder = LiveRecorder.open(ctl.cfg.record, ctl)
        try:
            recorder.header()
        except BaseException:
            recorder.close()
            raise
        ctl.add_observer(recorder)
    return recorder


class LiveRecorder(LiveObserver):
    """Writes one live controller run's recording; create with :meth:`open`."""

    def __init__(self, path: Path, out: IO[str], ctl: LiveController) -> None:
        self.path = path
        self._out: IO[str] | None = out
        self._writer = RecordingWriter(out, flush=True)
        self._ctl = ctl
        #: Whether inputs were written since the last ``cycle`` line: the next settle
        #: must then be replayed after them.
        self._pending = False
        # Whether the settle in progress has its ``cycle`` line already.
        self._marked = False
        self._journal: Journal | None = None
        self._next_seq = 1
        # The requests whose line hook_decided wrote, until they return (by the id of
        # their hook call's arguments, alive until then).
        self._decided: set[int] = set()

    # -- opening --------------------------------------------------------------------

    @classmethod
    def open(cls, path: Path, ctl: LiveController) -> LiveRecorder:
        """Open ``path`` for a new recording of ``ctl``'s run, or raise
        :class:`RecordingRefused` saying why not (the file holds something, another
        controller writes it, the state directory is not empty)."""
        try:
            out = open(path, "a", encoding="utf-8")  # noqa: SIM115 - kept open for the run
        except OSError as exc:
            raise RecordingRefused(f"{path}: cannot open: {exc.strerror or exc}") from exc
        try:
            try:
                fcntl.flock(out.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise RecordingRefused(
                    f"{path}: another controller is writing a recording to this file"
                ) from None
            except OSError as exc:
                raise RecordingRefused(f"{path}: cannot lock: {exc.strerror or exc}") from exc
            if out.seek(0, 2):
                raise RecordingRefused(f"{path}: {_describe(path)}; {_ONE_RUN}")
            if ctl.job_count():
                raise RecordingRefused(
                    f"{path}: the state directory {ctl.cfg.state_dir} already has "
                    f"{ctl.job_count()} job(s); {_ONE_RUN}"
                )
        except BaseException:
            out.close()
            raise
        return cls(path, out, ctl)

    # -- lines ----------------------------------------------------------------------

    def _write(self, record: Mapping[str, Any]) -> None:
        if self._out is None:
            return
        try:
            self._writer.write(record)
        except Exception as exc:  # never let the recording take the controller down
            self._stop(f"cannot write {self.path}: {exc}")

    def _stop(self, why: str) -> None:
        log.error("recording stopped: %s", why)
        self.close()

    def header(self) -> None:
        """The first line: the cluster, the ``[resize]`` section, the clock. Raises
        :class:`RecordingRefused` if it cannot be written (the controller does not
        start then)."""
        ctl = self._ctl
        embedded = ctl.embedded
        assert self._out is not None, "the header is written right after open()"
        try:
            self._writer.header(
                controller="live",
                hosts=ctl.cfg.hosts,
                config=ctl.config,
                user_slots=ctl.cfg.user_slots,
                protect_reservation=embedded.protect_reservation,
                lean_cycles=embedded.lean_cycles,
                extra={
                    "t": ctl.now(),
                    "task_event_batches": embedded.task_event_batches,
                    "state_dir": str(ctl.cfg.state_dir),
                },
            )
        except (OSError, TypeError, ValueError) as exc:
            raise RecordingRefused(f"{self.path}: cannot write: {exc}") from exc

    def input(self, kind: str, *, sync: bool = False, **fields: Any) -> None:
        """One input line at the controller's clock; ``sync``: the runner answered
        inside the controller's own call (replay answers that call the same way)."""
        line = {"kind": kind, "t": self._ctl.now(), "phase": "sync" if sync else "settled"}
        line.update(fields)
        self._write(line)
        if not sync:
            self._pending = True

    def before_cycle(self, t: float) -> bool:
        """Called before a settle at ``t``: write its ``cycle`` line now if inputs came
        in since the last one (so that a crash during the cycle still leaves it)."""
        if not self._pending:
            return False
        self._write({"kind": "cycle", "t": t})
        self._pending = False
        return True

    def after_cycle(self, t: float, marked: bool, changed: bool) -> None:
        """Called after the settle: a settle without inputs before it is recorded only
        when it changed something (the clock alone can: EASY backfill on estimates),
        and then its facts."""
        if not marked and changed:
            self._write({"kind": "cycle", "t": t})
        if marked or changed:
            self.sync_facts()

    def sync_facts(self) -> None:
        """Append the facts the journal got since the last call."""
        if self._out is None:
            return
        try:
            if self._journal is None:
                # Read-only, through the same environment the plugin has open (the
                # journal shares one per process): the controller never writes it.
                self._journal = Journal.open(self._ctl.cfg.state_dir / "resize", readonly=True)
            for seq, job_id, payload in self._journal.facts(self._next_seq):
                fact = json.loads(payload)
                self._write({"kind": "fact", "seq": seq, "job": job_id, "fact": fact})
                self._next_seq = seq + 1
        except Exception as exc:
            self._stop(f"cannot read the journal's facts: {exc}")

    # -- observer -------------------------------------------------------------------

    def controller_started(self) -> None:
        self.sync_facts()  # the plugin's recovery

    def job_submitted(self, job_id: str, time: float) -> None:
        record = self._ctl.embedded.record(job_id)
        assert record is not None, "observers hear of a submission once it is accepted"
        self.input("submit", **submit_fields(record))

    def job_started(self, job_id: str, time: float, tasks: Sequence[Task]) -> None:
        self._write({"kind": "started", "t": time, "job": job_id, "hosts": host_counts(tasks)})

    def host_changed(
        self, name: str, time: float, state: str, evacuate: bool, principal: Principal | None
    ) -> None:
        # An evacuation's releases reach the plugin through its request hook, which this
        # recorder writes as request lines of their own: the host line is the close alone.
        self.input("host", host=name, state=state)

    def job_ending(self, job_id: str, time: float, state: JobState, reason: str) -> None:
        # Before the controller ends it and tells the plugin: the facts of the end
        # come after this line.
        self.input("end", job=job_id, state=state.value, reason=reason)

    def task_reported(self, event: TaskEvent, sync: bool) -> None:
        # Only reports that changed the controller's state come here: replay drops the
        # others the same way.
        self.input(
            "task",
            sync=sync,
            job=event.job_id,
            task=event.task_id,
            event=event.kind,
            status=event.status,
            reason=event.reason,
        )

    def notification_answered(
        self, request: NotificationRequest, result: NotificationResult
    ) -> None:
        # The outcome, whichever way it came (the agent's report, a lost agent), before
        # the controller queues it for the plugin.
        self.input(
            "notify",
            job=request.job_id,
            attempt=request.attempt,
            status=result.status,
            reason=result.reason,
        )

    def job_over(
        self, job_id: str, state: JobState, reason: str, tasks: list[int], grace: float
    ) -> None:
        self.input("ending", job=job_id, tasks=tasks, grace=grace, state=state.value, reason=reason)

    def hook_decided(self, name: str, kwargs: Mapping[str, Any]) -> None:
        if name == "xce_resize_request":
            # The request is decided and queued for the journal; the controller lock
            # is released next while its fsync runs: its line goes now, in decision
            # order, before any input or cycle that may come in meanwhile.
            self._decided.add(id(kwargs))
            self.input(
                "request",
                **request_fields(kwargs["job_id"], kwargs["principal"], kwargs["request"], None),
            )

    def hook_returned(
        self, name: str, kwargs: Mapping[str, Any], error: BaseException | None
    ) -> None:
        if name == "xce_resize_request" and id(kwargs) in self._decided:
            self._decided.discard(id(kwargs))  # its line is written (hook_decided)
        elif name == "xce_resize_request":
            # Still under the lock the call held: no other input comes between the
            # request and its line.
            if error is None:
                code = None
            elif isinstance(error, ResizeError):
                code = error.code
            else:
                code = type(error).__name__
            self.input(
                "request",
                **request_fields(kwargs["job_id"], kwargs["principal"], kwargs["request"], code),
            )
        if name in ("xce_resize_request", "xce_job_end"):
            self.sync_facts()

    def cycles_started(self, time: float) -> None:
        # Where the cycles ran, relative to the inputs.
        self._marked = self.before_cycle(time)

    def cycles_ended(self, time: float, changed: bool) -> None:
        self.after_cycle(time, self._marked, changed)

    def controller_closed(self, clean: bool) -> None:
        if clean:
            self.finish()
        else:
            self.close()  # fenced or failed: the recording ends as after a crash

    # -- the end --------------------------------------------------------------------

    def finish(self) -> None:
        """After a clean stop: the remaining facts, then ``closed``; close the file."""
        self.sync_facts()
        self._write({"kind": "closed", "t": self._ctl.now(), "clean": True})
        self.close()

    def close(self) -> None:
        """Close the file (releasing its lock) without a ``closed`` line. Idempotent."""
        journal, self._journal = self._journal, None
        if journal is not None:
            journal.close()
        out, self._out = self._out, None
        if out is not None:
            try:
                out.close()
            except OSError as exc:
                log.error("closing %s: %s", self.path, exc)


_ONE_RUN = (
    "a recording covers one controller run from an empty state directory (replay starts "
    "from an empty cluster): record to a new file with a new state directory, or turn "
    "recording off ([controller] record, --record) to start on this one"
)


def _describe(path: Path) -> str:
    """What the non-empty file at ``path`` holds, for the refusal."""
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            first = fh.readline()
    except OSError as exc:
        return f"exists and cannot be read ({exc.strerror or exc})"
    if f'"format":"{FORMAT}"' in first.replace(" ", ""):
        return "already holds a recording (it is never overwritten or appended to)"
    return "exists and is not empty (it is never overwritten)"
