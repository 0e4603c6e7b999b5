"""The live controller's recording of its inputs (``[controller] record``, ``--record``).

A :class:`LiveRecorder` writes the ``"controller": "live"`` variant of the format that
:mod:`..recording` specifies (its docstring): submissions, resize requests with their
outcome, task events from the agents, notification outcomes, job endings, each with
the controller's clock, ``cycle`` lines where the controller settled, and for
comparison the job starts and the plugin's journal facts. ``xce-resize simulate
--replay FILE`` replays it in simulated time.

Where the :class:`~.controller.LiveController` calls it, always under its lock (so the
lines are in the order the controller took things):

- :meth:`header` at :meth:`~.controller.LiveController.open`, before the plugin starts;
- ``job_submitted`` / ``job_started`` / ``job_ending`` (the job end) as an observer
  of the controller;
- :meth:`input` from the request hook's monitor, the task reporter, the notification
  callback and the job ending (tasks stopped);
- :meth:`before_cycle` / :meth:`after_cycle` around every settle, :meth:`sync_facts`
  after anything that may have written facts;
- :meth:`finish` after a clean stop (the last facts and the ``closed`` line), or
  :meth:`close` (fenced, or stopping on an error: the file ends as after a crash).

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

It reads one internal of the embedded controller (one the live controller relies on
too): a job's record in ``_jobs`` when it is submitted, for ``alloc`` and
``start_tasks``, which the public job view does not carry.
"""

from __future__ import annotations

import fcntl
import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from xce_resize_plugin.controllers.observer import Observer
from xce_resize_plugin.core.models import JobState, Task, host_counts
from xce_resize_plugin.journal import Journal
from xce_resize_plugin.recording.format import (
    FORMAT,
    RecordingError,
    RecordingWriter,
    submit_fields,
)

if TYPE_CHECKING:
    from xce_resize_plugin.controllers.live.live_controller import LiveController

log = logging.getLogger(__name__)

__all__ = ["LiveRecorder", "RecordingRefused"]


class RecordingRefused(RecordingError):
    """Recording was asked for but cannot be done; the controller does not start."""

    message = "Cannot record this run"


class LiveRecorder(Observer):
    """Writes one live controller run's recording; create with :meth:`open`."""

    def __init__(self, path: Path, out: IO[str], ctl: LiveController) -> None:
        self.path = path
        self._out: IO[str] | None = out
        self._writer = RecordingWriter(out, flush=True)
        self._ctl = ctl
        #: Whether inputs were written since the last ``cycle`` line: the next settle
        #: must then be replayed after them.
        self._pending = False
        self._journal: Journal | None = None
        self._next_seq = 1

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
        assert self._out is not None, "the header is written right after open()"
        try:
            self._writer.header(
                controller="live",
                hosts=ctl.cfg.hosts,
                config=ctl.config,
                user_slots=ctl.cfg.user_slots,
                protect_reservation=ctl.protect_reservation,
                lean_cycles=ctl.lean_cycles,
                extra={
                    "t": ctl.now(),
                    "task_event_batches": ctl.task_event_batches,
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

    def job_submitted(self, job_id: str, time: float) -> None:
        self.input("submit", **submit_fields(self._ctl._jobs[job_id]))

    def job_started(self, job_id: str, time: float, tasks: tuple[Task, ...]) -> None:
        self._write({"kind": "started", "t": time, "job": job_id, "hosts": host_counts(tasks)})

    def job_ending(self, job_id: str, time: float, state: JobState, reason: str) -> None:
        # Before the controller ends it and tells the plugin: the facts of the end
        # come after this line.
        self.input("end", job=job_id, state=state.value, reason=reason)

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
