"""A scenario run as a readable timeline: commands, resize facts, jobs, accounting.

The resize steps are read back from the plugin's journal after the run, so the timeline
shows what was made durable, not what the runner believes happened.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from xce_resize_plugin.core.facts import (
    AutoresizeSet,
    Committed,
    DrainEnded,
    Fact,
    GrowCancelled,
    GrowPlaced,
    GrowRequested,
    GrowReverted,
    NotifyDone,
    ReleaseAccepted,
    TargetSet,
    TasksDrained,
    TasksLost,
    TaskStartFailed,
)
from xce_resize_plugin.core.models import Task, format_hosts

if TYPE_CHECKING:
    from xce_resize_plugin.scenarios.result import ScenarioResult

_CANCEL_REASONS = {
    "cancel": "cancelled",
    "replaced": "replaced by a new request (-c)",
    "job-ended": "cancelled: the job ended",
    "release": "withdrawn for the release (autoresize demand)",
    "autoresize-off": "withdrawn: autoresize turned off",
}


def _ids(tasks: Iterable[Task]) -> str:
    ids = sorted(t.id for t in tasks)
    if ids and ids == list(range(ids[0], ids[-1] + 1)) and len(ids) > 2:
        return f"tasks {ids[0]}-{ids[-1]}"
    return "task" + ("s " if len(ids) != 1 else " ") + ",".join(map(str, ids))


def _size(fact: GrowRequested) -> str:
    if fact.min_add == fact.max_add:
        return f"{fact.min_add}"
    return f"{fact.min_add}..{fact.max_add}"


#: The one line each kind of fact gets (after ``job N: ``); a notification's outcome,
#: with its output and what it rolled back, is :func:`_notify_lines`.
_ONE_LINE: dict[type[Any], Callable[[Any], str]] = {
    GrowRequested: lambda f: (
        f"{'target' if f.principal == 'target' else 'autoresize'} demand of {_size(f)} "
        "tasks pending"
        if f.auto
        else f"grow of {_size(f)} tasks pending"
    ),
    TargetSet: lambda f: (
        f"target cleared ({f.reason})"
        if f.target is None
        else f"target {f.target.tasks} tasks"
        + (
            f", release {','.join(map(str, f.target.release_prefer))} first"
            if f.target.release_prefer
            else ""
        )
    ),
    AutoresizeSet: lambda f: f"autoresize {'on' if f.enabled else 'off'} ({f.reason})",
    GrowCancelled: lambda f: f"pending grow {_CANCEL_REASONS.get(f.reason, f.reason)}",
    GrowPlaced: lambda f: f"placed, slots reserved: {format_hosts(f.tasks)} ({_ids(f.tasks)})",
    ReleaseAccepted: lambda f: f"release accepted: {format_hosts(f.tasks)} ({_ids(f.tasks)})",
    TaskStartFailed: lambda f: f"task {f.task_id} failed to start ({f.reason}); slot freed",
    GrowReverted: lambda f: "no task started; grow back to pending",
    Committed: lambda f: f"committed allocation v{f.version}",
    TasksLost: lambda f: (
        f"host {f.host} failed: lost {format_hosts(f.tasks)} ({_ids(f.tasks)}); slots freed"
    ),
    TasksDrained: lambda f: f"{_ids(Task(i, '') for i in f.task_ids)} drained (acknowledged)",
    DrainEnded: lambda f: f"drain over ({f.reason}): stopping the released tasks",
}


#: Lines of a notification's output the timeline shows; ``--json`` has all of it.
OUTPUT_LINES = 5


def _output_lines(out: str) -> list[str]:
    """A notification's output as timeline lines: the first :data:`OUTPUT_LINES`, and
    how many more there are (never cut silently)."""
    lines = out.splitlines()
    shown = [f"    | {text}" for text in lines[:OUTPUT_LINES]]
    if len(lines) > OUTPUT_LINES:
        shown.append(f"    | ... ({len(lines) - OUTPUT_LINES} more lines: see --json)")
    return shown


def _notify_lines(
    job: str, fact: NotifyDone, notes: Mapping[tuple[str, int], Mapping[str, Any]]
) -> list[str]:
    note = notes.get((fact.job_id, fact.attempt), {})
    out = (note.get("stdout") or "").strip()
    verdict = "OK" if fact.ok else f"FAIL ({fact.reason})"
    lines = [f"{job}: notification (attempt {fact.attempt}) on {note.get('host', '?')}: {verdict}"]
    lines += _output_lines(out)
    if not fact.ok:
        lines.append(f"{job}: change rolled back" + ("; grow given up" if fact.gave_up else ""))
    return lines


def _fact_lines(fact: Fact, notes: Mapping[tuple[str, int], Mapping[str, Any]]) -> list[str]:
    job = f"job {fact.job_id}"
    if isinstance(fact, NotifyDone):
        return _notify_lines(job, fact, notes)
    if isinstance(fact, TasksLost) and fact.attempt:
        note = notes.get((fact.job_id, fact.attempt), {})
        status = note.get("status")
        out = (note.get("stdout") or "").strip()
        return [
            f"{job}: {_ONE_LINE[TasksLost](fact)}",
            f"{job}: notification (attempt {fact.attempt}, for information) on "
            f"{note.get('host', '?')}: exit {status}",
            *_output_lines(out),
        ]
    line = _ONE_LINE.get(type(fact))
    return [f"{job}: {line(fact)}"] if line is not None else []


def _rest_line(body: Mapping[str, Any] | None) -> str:
    """A ``resize`` command; a ``modify`` one as the command a user would type."""
    if body is not None and body.get("op") == "modify":
        switch = "--autoresize" if body.get("autoresize") else "--no-autoresize"
        return f"xce-resize modify {shlex.quote(str(body.get('job')))} {switch}"
    if body is not None and body.get("op") == "target":
        job = shlex.quote(str(body.get("job")))
        if body.get("clear"):
            return f"xce-resize target {job} --clear"
        prefer = ",".join(map(str, body.get("release_prefer", ())))
        return f"xce-resize target {job} {body.get('tasks')}" + (
            f" --prefer {prefer}" if prefer else ""
        )
    return f"REST {body}"


def render(result: ScenarioResult) -> str:
    # Sorted by time, then by journal sequence: a command sits after the facts that
    # were durable before it ran; job starts and ends come first at their instant
    # (a job end is what frees the slots a grow is then placed on).
    events: list[tuple[float, float, int, list[str]]] = []

    def add(t: float, lines: list[str], seq: float = -1.0) -> None:
        if lines:
            events.append((t, seq, len(events), lines))

    for job_id, job in result.jobs.items():
        if job["start_time"] is not None:
            first = result.scenario.jobs
            user = job["user"]
            spec = next((j for j in first if j.id == job_id), None)
            alloc = " ".join(f"{h} {n}" for h, n in _initial(result, job_id, job).items())
            kind = "" if spec is None or not spec.resizable else " (resizable)"
            kind = " (autoresizable)" if spec is not None and spec.autoresize else kind
            add(job["start_time"], [f"job {job_id} ({user}){kind} starts on {alloc}"])
    for c in result.commands:
        if c.host is not None:
            verb = {"down": "down", "up": "up", "closed": "close", "open": "open"}[c.host.state]
            flag = " --evacuate" if c.host.evacuate else ""
            cmd = f"xce-resize host {verb}{flag} {c.host.name}"
        elif c.argv is not None:
            cmd = "bresize " + " ".join(shlex.quote(a) for a in c.argv)
        else:
            cmd = _rest_line(c.resize)
        lines = [f"{c.user}$ {cmd}"]
        if c.output:
            lines.append(f"    {c.output}")
        if c.message:
            lines.append(f"    {c.message.splitlines()[0]}  (exit {c.exit}, {c.code})")
        add(c.at, lines, c.seq + 0.5)
    notes = {(n["job"], n["attempt"]): n for n in result.notifications}
    for seq, fact in result.facts:
        lines = _fact_lines(fact, notes)
        if isinstance(fact, Committed):
            rec = _record(result, fact.job_id, fact.version)
            if rec is not None:
                lines = [
                    f"job {fact.job_id}: {rec['type']} committed: now "
                    + " ".join(f"{h} {n}" for h, n in rec["after"].items())
                    + f" ({sum(rec['after'].values())} tasks, allocation v{fact.version})"
                ]
        add(fact.at, lines, seq)
    for t, job_id, reason in result.rejected:
        add(t, [f"job {job_id} refused on arrival: {reason}"])
    for job_id, job in result.jobs.items():
        if job["end_time"] is not None:
            why = f": {job['exit_reason']}" if job.get("exit_reason") else ""
            add(job["end_time"], [f"job {job_id} ends ({job['state']}{why})"])

    out = [f"Scenario {result.scenario.path.name}\n"]
    for t, _, _, lines in sorted(events):
        out.append(f"t={t:>7g}s  {lines[0]}\n")
        out.extend(f"{'':11}{line}\n" for line in lines[1:])
    out.append("\nAccounting (charged slots over time, like bhist -l):\n")
    for job_id, job in result.jobs.items():
        out.append(
            f"  job {job_id} ({job['user']}, {job['state']}): "
            f"{job['slot_seconds']:g} slot-seconds\n"
        )
        for rec in job["resize_records"]:
            before = sum(rec["before"].values())
            after = sum(rec["after"].values())
            out.append(
                f"    JOB_RESIZE t={rec['time']:g}s {rec['type']:<6} {before} -> {after} tasks "
                f"(delta {format_hosts_map(rec['delta'])})"
                + (f" reason {rec['reason']}" if rec.get("reason") else "")
                + "\n"
            )
    if result.problems:
        out.append("\nINVARIANT PROBLEMS:\n" + "".join(f"  {p}\n" for p in result.problems))
    return "".join(out)


def format_hosts_map(hosts: dict[str, int]) -> str:
    return " ".join(f"{h} {n}" for h, n in hosts.items())


def _record(result: ScenarioResult, job_id: str, version: int) -> dict[str, Any] | None:
    for rec in result.jobs.get(job_id, {}).get("resize_records", []):
        if rec["version"] == version:
            return dict(rec)
    return None


def _initial(result: ScenarioResult, job_id: str, job: Any) -> dict[str, int]:
    records = job["resize_records"]
    if records:
        return dict(records[0]["before"])
    return dict(job["hosts"])
