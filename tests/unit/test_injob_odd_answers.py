"""The in-job clients against answers no controller gives: a redirect is not followed
(it carried the job's token elsewhere, and a grow came back as a GET whose answer read
as success), an answer of another shape or not JSON is ``Unreachable`` (not a
``KeyError``), and a token no header can carry is refused without being shown — the
sync and the async client alike (docs/in-job-api.md, "Errors")."""

from __future__ import annotations

import asyncio
import http.server
import json
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.http_stub import answering
from xce_resize_plugin.errors import Unreachable
from xce_resize_plugin.injob import ResizeClient
from xce_resize_plugin.injob.aio import AsyncResizeClient
from xce_resize_plugin.injob.protocol import POLL_GAP
from xce_resize_plugin.rest.client import Client

TOKEN = "job-token-of-7"


def _sync(url: str, token: str = TOKEN) -> Callable[[str], Any]:
    client = ResizeClient("7", Client(url, token))
    return lambda call: client.grow(1) if call == "grow" else client.allocation()


def _async(url: str, token: str = TOKEN) -> Callable[[str], Any]:
    async def run(call: str) -> Any:
        async with AsyncResizeClient("7", url, token) as client:
            return await (client.grow(1) if call == "grow" else client.allocation())

    return lambda call: asyncio.run(run(call))


CLIENTS = pytest.mark.parametrize("make", [_sync, _async], ids=["sync", "async"])


@CLIENTS
@pytest.mark.parametrize("call", ["grow", "allocation"])
def test_a_redirect_is_not_followed(make: Callable[..., Any], call: str) -> None:
    with answering(b"", status=302, headers={"Location": "http://elsewhere.invalid/x"}) as stub:
        with pytest.raises(Unreachable, match=r"answered 302, a redirect to .*not followed"):
            make(stub.url)(call)
        assert len(stub.seen) == 1  # and nothing went anywhere else


@CLIENTS
@pytest.mark.parametrize("body", [b"[]", b"null", b"{}", b'{"tasks": [1, 2]}'])
def test_an_answer_of_another_shape_is_unreachable(make: Callable[..., Any], body: bytes) -> None:
    with answering(body) as stub, pytest.raises(Unreachable, match="is not a controller's"):
        make(stub.url)("allocation")


@CLIENTS
def test_an_answer_that_is_not_json_is_unreachable(make: Callable[..., Any]) -> None:
    page = answering(b"<html>hello</html>", "text/html")
    with page as stub, pytest.raises(Unreachable, match="the answer is not JSON"):
        make(stub.url)("allocation")


@CLIENTS
@pytest.mark.parametrize("token", ["s3cr3t\r\nX: y", "s3cr3t\u20ac"])
def test_a_token_no_header_can_carry_is_refused_unseen(
    make: Callable[..., Any], token: str
) -> None:
    with answering(b"{}") as stub:
        with pytest.raises(Unreachable) as info:
            make(stub.url, token)("allocation")
        assert "no HTTP header can carry" in str(info.value)
        assert "s3cr3t" not in str(info.value) and not stub.seen


#: An allocation that never settles: a grow pending for ever.
_PENDING = (
    b'{"job_id": "7", "phase": "GROW_PENDING", "version": 0, "tasks": [{"id": 0, "host": "h1"}], '
    b'"min_tasks": 1, "max_tasks": 4, "pending": {"min_tasks": 1, "tasks": 1}}'
)


@CLIENTS
def test_polls_answered_at_once_are_paced(make: Callable[..., Any]) -> None:
    """Something at the URL that answers every long poll at once (a proxy that ignores
    the poll) was polled 2,300 times a second, for ever without a timeout."""
    with answering(_PENDING) as stub:
        if make is _sync:
            client = ResizeClient("7", Client(stub.url, TOKEN))
            alloc = client.wait(after_version=0, timeout=1.0)
        else:

            async def run() -> Any:
                async with AsyncResizeClient("7", stub.url, TOKEN) as client:
                    return await client.wait(after_version=0, timeout=1.0)

            alloc = asyncio.run(run())
        assert alloc.phase == "GROW_PENDING"
        assert 5 <= len(stub.seen) <= 1.0 / POLL_GAP + 3, len(stub.seen)


class _Dripping(http.server.BaseHTTPRequestHandler):
    """Answers with a long body, one byte every 0.2 s: every read gets something."""

    def do_GET(self) -> None:  # the stdlib names it
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", "1000")
        self.end_headers()
        try:
            for _ in range(1000):
                self.wfile.write(b" ")
                self.wfile.flush()
                time.sleep(0.2)
        except OSError:
            pass  # the client gave up

    def log_message(self, *args: object) -> None:
        """Quiet."""


