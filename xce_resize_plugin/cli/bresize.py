"""``bresize``: the IBM Spectrum LSF resize command, talking to the controller.

Exit 0 on success, 2 on a usage error (without contacting the controller), 255 when the
controller rejects the request, with LSF's message on stderr. The command logic
(:func:`xce_resize_plugin.lsf.bresize_run.run`) takes the transport as an argument: this
module is the HTTP transport to ``XCE_CONTROLLER_URL`` and the entry point; scenario
files run the very same logic in process.

Standard library only on this path, so that the command starts fast; even urllib and
json are imported only when a request is really sent (``-h``/``-V`` never need them).
"""

from __future__ import annotations

import sys

from xce_resize_plugin.lsf.bresize_args import Command
from xce_resize_plugin.lsf.bresize_run import run
from xce_resize_plugin.rest.client import Client

TYPE_CHECKING = False  # typing is not imported on this path (see lsf/lean.py)
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any

    from xce_resize_plugin.lsf.bresize_run import Sender


# --- the HTTP transport ------------------------------------------------------------------


def request_body(cmd: Command) -> tuple[str, str, dict[str, Any] | None]:
    """HTTP method, path and JSON body for a command (the REST API's resize fields)."""
    import urllib.parse

    job = urllib.parse.quote(cmd.job_id, safe="")
    base = f"/v1/jobs/{job}/resize"
    options: dict[str, Any] = {"cancel_pending": cmd.cancel_pending, "no_notify": cmd.no_notify}
    if cmd.notify_cmd is not None:
        options["notify_cmd"] = cmd.notify_cmd
    if cmd.op == "request":
        return "POST", f"{base}/grow", {"tasks": cmd.max_add, "min_tasks": cmd.min_add, **options}
    if cmd.op == "release":
        if cmd.grace is not None:
            options["grace"] = cmd.grace
        return "POST", f"{base}/release", {"spec": " ".join(cmd.spec), **options}
    return "DELETE", f"{base}/pending", None


def http_sender(client: Client) -> Sender:
    """A sender that talks to the controller's REST API."""

    def send(cmd: Command) -> None:
        method, path, body = request_body(cmd)
        client.call(method, path, body)

    return send


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point of ``bresize``."""
    args = list(sys.argv[1:] if argv is None else argv)
    outcome = run(args, http_sender(Client.from_env()))
    try:
        if outcome.stdout:
            print(outcome.stdout)
            sys.stdout.flush()  # a closed pipe shows here, not at exit
    except BrokenPipeError:
        import os

        # As a C command killed by SIGPIPE: quiet. Python flushes stdout again at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + 13
    if outcome.message:
        print(outcome.message, file=sys.stderr)
    return outcome.exit


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
