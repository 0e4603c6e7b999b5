"""A deadline for receiving a request's headers, for the servers that serve these
routes with uvicorn (the live controller, its worker agents).

uvicorn has no such deadline: ``timeout_keep_alive`` runs only between requests and
every byte received cancels it, so a client that sends half a request line, or a
header a byte at a time, holds its connection (and a file descriptor) for ever.
:class:`HeaderDeadlineProtocol` closes a connection whose request headers are not
complete within ``header_timeout`` seconds, counted from the connection's start and,
on a kept-alive connection, from the end of the previous answer. While a request is
being handled the deadline does not run: its body has its own deadline, kept where
the body is read (:func:`xce_resize_plugin.rest.http.read_body`), and a long poll may
hold its answer as long as it needs.

Serve with ``uvicorn.Config(app, http=header_deadline(seconds))``. This module imports
uvicorn: import it only when serving.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol, RequestResponseCycle

log = logging.getLogger(__name__)

#: Seconds a client has to send a request's headers, unless the server says otherwise.
DEFAULT_HEADER_TIMEOUT = 10.0


class HeaderDeadlineProtocol(H11Protocol):
    """uvicorn's HTTP/1.1 protocol (h11) with a deadline for the request's headers
    (see the module docstring). :func:`header_deadline` makes one with its seconds."""

    header_timeout: float = DEFAULT_HEADER_TIMEOUT

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._follow()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._follow()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._follow()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _follow(self) -> None:
        """Run the deadline while the connection waits for the client (for a request's
        headers, or for the rest of a body its handler did not read); not while a
        request is being handled. A deadline that runs is never restarted by the bytes
        that arrive: only a complete request's headers stop it."""
        cycle: RequestResponseCycle | None = self.cycle
        handling = cycle is not None and not cycle.response_complete
        if handling or self.transport.is_closing():
            self._disarm()
        elif self._deadline is None:
            self._deadline = self.loop.call_later(self.header_timeout, self._expired)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expired(self) -> None:
        self._deadline = None
        if not self.transport.is_closing():
            # Nothing can be answered: no request was received to answer.
            log.debug("closing %s: no complete request in %g s", self.client, self.header_timeout)
            if self.transport.get_write_buffer_size():
                # The last answer is still unsent: the client stopped reading it, and
                # close() would wait for it to read, for ever (the descriptor held).
                self.transport.abort()
            else:
                self.transport.close()


def header_deadline(seconds: float) -> type[HeaderDeadlineProtocol]:
    """The protocol class to serve with (``uvicorn.Config(http=...)``): request headers
    must be complete within ``seconds``."""
    if not seconds > 0:
        raise ValueError(f"header_timeout must be > 0, got {seconds!r}")
    return type("HeaderDeadlineProtocol", (HeaderDeadlineProtocol,), {"header_timeout": seconds})


__all__ = ["DEFAULT_HEADER_TIMEOUT", "HeaderDeadlineProtocol", "header_deadline"]
