"""A small JSON-over-HTTP client for the controller's REST API, standard library only.

Shared by ``bresize``, the in-job API and the ``xce-resize`` client commands, so that a
rejection always surfaces the same way: a :class:`RemoteError` carrying the problem
document's LSF code and message, or :class:`~xce_resize_plugin.errors.Unreachable`
naming the URL. urllib and json are imported on first use, so importing this module
costs nothing at start-up.
"""

from __future__ import annotations

import io
import os
import time

from xce_resize_plugin.errors import ResizeError, Unreachable

TYPE_CHECKING = False  # typing is not imported on bresize's path (see lsf/lean.py)
if TYPE_CHECKING:
    from typing import Any

DEFAULT_URL = "http://127.0.0.1:6820"


#: The body of the plain 503 that uvicorn sends at its ``limit_concurrency`` and the live
#: servers send for a connection beyond their descriptors
#: (controllers/live/fd_limits.py ``REFUSAL``): before the request reaches the
#: application, so nothing of it was done.
UNPROCESSED_503 = b"Service Unavailable"


class RemoteError(ResizeError):
    """The controller refused a request: its code, message and HTTP status as sent."""

    def __init__(
        self,
        code: str,
        text: str,
        status: int,
        lsf_number: int | None = None,
        retry_after: int | None = None,
        unprocessed: bool = False,
    ) -> None:
        self.code = code
        self.remote_text = text
        self.http_status = status
        self.lsf_number = lsf_number
        #: The answer's ``Retry-After`` in seconds, when it gave one as a number (the
        #: HTTP-date form and anything else read as ``None``).
        self.retry_after = retry_after
        #: Refused before any of the request was handled: the plain 503 our servers
        #: (uvicorn's, and the live servers' own at ``accept()``) send before a request
        #: reaches the application, so sending it again cannot do anything twice. A
        #: proxy's 503 may come after it forwarded the request: not this.
        self.unprocessed = unprocessed
        super().__init__()

    @property
    def text(self) -> str:
        return self.remote_text


class Client:
    """Talks to ``url`` with an optional bearer ``token``."""

    def __init__(self, url: str, token: str | None, timeout: float = 30.0) -> None:
        self.url = url.rstrip("/")
        self.token = token
        self.timeout = timeout

    @classmethod
    def from_env(cls, timeout: float = 30.0) -> Client:
        """``XCE_CONTROLLER_URL`` and ``XCE_TOKEN`` (or, inside a job, ``XCE_JOB_TOKEN``);
        each one set empty counts as unset (``XCE_CONTROLLER_URL= bresize ...``)."""
        return cls(
            os.environ.get("XCE_CONTROLLER_URL") or DEFAULT_URL,
            os.environ.get("XCE_TOKEN") or os.environ.get("XCE_JOB_TOKEN") or None,
            timeout,
        )

    def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        timeout: float | None = None,
    ) -> Any:
        """Send one request; return the decoded JSON answer (``None`` when empty).

        :class:`Unreachable` also when no request can be made (a malformed URL, a token
        no HTTP header can carry) or what answered is not JSON: in each case no
        controller answered, and a command says so rather than show a traceback."""
        import json

        data = json.dumps(body).encode() if body is not None else None
        try:
            raw = self._send(method, path, data, timeout)
        except ValueError as exc:  # urllib's refusals of the URL or the token
            text = str(exc)
            token = self.token or "\0"
            if "Bearer" in text or (
                isinstance(exc, UnicodeEncodeError) and token in str(exc.object)
            ):
                # urllib quotes the header in its error: never show or log the token.
                text = BAD_TOKEN
            raise Unreachable(f"{self.url!r}: {text}") from None
        try:
            return json.loads(raw) if raw else None
        except ValueError as exc:  # (also not UTF-8)
            raise Unreachable(f"{self.url}: the answer is not JSON: {exc}") from None

    def _send(self, method: str, path: str, data: bytes | None, timeout: float | None) -> bytes:
        import http.client
        import urllib.error
        import urllib.request

        if self.token and not header_safe(self.token):
            # Refused before anything is sent, as by the async client (urllib sent a
            # line end as a folded header, and a tab or a non-ASCII character as is).
            raise ValueError(BAD_TOKEN)
        req = urllib.request.Request(self.url + path, data=data, method=method)
        req.add_header("Accept", "application/json, application/problem+json")
        if data is not None:
            req.add_header("Content-Type", "application/json")
        if self.token:
            req.add_header("Authorization", f"Bearer {self.token}")
        limit = timeout or self.timeout
        deadline = time.monotonic() + limit
        try:
            with _opener(deadline, limit).open(req, timeout=limit) as resp:
                raw: bytes = resp.read()
        except urllib.error.HTTPError as exc:
            if 300 <= exc.code < 400:
                raise redirected(self.url, exc.code, exc.headers.get("Location")) from None
            try:
                # Its body by the same deadline (the answer behind it is what reads).
                raw = exc.fp.read() if exc.fp is not None else b""
            except (OSError, http.client.HTTPException):
                raw = b""  # cut off mid-answer: the status still says what happened
            finally:
                exc.close()  # its connection, not left to the garbage collector
            raise remote_error(
                exc.code, raw, str(exc.reason), exc.headers.get("Retry-After")
            ) from None
        except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
            # HTTPException: the connection closed mid-answer (a controller killed while
            # it wrote it), so the request's outcome is unknown, as when unreachable.
            reason = getattr(exc, "reason", None) or repr(exc)
            raise Unreachable(f"{self.url}: {reason}") from None
        return raw


