"""``xce-resize hosts`` and ``xce-resize host close|open|down|up``: the hosts of a live
controller, an administrator's drain (like LSF's ``bhosts`` and ``badmin
hclose|hopen``), and fencing a host by hand (``down``: a host failure now; ``up``: it
takes tasks again once its agent is registered)."""

from __future__ import annotations

import argparse
import json
import urllib.parse
from collections.abc import Sequence
from typing import Any, TextIO

from xce_resize_plugin.cli.answers import HostChange, HostList, HostRow, read
from xce_resize_plugin.cli.jobs import shown
from xce_resize_plugin.rest.client import Client


def add_parsers(sub: Any) -> None:
    """Register ``hosts`` and ``host`` on the ``xce-resize`` subparsers."""
    hosts = sub.add_parser("hosts", help="each host's state, slots, use and jobs (like bhosts)")
    hosts.add_argument("--json", action="store_true")
    host = sub.add_parser(
        "host",
        help="close a host to new tasks or open it again, or fence it by hand (down/up; "
        "administrators; like badmin hclose)",
        description="xce-resize host close [--evacuate] HOST | xce-resize host open HOST | "
        "xce-resize host down HOST | xce-resize host up HOST",
    )
    host.add_argument("action", choices=["close", "open", "down", "up"])
    host.add_argument("name", metavar="HOST")
    host.add_argument(
        "--evacuate",
        action="store_true",
        help="with close: ask resizable jobs there to release their tasks on the host",
    )
    host.add_argument("--json", action="store_true")


def run(args: argparse.Namespace, out: TextIO, client: Client | None = None) -> int:
    client = client or Client.from_env()
    if args.command == "hosts":
        doc = client.call("GET", "/v1/hosts")
        if args.json:
            out.write(json.dumps(doc, indent=2) + "\n")
        else:
            out.write(render_hosts(read(doc, HostList).hosts))
        return 0
    if args.evacuate and args.action != "close":
        from xce_resize_plugin.errors import UsageError

        raise UsageError("--evacuate goes with close only")
    body = {"evacuate": True} if args.evacuate else None
    path = f"/v1/hosts/{urllib.parse.quote(args.name, safe='')}/{args.action}"
    doc = client.call("POST", path, body)
    if args.json:
        out.write(json.dumps(doc, indent=2) + "\n")
        return 0
    change = read(doc, HostChange)
    out.write(f"Host <{shown(change.host)}> is {shown(change.state)}\n")
    if args.action == "up" and change.state == "unavail":
        out.write("  it takes tasks again once its agent is registered\n")
    for job, outcome in sorted(change.jobs.items()):
        out.write(f"  job {shown(job)}: {shown(outcome)}\n")
    for job, ids in sorted(change.asked.items()):
        out.write(f"  job {shown(job)}: asked to release task(s) {', '.join(map(str, ids))}\n")
    for job, why in sorted(change.stays.items()):
        out.write(f"  job {shown(job)}: stays ({shown(why)})\n")
    return 0


def render_hosts(hosts: Sequence[HostRow]) -> str:
    """A ``bhosts``-like table: name, state, slots, used, jobs (``job:slots``)."""
    rows = [("HOST_NAME", "STATUS", "MAX", "USED", "JOBS")]
    for h in hosts:
        jobs = " ".join(f"{j}:{n}" for j, n in h.jobs.items()) or "-"
        rows.append((shown(h.name), shown(h.state), str(h.slots), str(h.used), shown(jobs)))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    return "".join(
        "  ".join(c.ljust(w) for c, w in zip(r[:4], widths, strict=True)) + "  " + r[4] + "\n"
        for r in rows
    )
