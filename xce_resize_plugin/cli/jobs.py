"""``xce-resize submit | jobs | history | kill | modify``: the job commands, over HTTP.

They read ``XCE_CONTROLLER_URL`` and ``XCE_TOKEN`` like ``bresize`` and print LSF's
words where LSF has them (``Job <101> is submitted.``, ``Job <101> is being
terminated``). ``--json`` prints the controller's answer for scripts.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Mapping
from typing import Any, TextIO

from xce_resize_plugin.cli.answers import (
    JobDetail,
    JobList,
    ResizeHistory,
    ResizeView,
    Submitted,
    read,
)
from xce_resize_plugin.cli.argtypes import count, number
from xce_resize_plugin.core.decimal_text import read_decimal
from xce_resize_plugin.errors import UsageError
from xce_resize_plugin.rest.client import Client


def add_parsers(sub: Any) -> None:
    """Register the job commands on the ``xce-resize`` subparsers."""
    _add_submit(sub)
    jobs = sub.add_parser("jobs", help="list jobs, or show one (like bjobs)")
    jobs.add_argument("job", nargs="?")
    jobs.add_argument("--json", action="store_true")

    history = sub.add_parser(
        "history", help="a job's allocation timeline and resize records (like bhist -l)"
    )
    history.add_argument("job")
    history.add_argument("--json", action="store_true")

    kill = sub.add_parser("kill", help="kill a job (like bkill)")
    kill.add_argument("job")

    modify = sub.add_parser(
        "modify",
        help="turn a running job's autoresize on or off (like bmod -ar / -arn)",
        description="xce-resize modify JOB --autoresize | --no-autoresize",
    )
    modify.add_argument("job")
    switch = modify.add_mutually_exclusive_group(required=True)
    switch.add_argument("--autoresize", "-ar", dest="autoresize", action="store_true")
    switch.add_argument("--no-autoresize", "-arn", dest="autoresize", action="store_false")
    modify.add_argument("--json", action="store_true")


def _add_submit(sub: Any) -> None:
    """``xce-resize submit`` (like bsub)."""
    submit = sub.add_parser(
        "submit",
        help="submit a job to a live controller (like bsub)",
        description="Submit a job: xce-resize submit -n 2,8 --resizable -- COMMAND ARGS...",
    )
    # -ar is LSF's bsub -ar (autoresizable), never a short form of --resizable.
    submit.add_argument("-n", dest="tasks", default="1", help="tasks: N or MIN,MAX")
    submit.add_argument("--ptile", type=count, help="at most this many tasks per host")
    submit.add_argument("--resizable", action="store_true", help="the job may be grown and shrunk")
    submit.add_argument(
        "--autoresize",
        "-ar",
        action="store_true",
        help="grow the job toward MAX of -n MIN,MAX whenever slots free up (bsub -ar); "
        "implies --resizable",
    )
    submit.add_argument("--rnc", dest="notify_cmd", help="resize notification command")
    submit.add_argument(
        "--grow-hosts", choices=["prefer-existing", "new-only", "any"], help="where grows go"
    )
    submit.add_argument(
        "--estimate", type=number, metavar="S", help="runtime estimate in seconds (backfilling)"
    )
    submit.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="K=V",
        help="set a variable in the job's environment (repeatable)",
    )
    submit.add_argument(
        "--cwd",
        metavar="DIR",
        help="the tasks' working directory (absolute; default: the current directory, as bsub)",
    )
    submit.add_argument(
        "--alloc",
        action="append",
        default=[],
        metavar="HOST=N",
        help="start at once with N tasks on HOST, bypassing the queue (repeatable; the "
        "first host holds task 0)",
    )
    submit.add_argument(
        "--initial",
        type=count,
        metavar="N",
        help="start with at most N tasks even when more are free (a resizable job that "
        "starts small and grows itself)",
    )
    submit.add_argument(
        "--release-exited",
        action="store_true",
        help="a task other than task 0 that exits on its own leaves the allocation and "
        "stops being charged (needs --resizable)",
    )
    grace_help = "drain time: released tasks run S s more before they stop (max_stop_grace)"
    submit.add_argument("--grace", type=number, metavar="S", help=grace_help)
    submit.add_argument("--json", action="store_true")
    submit.add_argument("argv", nargs=argparse.REMAINDER, help="-- COMMAND ARGS...")


def parse_tasks(text: str) -> dict[str, int]:
    counts = [read_decimal(p.strip()) for p in text.split(",")]
    valid = [c for c in counts if c is not None and c > 0]
    if len(counts) > 2 or len(valid) != len(counts):
        raise UsageError(f"-n takes N or MIN,MAX with positive integers, got {text!r}")
    lo, hi = valid[0], valid[-1]
    if lo > hi:
        raise UsageError(f"-n {text}: MIN is greater than MAX")
    return {"min_tasks": lo, "max_tasks": hi}


def run(args: argparse.Namespace, out: TextIO, client: Client | None = None) -> int:
    client = client or Client.from_env()
    if args.command == "submit":
        return _submit(args, out, client)
    if args.command == "jobs":
        return _jobs(args, out, client)
    if args.command == "history":
        return _history(args, out, client)
    if args.command == "modify":
        return _modify(args, out, client)
    client.call("DELETE", f"/v1/jobs/{_quote(args.job)}")
    out.write(f"Job <{args.job}> is being terminated\n")
    return 0


def _quote(job: str) -> str:
    import urllib.parse

    return urllib.parse.quote(job, safe="")


def _submit(args: argparse.Namespace, out: TextIO, client: Client) -> int:
    argv = list(args.argv)
    if argv and argv[0] == "--":
        argv = argv[1:]
    if not argv:
        raise UsageError("missing the job's command: xce-resize submit [options] -- COMMAND")
    body: dict[str, Any] = {"command": argv, **parse_tasks(args.tasks)}
    if args.autoresize and body["min_tasks"] >= body["max_tasks"]:
        raise UsageError(
            f"--autoresize needs a task range -n MIN,MAX with MIN < MAX, got -n {args.tasks}"
        )
    if args.ptile is not None:
        body["ptile"] = args.ptile
    if args.resizable:
        body["resizable"] = True
    if args.autoresize:
        body["autoresize"] = True
    if args.notify_cmd is not None:
        body["notify_cmd"] = args.notify_cmd
    if args.grow_hosts is not None:
        body["grow_hosts"] = args.grow_hosts
    if args.estimate is not None:
        body["estimate"] = args.estimate
    if args.env:
        body["env"] = dict(_pair("--env", item, str) for item in args.env)
    cwd = args.cwd if args.cwd is not None else _here()
    if cwd is not None:
        body["cwd"] = cwd
    if args.alloc:
        body["alloc"] = dict(_pair("--alloc", item, _count) for item in args.alloc)
    if args.initial is not None:
        body["initial"] = args.initial
    if args.release_exited:
        body["release_exited"] = True
    if args.grace is not None:
        body["grace"] = args.grace
    doc = client.call("POST", "/v1/jobs", body)
    if args.json:
        _dump(doc, out)
    else:
        out.write(f"Job <{shown(read(doc, Submitted).id)}> is submitted.\n")
    return 0


def _modify(args: argparse.Namespace, out: TextIO, client: Client) -> int:
    doc = client.call("PATCH", f"/v1/jobs/{_quote(args.job)}", {"autoresize": args.autoresize})
    if args.json:
        _dump(doc, out)
    else:
        # bmod's words.
        out.write(f"Parameters of job <{args.job}> are being changed\n")
    return 0


def _here() -> str | None:
    """The directory the job is submitted from, where its tasks run unless ``--cwd``
    says otherwise (as ``bsub``'s); ``None`` (the controller's default) when it is
    gone."""
    import os

    try:
        return os.getcwd()
    except OSError:
        return None


def _count(text: str) -> int:
    count = read_decimal(text)
    if count is None or count < 1:
        raise ValueError(text)
    return count


def _pair(option: str, item: str, value: Callable[[str], Any]) -> tuple[str, Any]:
    """``K=V`` of a repeatable option; a usage error names the option and the item."""
    key, sep, text = item.partition("=")
    try:
        if not sep or not key:
            raise ValueError(item)
        return key, value(text)
    except ValueError:
        what = "HOST=N with N a positive integer" if value is _count else "NAME=VALUE"
        raise UsageError(f"{option} takes {what}, got {item!r}") from None


def shown(text: str) -> str:
    """``text`` as a terminal may show it: what it would act on instead (escape
    sequences, carriage returns, newlines that forge lines, bidirectional overrides) is
    written as Python escapes (``\\x1b``). A job's command is its owner's to write, and
    an administrator's terminal shows it."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _hosts(hosts: Mapping[str, int]) -> str:
    return " ".join(f"{h}:{n}" for h, n in hosts.items())