class _DrippingHead(http.server.BaseHTTPRequestHandler):
    """Answers with its status line and headers one byte every 0.2 s: the body never
    comes, and every read of the head gets something."""

    def do_GET(self) -> None:  # the stdlib names it
        head = b"HTTP/1.1 200 OK\r\n" + b"X-Slow: " + b"y" * 1000 + b"\r\n\r\n"
        try:
            for i in range(len(head)):
                self.wfile.write(head[i : i + 1])
                self.wfile.flush()
                time.sleep(0.2)
        except OSError:
            pass  # the client gave up

    def log_message(self, *args: object) -> None:
        """Quiet."""


def _serve(handler: type[http.server.BaseHTTPRequestHandler]) -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


@pytest.fixture
def dripping_head() -> Iterator[str]:
    yield from _serve(_DrippingHead)


@pytest.fixture
def dripping() -> Iterator[str]:
    yield from _serve(_Dripping)


@CLIENTS
@pytest.mark.parametrize("server", ["dripping", "dripping_head"], ids=["body", "head"])
def test_a_call_ends_at_its_limit_against_a_dripping_answer(
    make: Callable[..., Any], server: str, request: pytest.FixtureRequest
) -> None:
    """The limit bounded each read only: a byte every 0.2 s held a call for ever, of
    the body (both clients, before) or of the status line and headers (the sync
    client, until its reads were all bounded by the call's deadline)."""
    url = request.getfixturevalue(server)
    if make is _sync:
        client: Any = ResizeClient("7", Client(url, TOKEN, timeout=1.0))
        call = client.allocation
    else:

        def call() -> Any:
            async def run() -> Any:
                async with AsyncResizeClient("7", url, TOKEN, timeout=1.0) as c:
                    return await c.allocation()

            return asyncio.run(run())

    began = time.monotonic()
    with pytest.raises(Unreachable, match="no whole answer within 1 s"):
        call()
    assert time.monotonic() - began < 5.0


class _EventsAtOnce(http.server.BaseHTTPRequestHandler):
    """Answers every events poll at once with nothing, and the wait route with a job
    in :attr:`state`; records the paths."""

    state = "RUN"
    paths: list[str] = []

    def do_GET(self) -> None:  # the stdlib names it
        type(self).paths.append(self.path)
        doc: Any = []
        if "/resize/wait?" in self.path:
            doc = {**json.loads(_SETTLED), "job_state": self.state}
        body = json.dumps(doc).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        """Quiet."""


def _read_events(make: Callable[..., Any], url: str, timeout: float | None) -> list[Any]:
    if make is _sync:
        return list(ResizeClient("7", Client(url, TOKEN)).events(timeout=timeout))

    async def run() -> list[Any]:
        async with AsyncResizeClient("7", url, TOKEN) as client:
            return [e async for e in client.events(timeout=timeout)]

    return asyncio.run(run())


@CLIENTS
def test_event_polls_answered_at_once_are_paced(make: Callable[..., Any]) -> None:
    """Each poll of an events cursor is a call of its own: their pacing is the
    client's, not the call's (769 polls a second before); a poll of a running job
    answered at once with nothing (no controller does: a proxy) is asked again only
    after a second (20 a second before)."""
    _EventsAtOnce.state, _EventsAtOnce.paths = "RUN", []
    for url in _serve(_EventsAtOnce):
        assert _read_events(make, url, 2.5) == []
    polls = [p for p in _EventsAtOnce.paths if "/events?" in p]
    assert 2 <= len(polls) <= 4, _EventsAtOnce.paths


@CLIENTS
@pytest.mark.parametrize("state", ["EXIT", "DONE"])
def test_events_end_once_the_job_ended_and_nothing_is_left(
    make: Callable[..., Any], state: str
) -> None:
    """A job that ended without a job_ended event to read (it never resized, or the
    reader is past it): the cursor ends, without a timeout (polled for ever before)."""
    _EventsAtOnce.state, _EventsAtOnce.paths = state, []
    for url in _serve(_EventsAtOnce):
        began = time.monotonic()
        # A timeout only so that the test ends without the end: it is the job's.
        assert _read_events(make, url, 3.0) == []
        assert time.monotonic() - began < 1.0
    kinds = [p.split("?")[0].rsplit("/", 1)[1] for p in _EventsAtOnce.paths]
    assert kinds == ["events", "wait", "events"]


_SETTLED = (
    b'{"job_id": "7", "phase": "IDLE", "version": 3, "tasks": [{"id": 0, "host": "h1"}], '
    b'"min_tasks": 1, "max_tasks": 4, "pending": null, "in_flight": null, "done": true}'
)


