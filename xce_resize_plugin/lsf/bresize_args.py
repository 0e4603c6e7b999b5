"""The ``bresize`` command-line grammar (IBM Spectrum LSF syntax), parsed by hand.

Standard library only, plus :mod:`xce_resize_plugin.errors`: ``bresize`` must start fast,
so attrs, cattrs, pluggy, lmdb and the models are not imported here at module level
(:func:`to_request` imports the models when it is called). argparse is not used either:
LSF's grammar (options only between the subcommand and the positionals, ``-rnc`` vs
``-rncn``, a release specification of any number of arguments followed by exactly one
job ID) does not fit it, and its error messages are not LSF's.

Synopsis (:data:`USAGE`)::

    bresize release [-c] [-rnc resize_notification_cmd | -rncn]
                    released_host_specification job_ID
    bresize request [-c] [-rnc resize_notification_cmd | -rncn] [min_task,]tasks job_ID
    bresize cancel job_ID
    bresize [-h | -V]

Errors, checked in this order (the first one wins):

- :class:`~xce_resize_plugin.errors.UsageError` for anything the synopsis does not
  allow, with a one-line reason (unknown subcommand or option, an option repeated or
  after a positional, ``-rnc`` with ``-rncn``, a missing or extra argument, a task
  count that is not a positive integer up to 2**31 - 1, min_task > tasks, ``-h``/``-V``
  not alone). The command exits 2 on these.
- :class:`~xce_resize_plugin.errors.NotifyCmdTooLong` for a ``-rnc`` command of 4096
  bytes or more in UTF-8 (LSF: "must be less than 4096").
- :class:`~xce_resize_plugin.errors.BadJobId` for a job ID that is not ``N`` or
  ``N[i]`` with positive decimal N and i. The ID is normalised (``007`` is ``7``) so
  it names the job the way the controller does.

The release specification itself is only split into tokens here; its grammar is checked
by :func:`xce_resize_plugin.core.releasespec.parse_release_spec`, which :func:`to_request`
calls so that ``bresize`` rejects a bad spec before contacting the controller.
"""

from __future__ import annotations

from xce_resize_plugin.errors import BadJobId, NotifyCmdTooLong, UsageError
from xce_resize_plugin.lsf.lean import NamedTuple

TYPE_CHECKING = False  # typing is not imported on this path (see lsf/lean.py)
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Literal, TypeAlias, TypedDict

    from xce_resize_plugin.core.models import CancelRequest, GrowRequest, ReleaseRequest

    Op: TypeAlias = Literal["request", "release", "cancel", "help", "version"]

    class _ChangeFields(TypedDict):
        cancel_pending: bool
        notify_cmd: str | None
        no_notify: bool


__all__ = [
    "MAX_NOTIFY_BYTES",
    "MAX_TASKS",
    "USAGE",
    "Command",
    "parse",
    "parse_counts",
    "parse_job_id",
    "to_argv",
    "to_request",
]

USAGE = """\
Usage: bresize release [-c] [-rnc resize_notification_cmd | -rncn] [--grace S]
                       released_host_specification job_ID
       bresize request [-c] [-rnc resize_notification_cmd | -rncn]
                       [min_task,]tasks job_ID
       bresize cancel job_ID
       bresize [-h | -V]

released_host_specification: all [~host | ~N*host ...] | host | N*host [host | N*host ...]
--grace S (an XCE extension): let the released tasks drain S seconds before they stop
"""

#: A notification command must be shorter than this many bytes (UTF-8), as in LSF.
MAX_NOTIFY_BYTES = 4096

#: Largest task count: LSF keeps counts in a C ``int``. The bound also keeps ``int()``
#: away from digit strings long enough to be slow or refused.
MAX_TASKS = 2**31 - 1

_SUBCOMMANDS = ("request", "release", "cancel")
_HELP = frozenset({"-h", "--help"})
_VERSION = frozenset({"-V", "--version"})
# Patterns are compiled on first use (re caches them), and re itself is imported only
# by the functions that match (a third of the start-up budget; bresize -h and -V need
# none). (?a), ASCII: int() accepts other scripts' digits, the controller would not.
_COUNTS = r"(?a)([0-9]+)(?:,([0-9]+))?"
_JOB_ID = r"(?a)([0-9]+)(?:\[([0-9]+)\])?"
# A token such as "-1" or "-2*hostA" is a (wrong) positional, not an unknown option:
# letting it through gives the user the count or spec error that actually applies.
_DIGITS = frozenset("0123456789")
# Job IDs and array indices longer than this are certainly not real jobs.
_MAX_ID_DIGITS = 20


