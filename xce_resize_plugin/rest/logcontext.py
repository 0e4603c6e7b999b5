"""Which request a log line is about: its request id, the user and the job.

The HTTP layer (:class:`~xce_resize_plugin.rest.http.RequestContext`) opens a
:class:`RequestLog` for each request and fills it in as it learns more (the user once
the token is checked, the job from the path or the submission). A :class:`ContextFilter`
on a log handler copies it onto every record logged while the request is served, in
the event loop or in a worker thread (Starlette runs blocking work with a copy of the
context, which holds the same :class:`RequestLog`), so that a log line about a request
says which one. Standard library only: a host's logging setup may import it cheaply.

A client's ``X-Request-ID`` is kept when it is a sane token (:func:`request_id`), so
that a request can be followed from the client through the controller's log; anything
else is replaced by a fresh id. Never a token or a header other than that one.
"""

from __future__ import annotations

import itertools
import logging
import re
import secrets
from contextvars import ContextVar

__all__ = [
    "CURRENT",
    "MAX_ID",
    "ContextFilter",
    "RequestLog",
    "note_job",
    "request_id",
    "sane",
]

#: Longest request id or job id taken from a client (characters).
MAX_ID = 128
_SANE = re.compile(rf"[A-Za-z0-9._~:/+=@-]{{1,{MAX_ID}}}")


class RequestLog:
    """What the log says about the request being served (``None``: not known yet)."""

    __slots__ = ("job", "request_id", "user")

    def __init__(self, request_id: str) -> None:
        self.request_id = request_id
        self.user: str | None = None
        self.job: str | None = None


#: The request the current task or thread works for (``None``: none).
CURRENT: ContextVar[RequestLog | None] = ContextVar("xce_request_log", default=None)


def sane(value: str | None) -> str | None:
    """``value`` when it is 1 to :data:`MAX_ID` printable token characters (letters,
    digits, ``. _ ~ : / + = @ -``), else ``None``: what a client sends may go into a log
    line only if it cannot forge or break one."""
    if value is not None and _SANE.fullmatch(value):
        return value
    return None


# A new id is this process's random prefix and a counter: unique across restarts and
# processes (the prefix), unique within the process (the counter), and far cheaper than
# asking the system for random bytes on every request.
_PREFIX = secrets.token_hex(4)
_COUNTER = itertools.count()


def request_id(header: str | None) -> str:
    """The id of a request whose ``X-Request-ID`` header is ``header``: the client's
    when :func:`sane`, else a new one (16 hex digits)."""
    return sane(header) or f"{_PREFIX}{next(_COUNTER) & 0xFFFFFFFF:08x}"


def note_job(job_id: str | None) -> None:
    """The request being served is about job ``job_id`` (ignored when not :func:`sane`)."""
    current = CURRENT.get()
    if current is not None and sane(job_id) is not None:
        current.job = job_id


class ContextFilter(logging.Filter):
    """Adds ``request_id``, ``user`` and ``job`` to every record (``None`` where not
    known, or logged outside a request); a value the call gave (``extra={"job": ...}``)
    is kept. Attach it to a handler; it never drops a record."""

    def filter(self, record: logging.LogRecord) -> bool:
        current = CURRENT.get()
        fields = record.__dict__
        if current is None:
            for name in ("request_id", "user", "job"):
                fields.setdefault(name, None)
        else:
            if fields.get("request_id") is None:
                fields["request_id"] = current.request_id
            if fields.get("user") is None:
                fields["user"] = current.user
            if fields.get("job") is None:
                fields["job"] = current.job
        return True
