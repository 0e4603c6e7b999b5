"""``bresize``: the IBM Spectrum LSF resize command, talking to the controller.

Exit 0 on success, 2 on a usage error (without contacting the controller), 255 when the
controller rejects the request, with LSF's message on stderr. The command logic
(:func:`run`) takes the transport as an argument: the real command sends HTTP to
``XCE_CONTROLLER_URL``; scenario files run the very same logic in process.

Standard library only on this path, so that the command starts fast; even urllib and
json are imported only when a request is really sent (``-h``/``-V`` never need them).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from . import __version__
from .bresize_args import USAGE, Command, parse
from .errors import ResizeError, UsageError

EXIT_OK, EXIT_USAGE, EXIT_REJECTED = 0, 2, 255

#: Sends a parsed command to the controller; raises ResizeError when it is rejected.
Sender = Callable[[Command], None]


class Outcome(NamedTuple):
    """What one bresize invocation printed and returned."""

    exit: int
    code: str | None
    message: str
    stdout: str = ""


def success_text(cmd: Command) -> str:
    """The line printed on success (LSF documents none; these follow bsub's style)."""
    if cmd.op == "request":
        return f"Resize request of job <{cmd.job_id}> is submitted."
    if cmd.op == "release":
        return f"Release request of job <{cmd.job_id}> is accepted."
    return f"Pending resize request of job <{cmd.job_id}> is cancelled."


def run(argv: Sequence[str], send: Sender) -> Outcome:
    """Parse and execute one bresize command line with the given transport."""
    try:
        cmd = parse(argv)
    except UsageError as exc:
        return Outcome(EXIT_USAGE, exc.code, f"{exc.text}\n{USAGE}".rstrip())
    except ResizeError as exc:  # a bad job id or notify command: LSF rejects these itself
        return Outcome(EXIT_REJECTED, exc.code, exc.text)
    if cmd.op == "help":
        return Outcome(EXIT_OK, None, "", USAGE)
    if cmd.op == "version":
        return Outcome(EXIT_OK, None, "", f"xce_resize_plugin bresize {__version__}")
    try:
        if cmd.op == "release":
            # A malformed release specification never reaches the controller (LSF's
            # own message and code, exit 255 as when the controller refuses it).
            from .releasespec import parse_release_spec

            parse_release_spec(cmd.spec)
        send(cmd)
    except ResizeError as exc:
        return Outcome(EXIT_REJECTED, exc.code, exc.text)
    return Outcome(EXIT_OK, None, "", success_text(cmd))


# --- the HTTP transport ------------------------------------------------------------------


class Unreachable(ResizeError):
    code = "XCE_RESIZE_UNREACHABLE"
    message = "Cannot reach the controller"


class RemoteError(ResizeError):
    """A rejection from the controller, carrying its code and message as they came."""

    def __init__(self, code: str, text: str) -> None:
        self.code = code
        self.remote_text = text
        super().__init__()

    @property
    def text(self) -> str:
        return self.remote_text


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
        return "POST", f"{base}/release", {"spec": " ".join(cmd.spec), **options}
    return "DELETE", f"{base}/pending", None


def http_sender(url: str, token: str | None, timeout: float = 30.0) -> Sender:
    """A sender that talks to the controller's REST API at ``url``."""

    def send(cmd: Command) -> None:
        import json
        import urllib.error
        import urllib.request

        method, path, body = request_body(cmd)
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(url.rstrip("/") + path, data=data, method=method)
        req.add_header("Content-Type", "application/json")
        req.add_header("Accept", "application/json, application/problem+json")
        if token:
            req.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(req, timeout=timeout):
                return
        except urllib.error.HTTPError as exc:
            raise _problem(exc) from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise Unreachable(f"{url}: {reason}") from None

    return send


def _problem(exc: Any) -> ResizeError:
    import json

    try:
        doc = json.loads(exc.read() or b"{}")
    except ValueError:
        doc = {}
    code = doc.get("code") if isinstance(doc, dict) else None
    text = doc.get("detail") if isinstance(doc, dict) else None
    return RemoteError(str(code or f"HTTP_{exc.code}"), str(text or exc.reason))


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point of ``bresize``."""
    args = list(sys.argv[1:] if argv is None else argv)
    url = os.environ.get("XCE_CONTROLLER_URL", "http://127.0.0.1:6820")
    token = os.environ.get("XCE_TOKEN") or os.environ.get("XCE_JOB_TOKEN")
    outcome = run(args, http_sender(url, token))
    if outcome.stdout:
        print(outcome.stdout)
    if outcome.message:
        print(outcome.message, file=sys.stderr)
    return outcome.exit


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