@CLIENTS
def test_a_long_poll_is_given_its_own_limit_not_the_clients(make: Callable[..., Any]) -> None:
    """A poll the controller holds longer than the client's default limit is answered
    (a long poll allows its length and 10 s more): the async client cut it at its own
    limit for a while, a "loaded controller" taken for a dead one."""
    with answering(_SETTLED, delay=1.5) as stub:
        if make is _sync:
            alloc = ResizeClient("7", Client(stub.url, TOKEN, timeout=1.0)).wait(0, timeout=3.0)
        else:

            async def run() -> Any:
                async with AsyncResizeClient("7", stub.url, TOKEN, timeout=1.0) as client:
                    return await client.wait(0, timeout=3.0)

            alloc = asyncio.run(run())
        assert alloc.version == 3


_BAD_INPUTS = {
    "port out of range": ("7", "http://127.0.0.1:99999"),
    "port 65536": ("7", "http://127.0.0.1:65536"),
    "port negative": ("7", "http://127.0.0.1:-1"),
    "port not a number": ("7", "http://127.0.0.1:abc"),
    "unclosed IPv6 host": ("7", "http://[::1"),
    "no scheme": ("7", "127.0.0.1:9"),
    "ftp": ("7", "ftp://127.0.0.1:9/"),
    "job id too long": ("1" * 100_000, "http://127.0.0.1:9"),
    "job id not printable": ("7\n", "http://127.0.0.1:9"),
    "job id empty": ("", "http://127.0.0.1:9"),
}


def _outcome(make: Callable[..., Any], job_id: str, url: str) -> type[BaseException] | None:
    try:
        if make is _sync:
            ResizeClient(job_id, Client(url, TOKEN, timeout=2)).allocation()
        else:

            async def run() -> None:
                async with AsyncResizeClient(job_id, url, TOKEN, timeout=2) as client:
                    await client.allocation()

            asyncio.run(run())
    except BaseException as exc:
        return type(exc)
    return None


@pytest.mark.parametrize("case", list(_BAD_INPUTS))
def test_both_clients_raise_the_same_errors_for_bad_inputs(case: str) -> None:
    """The async client raised an ExceptionGroup(OverflowError) for a port out of
    range, httpx.InvalidURL for an unclosed IPv6 host or a long job id, where the sync
    one raised Unreachable (or was refused 400 by the controller)."""
    job_id, url = _BAD_INPUTS[case]
    expected = ValueError if case.startswith("job id") else Unreachable
    assert _outcome(_sync, job_id, url) is expected
    assert _outcome(_async, job_id, url) is expected


def test_the_job_id_limit_is_the_controllers() -> None:
    from xce_resize_plugin.core.models import MAX_JOB_ID
    from xce_resize_plugin.injob import protocol

    assert protocol.MAX_JOB_ID == MAX_JOB_ID
    ResizeClient("7" * MAX_JOB_ID, Client("http://127.0.0.1:9", TOKEN))


def _drive(cursor: Any, clock: list[float], answers: list[Any]) -> tuple[list[Any], list[str]]:
    """One ``cursor.poll()`` driven by hand on a fake clock: each long poll is held by
    the controller for the whole time it asks; each answer is the next of ``answers``
    (a :class:`RemoteError` is a refusal)."""
    from xce_resize_plugin.injob.protocol import Exchange

    exchange = Exchange(cursor.poll())
    sent: list[str] = []
    while (request := exchange.next_request()) is not None:
        clock[0] += exchange.pause()
        sent.append(request.path)
        if request.path_for is not None:
            clock[0] += float(request.path.rsplit("=", 1)[1])  # held for all of it
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            clock[0] += exchange.refused(answer)
        else:
            exchange.answered(answer)
    return exchange.result, sent


def test_a_poll_sent_again_is_not_taken_for_one_answered_early(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A poll after one answered at once waits first; refused as busy, it is sent again
    at once, and the controller holding it for its whole time is not an early answer
    (the first wait counted twice made it one, and the next poll waited again)."""
    from xce_resize_plugin.injob import protocol
    from xce_resize_plugin.rest.client import RemoteError

    clock = [1000.0]
    monkeypatch.setattr(protocol.time, "monotonic", lambda: clock[0])
    cursor = protocol.EventCursor("/v1/jobs/7", None, None)
    running = {"job_state": "RUN"}
    # Answered at once with nothing on a running job: the next poll waits first.
    exchange = protocol.Exchange(cursor.poll())
    request = exchange.next_request()
    assert request is not None
    exchange.answered([])
    assert exchange.next_request() is not None  # the look at the job's state
    exchange.answered(running)
    assert exchange.next_request() is None and cursor._delay == protocol.BUSY_WAIT
    busy = RemoteError("XCE_TOO_MANY_REQUESTS", "busy", 429, retry_after=2)
    found, sent = _drive(cursor, clock, [busy, [], running])
    assert found == [] and len(sent) == 3, sent
    assert cursor._delay == 0.0, "a poll held for its whole time was taken as early"
    found, sent = _drive(cursor, clock, [[{"seq": 1, "type": "grown"}]])
    assert found == [{"seq": 1, "type": "grown"}] and cursor.after == 1