def resize_summary(resize: ResizeView) -> str:
    """One line for a job's resize status (the REST status document): the phase, then
    the pending grow and the change in flight, when there are any."""
    parts = [resize.phase]
    pending = resize.pending
    if pending is not None:
        low, high = pending.min, pending.max
        span = f"{high}" if low == high else f"{low} to {high}"
        what = "autoresize demand" if resize.demand else "pending grow"
        if resize.demand and resize.target is not None:
            what = "target's grow"
        parts.append(f"{what} of {span} task(s)")
    if resize.autoresize:
        parts.append("autoresize on")
    target = resize.target
    if target is not None:
        prefer = ",".join(str(i) for i in target.release_prefer)
        parts.append(
            f"target {target.tasks} task(s)" + (f" (release {prefer} first)" if prefer else "")
        )
    in_flight = resize.in_flight
    if in_flight is not None:
        ids = ",".join(str(t.id) for t in in_flight.tasks)
        parts.append(f"{in_flight.kind} in flight (tasks {ids})")
    return "; ".join(parts)


def _jobs(args: argparse.Namespace, out: TextIO, client: Client) -> int:
    if args.job is not None:
        doc = client.call("GET", f"/v1/jobs/{_quote(args.job)}")
        if args.json:
            _dump(doc, out)
            return 0
        _show_job(read(doc, JobDetail), out)
        return 0
    docs = client.call("GET", "/v1/jobs")
    if args.json:
        _dump(docs, out)
        return 0
    # A bare list is what controllers before the JobList object answered.
    listed = read({"jobs": docs} if isinstance(docs, list) else docs, JobList)
    out.write(f"{'JOBID':<8} {'USER':<10} {'STAT':<5} {'TASKS':>5} {'AUTO':<6} EXEC_HOSTS\n")
    for job in listed.jobs:
        ntasks = sum(job.hosts.values())
        out.write(
            f"{shown(job.id):<8} {shown(job.user):<10} {shown(job.state):<5} {ntasks:>5} "
            f"{_auto(job.resize):<6} {shown(_hosts(job.hosts))}\n"
        )
    return 0


