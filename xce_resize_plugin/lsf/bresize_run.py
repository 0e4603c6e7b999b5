"""One ``bresize`` command line, executed with a given transport.

Exit 0 on success, 2 on a usage error (without contacting the controller), 255 when the
controller rejects the request, with LSF's message. The transport is an argument
(:data:`Sender`): the ``bresize`` command sends HTTP to ``XCE_CONTROLLER_URL``
(:mod:`xce_resize_plugin.cli.bresize`); scenario files run the very same logic in
process (:mod:`xce_resize_plugin.scenarios.runner`).

Standard library only on this path, so that the command starts fast.
"""

from __future__ import annotations

from xce_resize_plugin import __version__
from xce_resize_plugin.errors import ResizeError, UsageError
from xce_resize_plugin.lsf.bresize_args import USAGE, Command, parse
from xce_resize_plugin.lsf.lean import NamedTuple

TYPE_CHECKING = False  # typing is not imported on this path (see lsf/lean.py)
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from typing import TypeAlias

    #: Sends a parsed command to the controller; raises ResizeError when it is rejected.
    Sender: TypeAlias = Callable[[Command], None]

EXIT_OK, EXIT_USAGE, EXIT_REJECTED = 0, 2, 255


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
            from xce_resize_plugin.core.releasespec import parse_release_spec

            parse_release_spec(cmd.spec)
        send(cmd)
    except ResizeError as exc:
        return Outcome(EXIT_REJECTED, exc.code, exc.text)
    return Outcome(EXIT_OK, None, "", success_text(cmd))
