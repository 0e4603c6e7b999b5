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

from xce_resize_plugin.cli.streams import to_devnull
from xce_resize_plugin.lsf.bresize_args import Command
from xce_resize_plugin.lsf.bresize_run import run
from xce_resize_plugin.rest.client import Client

TYPE_CHECKING = False  # typing is not imported on this path (see lsf/lean.py)
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any, TextIO

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
    for text, stream in ((outcome.stdout, sys.stdout), (outcome.message, sys.stderr)):
        if text and not _write(text, stream):
            return 128 + 13
    return outcome.exit


def _write(text: str, stream: TextIO | None) -> bool:
    """Print ``text`` on ``stream``; False when its reader went away (a closed pipe).

    Either stream: ``bresize ... 2>&1 | head -0`` loses a rejection's message as
    ``bresize -h | head -0`` loses the usage, and both end with the status of a C
    command killed by SIGPIPE (docs/user-guide.md, "What bresize prints"), never
    with a status a script does not expect.
    """
    if stream is None:
        # Started with the descriptor closed (2>&-): nothing to write to, as for a C
        # command. print() would write to stdout instead, where scripts read answers.
        return True
    try:
        print(text, file=stream)
        stream.flush()  # a closed pipe shows here, not at exit
    except BrokenPipeError:
        # Quiet, as such a C command. Python flushes the stream again at exit.
        to_devnull(stream)
        return False
    except OSError as exc:
        # A full disk, an I/O error: said once on the other stream, and the status
        # stays the request's (an accepted request was recorded: a script that took a
        # failed write for a failed request would ask again). docs/user-guide.md.
        to_devnull(stream)
        other = sys.stderr if stream is sys.stdout else None
        if other is not None:
            import contextlib

            with contextlib.suppress(OSError):  # nowhere left to say it
                print(f"bresize: standard output: cannot write ({exc.strerror or exc})", file=other)
                other.flush()
    return True


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