def _show_job(job: JobDetail, out: TextIO) -> None:
    """What ``jobs JOB`` shows, in this order (``--json`` has everything); the fields
    the answer has."""
    rows: list[tuple[str, object]] = [
        ("id", job.id),
        ("user", job.user),
        ("state", job.state),
        # Why it ended (or is ending): "" while it runs.
        ("reason", job.exit_reason or None),
        ("command", None if job.command is None else " ".join(job.command)),
        ("min_tasks", job.min_tasks),
        ("max_tasks", job.max_tasks),
        ("version", job.version),
        ("hosts", None if job.hosts is None else _hosts(job.hosts)),
        ("logs", job.logs),
        ("hostfile", job.hostfile),
        # Only for a job a host failure put back in the queue (a site's policy).
        ("requeues", job.requeues or None),
    ]
    for key, value in rows:
        if value is not None:
            out.write(f"{key:>10}: {shown(str(value))}\n")
    if job.resize is not None:
        out.write(f"{'resize':>10}: {shown(resize_summary(job.resize))}\n")


def _auto(resize: ResizeView | None) -> str:
    """The AUTO column: ``-`` (no autoresize), ``on`` (no demand now: at MAX, or a
    change in flight), or the demand, ``+1-3`` (1 to 3 more tasks); ``=4`` for a job
    with a target size of 4 tasks."""
    if resize is not None and resize.target is not None:
        return f"={resize.target.tasks}"  # a target size (xce-resize target)
    if resize is None or not resize.autoresize:
        return "-"
    demand = resize.demand
    return "on" if demand is None else f"+{demand.min}-{demand.max}"


def _history(args: argparse.Namespace, out: TextIO, client: Client) -> int:
    doc = client.call("GET", f"/v1/jobs/{_quote(args.job)}/resize/history")
    if args.json:
        _dump(doc, out)
        return 0
    history = read(doc, ResizeHistory)
    segments = history.segments
    if history.autoresize:
        demand = history.demand
        more = (
            f"demand of {demand.min} to {demand.max} more task(s)"
            if demand is not None
            else "no demand now"
        )
        out.write(f"Job <{args.job}>: autoresize on, {more}\n")
    # Times relative to the job's start read better than raw clock values.
    t0 = segments[0].start if segments else 0.0
    out.write(f"Job <{args.job}>: {history.slot_seconds:g} slot-seconds\n")
    out.write("  allocation timeline (charged slots, seconds from the job's start):\n")
    for seg in segments:
        out.write(f"    +{seg.start - t0:>10.3f} .. +{seg.end - t0:>10.3f}  {seg.slots:>4} slots\n")
    if history.records:
        out.write("  resize records (JOB_RESIZE):\n")
    for rec in history.records:
        before = sum(rec.before.values())
        after = sum(rec.after.values())
        delta = " ".join(f"{h} {n}" for h, n in rec.delta.items())
        out.write(
            f"    +{rec.time - t0:.3f}s {shown(rec.type):<6} {before} -> {after} tasks "
            f"(delta {shown(delta)}), allocation v{rec.version}\n"
        )
    return 0


def _dump(doc: Any, out: TextIO) -> None:
    json.dump(doc, out, indent=2)
    out.write("\n")
