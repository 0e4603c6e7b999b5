"""The live controller's log: to standard error, as text (the default) or JSON lines.

``xce-resize controller --log-format json`` writes one JSON object per line:
``time`` (UTC, RFC 3339, milliseconds), ``level``, ``logger``, ``message``, then
``request_id``, ``job`` and ``user`` when the line is about a request
(:mod:`xce_resize_plugin.rest.logcontext`) and ``exception`` with the traceback when
there is one. The text format is the one the controller always had; both get the
request context, which only the JSON format shows. ``--access-log`` adds a line per
request. docs/operations.md documents both.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import orjson

from xce_resize_plugin.rest.logcontext import ContextFilter

__all__ = [
    "ACCESS",
    "FORMATS",
    "TEXT",
    "JsonFormatter",
    "RepeatLimit",
    "configure",
    "tell_held_back",
]

#: The logger of the access lines (:class:`~xce_resize_plugin.rest.http.RequestContext`).
ACCESS = "xce_resize_plugin.access"

#: The ``--log-format`` choices.
FORMATS = ("text", "json")
#: The text format's layout.
TEXT = "%(asctime)s controller %(levelname)s %(name)s: %(message)s"
#: Loggers that say too much at INFO for a controller's log.
_QUIET = ("httpx", "httpcore", "uvicorn.access")


#: The logger uvicorn writes a client's malformed requests to, one line each.
SERVER_ERRORS = "uvicorn.error"
#: Seconds in which one kind of warning of :data:`SERVER_ERRORS` is written once.
REPEAT_WINDOW = 60.0


class RepeatLimit(logging.Filter):
    """Writes a warning (or worse) once per :data:`REPEAT_WINDOW` seconds per message
    pattern, the next one saying how many were held back. uvicorn logs a line for each
    malformed request ("Invalid HTTP request received."), so any local process could
    fill the controller's log and its disk; the first of each kind is still written,
    at once. Records below WARNING pass."""

    def __init__(self, window: float = REPEAT_WINDOW, clock: Any = time.monotonic) -> None:
        super().__init__()
        self.window = window
        self._clock = clock
        #: pattern -> (when the last one was written, how many were held back since).
        self._seen: dict[str, tuple[float, int]] = {}
        #: Repeats held back of kinds forgotten (more than 1,000 kinds), not yet told.
        self.untold = 0

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        key = str(record.msg)
        now = self._clock()
        last = self._seen.get(key)
        if last is not None and now - last[0] < self.window:
            self._seen[key] = (last[0], last[1] + 1)
            return False
        if last is not None and last[1]:
            record.msg = f"{record.msg} ({last[1]:,} more like it since the last one written)"
        if len(self._seen) > 1000:  # many kinds: forget, rather than grow
            self.untold += sum(n for _, n in self._seen.values())
            self._seen.clear()
        self._seen[key] = (now, 0)
        return True

    def held_back(self) -> list[tuple[str, int]]:
        """Each kind's repeats held back since its last line, not yet told (a kind
        that never came again would otherwise keep its count to itself), in the order
        the kinds were first seen; the counts start again from zero."""
        # A copy: a thread still logging at the stop may add a kind meanwhile.
        out = [(key, n) for key, (_, n) in list(self._seen.items()) if n]
        for key, _ in out:
            when, _n = self._seen[key]
            self._seen[key] = (when, 0)
        return out


def tell_held_back() -> None:
    """Write, once the server has stopped, how many warnings of each kind
    :class:`RepeatLimit` held back since the last line of that kind."""
    server_errors = logging.getLogger(SERVER_ERRORS)
    for limit in server_errors.filters:
        if not isinstance(limit, RepeatLimit):
            continue
        # Formatted here, without arguments: the filter tells kinds apart by their
        # text, and each of these lines is a kind of its own.
        for msg, n in limit.held_back():
            server_errors.warning(f"{msg} ({n:,} more like it held back, not written)")
        if limit.untold:
            untold, limit.untold = limit.untold, 0
            server_errors.warning(
                f"{untold:,} more warnings held back, of kinds no longer counted one by one"
            )


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line (see the module docstring)."""

    def format(self, record: logging.LogRecord) -> str:
        created = record.created
        line: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(created))
            + f".{int(created * 1000) % 1000:03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name in ("request_id", "job", "user"):
            value = getattr(record, name, None)
            if value is not None:
                line[name] = value
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            line["exception"] = record.exc_text
        if record.stack_info:
            line["stack"] = self.formatStack(record.stack_info)
        # default=str: a message argument that JSON cannot hold is shown, not lost.
        return orjson.dumps(line, default=str).decode("utf-8")


def configure(log_format: str = "text", access: bool = False) -> None:
    """Log INFO and above to standard error in ``log_format`` (one of :data:`FORMATS`),
    with an access line per request if ``access`` (``--access-log``).

    Like :func:`logging.basicConfig`, this leaves a process whose logging is already
    set up (a test, an embedding program) as it is, but for the access lines' level.
    """
    if log_format not in FORMATS:
        raise ValueError(f"log format {log_format!r}: not one of {', '.join(FORMATS)}")
    handler = logging.StreamHandler()
    handler.addFilter(ContextFilter())
    handler.setFormatter(JsonFormatter() if log_format == "json" else logging.Formatter(TEXT))
    logging.basicConfig(level=logging.INFO, handlers=[handler])
    # Every request logs a line: record only what the formats show. Neither shows the
    # thread, the process or the caller's file and line, which logging would otherwise
    # look up for each record (the logging HOWTO's "Optimization" section).
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False
    logging._srcfile = None
    for noisy in _QUIET:
        logging.getLogger(noisy).setLevel(logging.WARNING)
    server_errors = logging.getLogger(SERVER_ERRORS)
    if not any(isinstance(f, RepeatLimit) for f in server_errors.filters):
        server_errors.addFilter(RepeatLimit())
    # Off by default: polling clients (bresize -w, the in-job API) make hundreds of
    # requests a second, and a line each costs the event loop more than the rest of
    # the request context together (docs/operations.md, "Overhead").
    logging.getLogger(ACCESS).setLevel(logging.INFO if access else logging.WARNING)