class Command(NamedTuple):
    """One parsed ``bresize`` invocation.

    ``op`` is the subcommand, or ``help``/``version`` for ``-h``/``-V``. ``job_id`` is
    the normalised job ID (``221[3]`` for an array element). ``min_add``/``max_add``
    are the request's ``[min_task,]tasks`` (``4`` gives 4 and 4). ``spec`` holds the
    release specification's whitespace-separated tokens. ``cancel_pending`` is ``-c``,
    ``notify_cmd`` the ``-rnc`` command, ``no_notify`` is ``-rncn``. ``grace`` is the
    release's drain time, ``--grace S`` (an XCE extension; ``None``: the job's default).
    """

    op: Op
    job_id: str = ""
    min_add: int | None = None
    max_add: int | None = None
    spec: tuple[str, ...] = ()
    cancel_pending: bool = False
    notify_cmd: str | None = None
    no_notify: bool = False
    grace: float | None = None


def parse(argv: Sequence[str]) -> Command:
    """Parse ``bresize``'s arguments (without the program name) into a :class:`Command`.

    Raises UsageError, NotifyCmdTooLong or BadJobId as described in the module
    docstring; nothing else for any list of strings.
    """
    args = list(argv)
    if not args:
        raise UsageError("missing subcommand (request, release or cancel)")
    first = args[0]
    if first in _HELP or first in _VERSION:
        if len(args) > 1:
            raise UsageError(f"-h/-V stand alone: got {args[1]!r} after {first}")
        return Command(op="help" if first in _HELP else "version")
    if first not in _SUBCOMMANDS:
        if first.startswith("-"):
            raise UsageError(f"options come after the subcommand: got {first!r} first")
        raise UsageError(f"unknown subcommand {first!r} (request, release or cancel)")
    if first == "cancel":
        return _parse_cancel(args[1:])
    return _parse_resize("request" if first == "request" else "release", args[1:])


def _parse_cancel(args: list[str]) -> Command:
    if not args:
        raise UsageError("missing job ID")
    option = next((a for a in args if _is_option(a)), None)
    if option is not None:
        if option in _HELP or option in _VERSION:
            raise UsageError(f"-h/-V stand alone: got {option} after cancel")
        raise UsageError(f"bresize cancel takes no options: got {option!r}")
    if len(args) > 1:
        raise UsageError(f"bresize cancel takes one job ID: got {' '.join(args)!r}")
    return Command(op="cancel", job_id=parse_job_id(args[0]))


def _parse_resize(op: Literal["request", "release"], args: list[str]) -> Command:
    cmd, positionals = _parse_options(Command(op=op), args)
    if op == "request":
        min_add, max_add, job_text = _request_positionals(positionals)
        cmd = cmd._replace(min_add=min_add, max_add=max_add)
    else:
        spec, job_text = _release_positionals(positionals)
        cmd = cmd._replace(spec=spec)
    if cmd.notify_cmd is not None:
        size = _utf8_len(cmd.notify_cmd)
        if size >= MAX_NOTIFY_BYTES:
            raise NotifyCmdTooLong(f"-rnc command is {size} bytes")
        if not cmd.notify_cmd.isascii() and not _is_text(cmd.notify_cmd):
            # Bytes that are not UTF-8 (argv keeps them as lone surrogates): JSON cannot
            # carry them to the controller, which would refuse a "lone surrogate".
            raise UsageError("-rnc: the command is not UTF-8 text (check the terminal's locale)")
    return cmd._replace(job_id=parse_job_id(job_text))


