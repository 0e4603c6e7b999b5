"""``xce-resize target | grow | release``: a job's target size, and the grow and release
that take ``--if-version`` (docs/in-job-api.md, "A target size"), over HTTP.

``bresize`` keeps LSF's grammar and options exactly; these are the plugin's own
additions, on the ``xce-resize`` command line. They read ``XCE_CONTROLLER_URL`` and
``XCE_TOKEN`` like the other client commands; ``--json`` prints the controller's answer.
"""

from __future__ import annotations

import argparse
import json
import urllib.parse
from typing import Any, TextIO

from xce_resize_plugin.cli.answers import ResizeView, read
from xce_resize_plugin.cli.argtypes import count, number
from xce_resize_plugin.cli.jobs import resize_summary
from xce_resize_plugin.core.decimal_text import read_decimal
from xce_resize_plugin.errors import UsageError
from xce_resize_plugin.lsf.bresize_args import parse_counts
from xce_resize_plugin.rest.client import Client

COMMANDS = ("target", "grow", "release")


def add_parsers(sub: Any) -> None:
    """Register ``target``, ``grow`` and ``release`` on the ``xce-resize`` subparsers."""
    target = sub.add_parser(
        "target",
        help="set or clear a running job's target size: the controller grows or "
        "releases until the job holds N tasks",
        description="xce-resize target JOB N [--prefer IDS] | xce-resize target JOB --clear",
    )
    target.add_argument("job")
    target.add_argument("tasks", nargs="?", type=count, metavar="N")
    target.add_argument(
        "--prefer",
        metavar="IDS",
        help="comma-separated task ids to release first when the job is above N",
    )
    target.add_argument("--clear", action="store_true", help="clear the job's target")
    target.add_argument("--json", action="store_true")

    grow = sub.add_parser(
        "grow",
        help="ask for more tasks (bresize request [MIN,]MAX), optionally conditioned "
        "on the allocation version",
        description="xce-resize grow JOB [MIN,]MAX [--if-version V] [-c] [-rnc CMD | -rncn]",
    )
    grow.add_argument("job")
    grow.add_argument("tasks", metavar="[MIN,]MAX")
    _common(grow)

    release = sub.add_parser(
        "release",
        help="give tasks back (bresize release), optionally conditioned on the allocation version",
        description="xce-resize release JOB (--task-ids IDS | --count N | --spec SPEC) "
        "[--if-version V] [-c] [-rnc CMD | -rncn] [--grace S]",
    )
    release.add_argument("job")
    form = release.add_mutually_exclusive_group(required=True)
    form.add_argument("--task-ids", metavar="IDS", help="comma-separated task ids")
    form.add_argument("--count", type=count, metavar="N", help="N tasks the site policy picks")
    form.add_argument("--spec", help="an LSF release specification, e.g. 'all ~hostA'")
    release.add_argument(
        "--grace",
        type=number,
        metavar="S",
        help="drain time: the released tasks run S s more before they stop (max_stop_grace)",
    )
    _common(release)


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--if-version",
        type=count,
        metavar="V",
        help="refuse (XCE_RESIZE_VERSION_CHANGED) unless the allocation is at version V",
    )
    parser.add_argument(
        "-c", dest="cancel_pending", action="store_true", help="cancel the pending grow first"
    )
    # As bresize's (LSF's) options: the change's notification command, or none.
    notify = parser.add_mutually_exclusive_group()
    notify.add_argument(
        "-rnc", dest="notify_cmd", metavar="CMD", help="the notification command for this change"
    )
    notify.add_argument(
        "-rncn", dest="no_notify", action="store_true", help="run no notification command"
    )
    parser.add_argument("--json", action="store_true")


def _ids(option: str, text: str) -> list[int]:
    # ASCII digits only, as every count of ours: int() also reads " 7", "1_0" and
    # other scripts' digits.
    ids = [read_decimal(part) for part in text.split(",")]
    if any(i is None for i in ids):
        raise UsageError(f"{option} takes comma-separated task ids (0 or more), got {text!r}")
    return [i for i in ids if i is not None]


def _range(text: str) -> dict[str, int]:
    """``[MIN,]MAX`` as ``bresize request`` reads it (its messages; exit 2 for MIN >
    MAX, which the controller would refuse as 667 otherwise)."""
    min_add, max_add = parse_counts(text)
    return {"min_tasks": min_add, "tasks": max_add}


def run(args: argparse.Namespace, out: TextIO, client: Client | None = None) -> int:
    client = client or Client.from_env()
    base = f"/v1/jobs/{urllib.parse.quote(args.job, safe='')}/resize"
    if args.command == "target":
        doc = _target(args, client, base)
    else:
        body: dict[str, Any] = _range(args.tasks) if args.command == "grow" else _release_form(args)
        body["cancel_pending"] = args.cancel_pending
        if args.if_version is not None:
            body["if_version"] = args.if_version
        if args.notify_cmd is not None:
            body["notify_cmd"] = args.notify_cmd
        if args.no_notify:
            body["no_notify"] = True
        if getattr(args, "grace", None) is not None:
            body["grace"] = args.grace
        doc = client.call("POST", f"{base}/{args.command}", body)
    if args.json:
        out.write(json.dumps(doc, indent=2) + "\n")
        return 0
    status = read(doc, ResizeView)
    aim = "no target" if status.target is None else f"target {status.target.tasks} task(s)"
    out.write(f"Job <{args.job}>: {len(status.tasks)} task(s), {aim}; {resize_summary(status)}\n")
    return 0


def _target(args: argparse.Namespace, client: Client, base: str) -> Any:
    if args.clear:
        if args.tasks is not None or args.prefer is not None:
            raise UsageError("--clear takes no N and no --prefer")
        return client.call("DELETE", f"{base}/target")
    if args.tasks is None:
        raise UsageError("give the target N, or --clear")
    body: dict[str, Any] = {"tasks": args.tasks}
    if args.prefer is not None:
        body["release_prefer"] = _ids("--prefer", args.prefer)
    return client.call("PUT", f"{base}/target", body)


def _release_form(args: argparse.Namespace) -> dict[str, Any]:
    if args.task_ids is not None:
        return {"task_ids": _ids("--task-ids", args.task_ids)}
    if args.count is not None:
        return {"count": args.count}
    return {"spec": args.spec}