class _DeadlineReader(io.RawIOBase):
    """An answer's bytes off its socket, every read bounded by what is left of the
    call's limit: the socket's own timeout bounds each read only, so a server sending
    a byte every few seconds (of the status line, a header or the body) held a call
    for ever."""

    def __init__(self, sock: Any, file: Any, deadline: float, limit: float) -> None:
        super().__init__()
        self._sock, self._deadline, self._limit = sock, deadline, limit
        # The socket's own file, unread: it keeps the socket open once urllib has
        # closed the connection's handle (as the answer's file always does).
        self._file = file

    def close(self) -> None:
        if not self.closed:
            self._file.close()
        super().close()

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"no whole answer within {self._limit:g} s")
        self._sock.settimeout(left)
        try:
            return int(self._sock.recv_into(buffer))
        except TimeoutError:
            raise TimeoutError(f"no whole answer within {self._limit:g} s") from None


def _bounded(connection: Any, deadline: float, limit: float) -> Any:
    """``connection`` (http.client's, plain or TLS) whose answers are read through a
    :class:`_DeadlineReader`."""
    import http.client

    class Response(http.client.HTTPResponse):
        def __init__(self, sock: Any, *args: Any, **kwargs: Any) -> None:
            super().__init__(sock, *args, **kwargs)
            self.fp = io.BufferedReader(_DeadlineReader(sock, self.fp, deadline, limit))

    class Connection(connection):  # type: ignore[misc]
        response_class = Response

    return Connection


#: Why a token is refused before any request (never shown: it is a secret).
BAD_TOKEN = "the token holds a character no HTTP header can carry (a line end?)"


def header_safe(token: str) -> bool:
    """Whether ``token`` can be sent in an HTTP header as it is (printable ASCII: no
    line end, no tab, nothing urllib or httpx would encode or refuse differently)."""
    return all(32 <= ord(c) <= 126 for c in token)


def _opener(deadline: float, limit: float) -> Any:
    """urllib's opener without its redirect handler or proxies, reading answers by
    ``deadline``.

    A redirect is answered, not followed: followed, it sent the token to wherever it
    pointed, and a POST came back as a GET there, whose answer read as the request's
    success. The controller is always reached directly: urllib's default proxy handler
    sent each request, the token in its header, to whatever proxy ``http_proxy`` named
    (docs/in-job-api.md). Every read of the answer, from its status line on, ends by
    the call's deadline (:class:`_DeadlineReader`)."""
    import urllib.request

    class Unfollowed(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args: Any, **kwargs: Any) -> None:
            return None  # urllib then raises the 3xx as an HTTPError

    class Plain(urllib.request.HTTPHandler):
        def do_open(self, http_class: Any, req: Any, **kwargs: Any) -> Any:
            return super().do_open(_bounded(http_class, deadline, limit), req, **kwargs)

    class Secure(urllib.request.HTTPSHandler):
        def do_open(self, http_class: Any, req: Any, **kwargs: Any) -> Any:
            return super().do_open(_bounded(http_class, deadline, limit), req, **kwargs)

    return urllib.request.build_opener(urllib.request.ProxyHandler({}), Unfollowed, Plain, Secure)


def redirected(url: str, status: int, location: str | None) -> Unreachable:
    """The error of a redirect (never followed: the token goes to the controller only)."""
    where = f" to {location[:200]!r}" if location else ""
    return Unreachable(
        f"{url}: answered {status}, a redirect{where}; not followed (the token is sent to "
        "the controller's URL only: give that one)"
    )


def remote_error(
    status: int, raw: bytes, reason: str, retry_after: str | None = None
) -> RemoteError:
    """The refusal an error answer stands for: its problem document's code, text and
    LSF number (the status and ``reason`` when it has none), and its ``Retry-After``."""
    import json

    from xce_resize_plugin.core.decimal_text import read_decimal

    try:
        doc = json.loads(raw or b"{}")
    except ValueError:
        doc = {}
    if not isinstance(doc, dict):
        doc = {}
    number = doc.get("lsf_number")
    return RemoteError(
        str(doc.get("code") or f"HTTP_{status}"),
        str(doc.get("detail") or doc.get("title") or reason),
        status,
        number if isinstance(number, int) else None,
        read_decimal(retry_after.strip()) if retry_after is not None else None,
        status == 503 and raw.strip() == UNPROCESSED_503,
    )