def _is_text(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _parse_options(cmd: Command, args: list[str]) -> tuple[Command, list[str]]:
    """The options of ``cmd.op``, from just after the subcommand up to the first
    positional (or ``--``), set on ``cmd``; and the positionals."""
    op = cmd.op
    i = 0
    dashdash = False
    while i < len(args) and _is_option(args[i]):
        option = args[i]
        i += 1
        if option == "--":
            dashdash = True
            break
        if option == "-c":
            if cmd.cancel_pending:
                raise UsageError("-c given more than once")
            cmd = cmd._replace(cancel_pending=True)
        elif option == "-rnc":
            if cmd.notify_cmd is not None:
                raise UsageError("-rnc given more than once")
            if cmd.no_notify:
                raise UsageError("-rnc and -rncn are mutually exclusive")
            if i >= len(args) or not args[i].strip():
                raise UsageError("-rnc needs a command")
            cmd = cmd._replace(notify_cmd=args[i])
            i += 1
        elif option == "-rncn":
            if cmd.no_notify:
                raise UsageError("-rncn given more than once")
            if cmd.notify_cmd is not None:
                raise UsageError("-rnc and -rncn are mutually exclusive")
            cmd = cmd._replace(no_notify=True)
        elif option == "--grace" and op == "release":
            cmd = cmd._replace(grace=_grace(cmd, args[i] if i < len(args) else None))
            i += 1
        elif option in _HELP or option in _VERSION:
            raise UsageError(f"-h/-V stand alone: got {option} after {op}")
        else:
            raise UsageError(f"unknown option {option!r} for bresize {op}")
    positionals = args[i:]
    what = "[min_task,]tasks" if op == "request" else "the release specification"
    # LSF style: options never follow a positional. No host name, count or job ID
    # starts with "-", so such a token can only be a misplaced option (unless the
    # user ended the options with "--" and wants the positional error instead).
    if not dashdash:
        for arg in positionals:
            if _is_option(arg):
                raise UsageError(f"options come before {what}: got {arg!r} after it")
    return cmd, positionals


def _grace(cmd: Command, text: str | None) -> float:
    """``--grace S``: seconds, a decimal number (the site's maximum is the controller's
    to check). An XCE extension: LSF's options never start with ``--``, so every LSF
    command line parses as before."""
    import re

    if cmd.grace is not None:
        raise UsageError("--grace given more than once")
    if text is None or not re.fullmatch(r"(?a)[0-9]{1,9}(\.[0-9]{1,9})?", text):
        raise UsageError(f"--grace takes a number of seconds >= 0, got {text!r}")
    return float(text)


def _utf8_len(text: str) -> int:
    """Bytes of ``text`` in UTF-8, as the command line gave them."""
    try:
        # surrogateescape: argv bytes that are not UTF-8 count one byte each, as given.
        return len(text.encode("utf-8", "surrogateescape"))
    except UnicodeEncodeError:
        # Other lone surrogates cannot come from a POSIX argv, only from a caller
        # passing odd strings; count them as UTF-8 would if it allowed them.
        return len(text.encode("utf-8", "surrogatepass"))


def _is_option(arg: str) -> bool:
    return arg.startswith("-") and arg[1:2] not in _DIGITS


def _request_positionals(positionals: list[str]) -> tuple[int, int, str]:
    import re

    if not positionals:
        raise UsageError("missing [min_task,]tasks and job ID")
    if len(positionals) == 1:
        # One argument: say which of the two is missing by what the one given looks like.
        if re.fullmatch(_COUNTS, positionals[0]):
            raise UsageError("missing job ID")
        raise UsageError(f"missing [min_task,]tasks before job ID {positionals[0]!r}")
    if len(positionals) > 2:
        raise UsageError(
            "request takes [min_task,]tasks and one job ID: "
            f"got {' '.join(positionals)!r} (write min_task,tasks without spaces)"
        )
    min_add, max_add = parse_counts(positionals[0])
    return min_add, max_add, positionals[1]


def parse_counts(text: str) -> tuple[int, int]:
    """``[min_task,]tasks`` as ``bresize request`` takes it: ``(min, max)``, or
    :class:`UsageError` in LSF's words (also used by ``xce-resize grow``)."""
    import re

    match = re.fullmatch(_COUNTS, text)
    if match is None:
        raise UsageError(f"request takes [min_task,]tasks: got {text!r}")
    max_text = match.group(2) or match.group(1)
    min_text = match.group(1)
    max_add = _positive(max_text, "tasks", text)
    min_add = _positive(min_text, "min_task", text)
    if min_add > max_add:
        raise UsageError(f"min_task {min_add} is greater than tasks {max_add}")
    return min_add, max_add


def _positive(digits: str, name: str, text: str) -> int:
    """A decimal string as a count in 1..MAX_TASKS, else UsageError naming ``text``."""
    significant = digits.lstrip("0")
    if not significant:
        raise UsageError(f"{name} must be a positive integer: got {text!r}")
    # Compare lengths first: int() of a huge digit string is slow or refused outright.
    if len(significant) > len(str(MAX_TASKS)) or int(significant) > MAX_TASKS:
        raise UsageError(f"{name} must be at most {MAX_TASKS}: got {text!r}")
    return int(significant)


def _release_positionals(positionals: list[str]) -> tuple[tuple[str, ...], str]:
    import re

    if not positionals:
        raise UsageError("missing release specification and job ID")
    *spec_args, job_text = positionals
    # One quoted argument or several, or a mix: the tokens are what counts.
    # Split on ASCII blanks only, as core.releasespec does (str.split() also splits on a
    # no-break space): not imported here, for bresize's start-up time.
    spec = tuple(t for arg in spec_args for t in re.split(r"[ \t\n\r\v\f]+", arg) if t)
    if not spec:
        if not spec_args and re.fullmatch(_JOB_ID, job_text):
            raise UsageError(f"missing release specification before job ID {job_text!r}")
        if not spec_args:
            raise UsageError(f"missing job ID after release specification {job_text!r}")
        raise UsageError("empty release specification")
    return spec, job_text


def parse_job_id(text: str) -> str:
    """``N`` or ``N[i]`` (an array element), normalised; else BadJobId naming ``text``."""
    import re

    match = re.fullmatch(_JOB_ID, text)
    if match is None:
        raise BadJobId(f"{text!r}: a job ID is a number, or number[index] for an array element")
    parts = [match.group(1)] if match.group(2) is None else [match.group(1), match.group(2)]
    numbers = []
    for part in parts:
        significant = part.lstrip("0")
        if not significant or len(significant) > _MAX_ID_DIGITS:
            raise BadJobId(f"{text!r}: job IDs and array indices are positive numbers")
        numbers.append(significant)
    return numbers[0] if len(numbers) == 1 else f"{numbers[0]}[{numbers[1]}]"


def to_argv(cmd: Command) -> list[str]:
    """The arguments that :func:`parse` reads back as ``cmd`` (canonical form)."""
    if cmd.op == "help":
        return ["-h"]
    if cmd.op == "version":
        return ["-V"]
    if cmd.op == "cancel":
        return ["cancel", cmd.job_id]
    argv: list[str] = [cmd.op]
    if cmd.cancel_pending:
        argv.append("-c")
    if cmd.notify_cmd is not None:
        argv += ["-rnc", cmd.notify_cmd]
    if cmd.no_notify:
        argv.append("-rncn")
    if cmd.grace is not None:
        # Fixed point, not :g (1.23457e+06, 6 digits): the grammar reads up to 9 digits
        # and 9 decimals, which give back every float it reads below 10**9 seconds.
        argv += ["--grace", f"{cmd.grace:.9f}".rstrip("0").rstrip(".")]
    if cmd.op == "request":
        counts = f"{cmd.max_add}" if cmd.min_add == cmd.max_add else f"{cmd.min_add},{cmd.max_add}"
        argv.append(counts)
    else:
        argv += list(cmd.spec)
    argv.append(cmd.job_id)
    return argv


def to_request(cmd: Command) -> tuple[str, GrowRequest | ReleaseRequest | CancelRequest]:
    """The job ID and the request model for a parsed resize command.

    For ``release`` the spec is checked with
    :func:`~xce_resize_plugin.core.releasespec.parse_release_spec` (BadReleaseHostSpec,
    BadSlots, BadHost) and sent as its tokens joined by single spaces. ``help`` and
    ``version`` are not requests: UsageError.
    """
    # Imported here, not at module level: attrs must not slow down bresize's start
    # for -h, -V or a usage error.
    from xce_resize_plugin.core.models import CancelRequest, GrowRequest, ReleaseRequest
    from xce_resize_plugin.core.releasespec import parse_release_spec

    # What a grow and a release share (LSF's -c, -rnc, -rncn).
    change: _ChangeFields = {
        "cancel_pending": cmd.cancel_pending,
        "notify_cmd": cmd.notify_cmd,
        "no_notify": cmd.no_notify,
    }
    if cmd.op == "request":
        if cmd.min_add is None or cmd.max_add is None:
            raise UsageError("request needs [min_task,]tasks")
        return cmd.job_id, GrowRequest(min_add=cmd.min_add, max_add=cmd.max_add, **change)
    if cmd.op == "release":
        parse_release_spec(cmd.spec)
        return cmd.job_id, ReleaseRequest(spec=" ".join(cmd.spec), grace=cmd.grace, **change)
    if cmd.op == "cancel":
        return cmd.job_id, CancelRequest()
    raise UsageError(f"bresize {'-h' if cmd.op == 'help' else '-V'} is not a resize request")
