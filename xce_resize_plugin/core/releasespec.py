"""The LSF release specification: parse it, then resolve it against a job's allocation.

Grammar (docs/user-guide.md, "release: shrink")::

    spec      ::= "all" { "~" host_spec }      release everything except these
                | host_spec { host_spec }       release exactly these
    host_spec ::= host | N "*" host             N a positive integer

A host name is ASCII letters, digits, ``-``, ``_`` and ``.``, starts with a letter or a
digit and is at most 255 characters long. ``all`` is a keyword, never a host name.

Parsing and resolving are separate on purpose: :func:`parse_release_spec` needs nothing
but the text (``bresize`` can reject a typo before contacting the controller), while
:func:`resolve_release` needs the job's committed allocation.

Which error a bad token gets is decided by the part that is wrong, so that a user can
tell from the LSF code what to fix:

==================================  =====================  ===========================
input                               error                  why
==================================  =====================  ===========================
empty (no tokens)                   BadReleaseHostSpec     nothing to read
``~hostB`` without ``all``          BadReleaseHostSpec     structure: "~" needs "all"
``all all``, ``hostA all``          BadReleaseHostSpec     structure: "all" leads, once
``all hostB`` (no ``~``)            BadReleaseHostSpec     after "all" only exceptions
``hostB*2`` (count after host)      BadReleaseHostSpec     not LSF syntax: ``2*hostB``
``hostB 1*hostB``                   BadReleaseHostSpec     the same host named twice
``~all``, ``2*all``                 BadReleaseHostSpec     "all" is a keyword
``0*h``, ``-1*h``, ``x*h``, ``*h``  BadSlots               the count part is wrong
``99999999999*h``                   BadSlots               count above 2**31 - 1
``2*``, ``all ~``                   BadHost                the host part is missing
``host!``, ``-h``, ``2*a*b``        BadHost                the host part is malformed
==================================  =====================  ===========================

Resolving (:func:`resolve_release`, :func:`resolve_host_counts`,
:func:`resolve_task_ids`, and for a whole :class:`ReleaseRequest` :func:`named_release_ids`
and :func:`release_size`) raises HostNotInAlloc, BadSlots, ReleaseFirstHost,
ReleaseNoop and InvalidRequest as documented on each function. The head task
(``tasks[0]``, task 0 on the first execution host) is never released.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Mapping, Sequence

from attrs import frozen

from xce_resize_plugin.core.allocations import id_range
from xce_resize_plugin.core.models import ReleaseRequest, Task
from xce_resize_plugin.errors import (
    BadHost,
    BadReleaseHostSpec,
    BadSlots,
    HostNotInAlloc,
    InvalidRequest,
    ReleaseFirstHost,
    ReleaseNoop,
)

__all__ = [
    "MAX_COUNT",
    "ReleaseSpec",
    "format_release_spec",
    "named_release_ids",
    "parse_release_spec",
    "release_size",
    "resolve_host_counts",
    "resolve_release",
    "resolve_task_ids",
    "validate_host_name",
]

#: Largest task count accepted anywhere in a spec. LSF stores counts in a C ``int``;
#: the bound also keeps ``int()`` away from pathological digit strings.
MAX_COUNT = 2**31 - 1

# re.ASCII: ``\d`` and friends must not accept other scripts' digits, which int()
# would happily convert.
_HOST_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*", re.ASCII)
#: What separates a release specification's tokens: ASCII blanks, as in a shell.
_BLANKS = re.compile(r"[ \t\n\r\v\f]+")
_COUNT_RE = re.compile(r"[0-9]+", re.ASCII)
_MAX_HOST_LEN = 255
_ALL = "all"
_KEEP = "~"


@frozen
class ReleaseSpec:
    """A parsed release specification.

    ``all`` true: release every task but the head task, except ``hosts`` (the ``~host``
    / ``~N*host`` exceptions: keep all, or keep N, of the job's tasks there).
    ``all`` false: release ``hosts`` (``None``: all of the job's tasks there, else N).
    Hosts keep the order they were written in.
    """

    all: bool
    hosts: tuple[tuple[str, int | None], ...] = ()


def validate_host_name(name: str, token: str | None = None) -> str:
    """Return ``name`` if it is a valid host name, else raise BadHost naming ``token``.

    ``token`` is the whole token the name came from (``2*host!``), so the message shows
    what the user wrote; it defaults to ``name``.
    """
    shown = name if token is None else token
    if not name:
        raise BadHost(f"{shown!r}: missing host name")
    if name == _ALL:
        # "all" is reserved by the grammar; naming it as a host is a structural mistake.
        raise BadReleaseHostSpec(f"{shown!r}: 'all' is a keyword, not a host name")
    if len(name) > _MAX_HOST_LEN:
        raise BadHost(f"{shown!r}: host name longer than {_MAX_HOST_LEN} characters")
    if not _HOST_RE.fullmatch(name):
        raise BadHost(
            f"{shown!r}: a host name is letters, digits, '-', '_' and '.', "
            "starting with a letter or a digit"
        )
    return name


def _parse_count(text: str, token: str) -> int:
    """The N of ``N*host``: a positive integer no larger than :data:`MAX_COUNT`."""
    if not _COUNT_RE.fullmatch(text):
        raise BadSlots(f"{token!r}: the task count must be a positive integer")
    # Strip leading zeros before the length check so "0002" counts as 2, then bound the
    # length so int() never sees thousands of digits.
    digits = text.lstrip("0")
    if not digits:
        raise BadSlots(f"{token!r}: the task count must be a positive integer")
    if len(digits) > len(str(MAX_COUNT)) or int(digits) > MAX_COUNT:
        raise BadSlots(f"{token!r}: the task count must be at most {MAX_COUNT}")
    return int(digits)


def _parse_host_spec(body: str, token: str) -> tuple[str, int | None]:
    """``host`` or ``N*host`` (``body`` is the token without a leading ``~``)."""
    if "*" not in body:
        return validate_host_name(body, token), None
    count_text, _, host = body.partition("*")
    if (
        not _COUNT_RE.fullmatch(count_text)
        and _COUNT_RE.fullmatch(host)
        and _HOST_RE.fullmatch(count_text)
    ):
        # "hostB*2": the count written after the host. Say so rather than complain
        # about a count of "hostB".
        raise BadReleaseHostSpec(f"{token!r}: write the task count first, as {host}*{count_text}")
    count = _parse_count(count_text, token)
    return validate_host_name(host, token), count


def ascii_tokens(text: str) -> list[str]:
    """``text`` split on ASCII blanks only, as a shell splits a command line: str.split()
    also splits on a no-break space and on \\x1c-\\x1f, which made "hA\\xa0hB" two
    hosts. What else is in a token is the host name's check to refuse."""
    stripped = text.strip(" \t\n\r\v\f")
    return _BLANKS.split(stripped) if stripped else []


def _tokens(text_or_tokens: str | Sequence[str]) -> list[str]:
    # Each argument may itself hold several tokens (one quoted argument, or a mix of
    # quoted and separate ones), so split every piece on whitespace.
    pieces = [text_or_tokens] if isinstance(text_or_tokens, str) else list(text_or_tokens)
    return [token for piece in pieces for token in ascii_tokens(piece)]


def parse_release_spec(text_or_tokens: str | Sequence[str]) -> ReleaseSpec:
    """Parse an LSF release specification.

    ``text_or_tokens`` is one string (split on whitespace) or the command-line arguments
    between the options and the job ID (each of which is split on whitespace too, so
    ``["all ~hostB", "~hostC"]`` works). Raises BadReleaseHostSpec, BadSlots or BadHost
    as tabled in the module docstring; the detail names the offending token.
    """
    tokens = _tokens(text_or_tokens)
    if not tokens:
        raise BadReleaseHostSpec("empty release specification")
    release_all = tokens[0] == _ALL
    hosts: list[tuple[str, int | None]] = []
    seen: set[str] = set()
    for token in tokens[1:] if release_all else tokens:
        if token == _ALL:
            where = "more than once" if release_all else "after host names"
            raise BadReleaseHostSpec(f"{token!r}: 'all' may only come first, once ({where})")
        if token.startswith(_KEEP):
            if not release_all:
                raise BadReleaseHostSpec(f"{token!r}: '~' (keep) is only valid after 'all'")
            host, count = _parse_host_spec(token[1:], token)
        elif release_all:
            # After "all" every host is an exception and must say so with "~".
            raise BadReleaseHostSpec(
                f"{token!r}: after 'all' only exceptions (~host, ~N*host) may follow"
            )
        else:
            host, count = _parse_host_spec(token, token)
        if host in seen:
            raise BadReleaseHostSpec(f"{token!r}: host {host} is named more than once")
        seen.add(host)
        hosts.append((host, count))
    return ReleaseSpec(all=release_all, hosts=tuple(hosts))


def format_release_spec(spec: ReleaseSpec) -> str:
    """The canonical text of ``spec``, which :func:`parse_release_spec` reads back."""
    prefix = _KEEP if spec.all else ""
    parts = [_ALL] if spec.all else []
    for host, count in spec.hosts:
        parts.append(f"{prefix}{host}" if count is None else f"{prefix}{count}*{host}")
    return " ".join(parts)


# --- resolving against an allocation -------------------------------------------------


def _by_host(tasks: Sequence[Task]) -> dict[str, list[Task]]:
    """The job's tasks per host, lowest id (oldest) first."""
    groups: dict[str, list[Task]] = {}
    for task in tasks:
        groups.setdefault(task.host, []).append(task)
    for group in groups.values():
        group.sort(key=lambda t: t.id)
    return groups


def _host_tasks(groups: Mapping[str, list[Task]], host: str, token: str) -> list[Task]:
    try:
        return groups[host]
    except KeyError:
        raise HostNotInAlloc(f"{token!r}: the job has no tasks on {host}") from None


def _written(host: str, count: int | None, keep: bool = False) -> str:
    """The host spec as the user wrote it, for error details."""
    text = host if count is None else f"{count}*{host}"
    return f"{_KEEP}{text}" if keep else text


def resolve_release(spec: ReleaseSpec, tasks: Sequence[Task]) -> tuple[int, ...]:
    """The task ids ``spec`` releases from the allocation ``tasks``, ascending.

    ``tasks`` is the committed allocation in allocation order; ``tasks[0]`` is the head
    task (task 0 on the first execution host), which is never released.

    - ``all``: every task but the head, minus the exceptions. ``~host`` keeps all the
      job's tasks there; ``~N*host`` keeps N there, the oldest (lowest ids); on the first
      host the head task is among the oldest, so it counts toward N.
    - ``host``: all the job's tasks there (on the first host: all but the head).
    - ``N*host``: N of the job's tasks there, newest (highest ids) first.

    Raises HostNotInAlloc for a host without tasks of the job, BadSlots when N exceeds
    the job's tasks on a host, ReleaseFirstHost when a host spec would take every task
    of the first host (or names it while only the head is there), ReleaseNoop when
    nothing would be released. The spec is checked in written order; the first problem
    wins.
    """
    groups = _by_host(tasks)
    head_id = tasks[0].id if tasks else None
    if spec.all:
        return _resolve_all_but(spec, tasks, groups, head_id)
    return _resolve_hosts(spec.hosts, groups, head_id)


def _resolve_all_but(
    spec: ReleaseSpec,
    tasks: Sequence[Task],
    groups: Mapping[str, list[Task]],
    head_id: int | None,
) -> tuple[int, ...]:
    kept: set[int] = set()
    for host, count in spec.hosts:
        token = _written(host, count, keep=True)
        there = _host_tasks(groups, host, token)
        if count is None:
            kept.update(t.id for t in there)
            continue
        if count > len(there):
            raise BadSlots(f"{token!r}: the job has only {len(there)} task(s) on {host}")
        # Keep the oldest: the head task, if it is here, is the oldest and thus counts.
        kept.update(t.id for t in there[:count])
    released = sorted({t.id for t in tasks if t.id != head_id and t.id not in kept})
    if not released:
        raise ReleaseNoop(f"{format_release_spec(spec)!r} leaves every task in place")
    return tuple(released)


def _resolve_hosts(
    hosts: Iterable[tuple[str, int | None]],
    groups: Mapping[str, list[Task]],
    head_id: int | None,
) -> tuple[int, ...]:
    released: set[int] = set()
    for host, count in hosts:
        token = _written(host, count)
        there = _host_tasks(groups, host, token)
        # The head task is not a candidate; on the first host this leaves one fewer.
        candidates = [t for t in there if t.id != head_id]
        if count is None:
            # As in LSF, the first execution host cannot be named as a whole: it keeps
            # the head task (``all`` and ``all ~...`` keep it without being told).
            if len(candidates) < len(there):
                raise ReleaseFirstHost(
                    f"{token!r}: {host} is the first execution host and keeps the head task"
                    f" (task {head_id}); release N*{host} or use all"
                )
            released.update(t.id for t in candidates)
            continue
        if count > len(there):
            raise BadSlots(f"{token!r}: the job has only {len(there)} task(s) on {host}")
        if count > len(candidates):
            raise ReleaseFirstHost(
                f"{token!r}: {host} is the first execution host and must keep the head task"
            )
        # Newest first: the tasks added last are the ones given back first.
        released.update(t.id for t in candidates[len(candidates) - count :])
    if not released:
        # Unreachable from a parsed spec (it names at least one host and every branch
        # above releases or raises), but a hand-built empty ReleaseSpec lands here.
        raise ReleaseNoop("no hosts given")
    return tuple(sorted(released))


def resolve_host_counts(hosts: Mapping[str, int | None], tasks: Sequence[Task]) -> tuple[int, ...]:
    """The REST ``hosts`` form: ``{host: N}`` releases N there, ``{host: None}`` all.

    Same rules and errors as the host list of a spec; in addition a host name is checked
    like a spec token (BadHost), a count must be a positive integer up to
    :data:`MAX_COUNT` (BadSlots) and an empty mapping is BadReleaseHostSpec.
    """
    if not hosts:
        raise BadReleaseHostSpec("empty release specification")
    checked: list[tuple[str, int | None]] = []
    for host, count in hosts.items():
        validate_host_name(host)
        # bool is an int subclass; True as a task count is a client bug, not "1".
        if count is not None and (
            isinstance(count, bool) or not isinstance(count, int) or not 0 < count <= MAX_COUNT
        ):
            raise BadSlots(
                f"{host}: {count!r}: the task count must be a positive integer or null (all)"
            )
        checked.append((host, count))
    return resolve_release(ReleaseSpec(all=False, hosts=tuple(checked)), tasks)


def resolve_task_ids(ids: Iterable[int], tasks: Sequence[Task]) -> tuple[int, ...]:
    """Check explicit task ids against the allocation; return them ascending.

    Raises ReleaseNoop for no ids, InvalidRequest for an id listed twice or not in the
    allocation ("task N is not part of the job's allocation"), ReleaseFirstHost for the
    head task. Checked in the given order; the first problem wins.
    """
    wanted = list(ids)
    if not wanted:
        raise ReleaseNoop("no task ids given")
    # A host's gapless list in id order: membership by its range, without its tasks.
    present: Collection[int] = id_range(tasks) or {t.id for t in tasks}
    head_id = tasks[0].id if tasks else None
    seen: set[int] = set()
    for task_id in wanted:
        if task_id in seen:
            raise InvalidRequest(f"task {task_id} is listed more than once")
        seen.add(task_id)
        if task_id == head_id:
            raise ReleaseFirstHost(f"task {task_id} is the job's head task")
        if task_id not in present:
            raise InvalidRequest(f"task {task_id} is not part of the job's allocation")
    return tuple(sorted(seen))


def named_release_ids(request: ReleaseRequest, tasks: Sequence[Task]) -> tuple[int, ...] | None:
    """The task ids a release request names, resolved against the allocation ``tasks``.

    A request gives exactly one of ``spec``, ``hosts``, ``task_ids`` and ``count``
    (InvalidRequest otherwise). The first three name the tasks: their ids are returned
    ascending, with the errors of :func:`resolve_release`, :func:`resolve_host_counts`
    and :func:`resolve_task_ids`. A ``count`` names none: ``None`` is returned, and the
    ``xce_resize_select_release`` policy picks the tasks when the request is decided.
    """
    forms = [
        request.spec is not None,
        request.hosts is not None,
        request.task_ids is not None,
        request.count is not None,
    ]
    if sum(forms) != 1:
        raise InvalidRequest("give exactly one of spec, hosts, task_ids, count")
    if request.spec is not None:
        return resolve_release(parse_release_spec(request.spec), tasks)
    if request.hosts is not None:
        return resolve_host_counts(request.hosts, tasks)
    if request.task_ids is not None:
        return resolve_task_ids(request.task_ids, tasks)
    return None


def release_size(request: ReleaseRequest, tasks: Sequence[Task]) -> int:
    """How many tasks ``request`` takes from the allocation ``tasks``.

    For a site policy that rules on the size a job would have after a release, e.g. in
    ``xce_resize_validate``: ``len(job.tasks) - release_size(request, job.tasks)``. A
    ``count`` release takes its count; the other forms take the tasks they name, with
    the errors of :func:`named_release_ids` (the request is refused with the same error
    when it is decided, so a policy may let them pass).
    """
    ids = named_release_ids(request, tasks)
    if ids is None:
        assert request.count is not None  # named_release_ids checked there is one form
        return request.count
    return len(ids)
