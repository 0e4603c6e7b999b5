"""The REST client: an answer cut off mid-body (a controller killed while it wrote it)
is an unknown outcome, :class:`Unreachable`, like a refused connection — never an
exception of the HTTP library that a caller does not expect."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest

from xce_resize_plugin.errors import Unreachable
from xce_resize_plugin.rest.client import Client, RemoteError


def _serve_once(answer: bytes) -> Iterator[str]:
    """A server on loopback that reads one request, writes ``answer`` and closes."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)

    def run() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.recv(65536)
            conn.sendall(answer)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        thread.join(5)
        listener.close()


@pytest.fixture
def truncated_ok() -> Iterator[str]:
    yield from _serve_once(
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 198\r\n"
        b'\r\n{"job_id": '
    )


@pytest.fixture
def truncated_refusal() -> Iterator[str]:
    yield from _serve_once(
        b"HTTP/1.1 409 Conflict\r\nContent-Type: application/problem+json\r\n"
        b'Content-Length: 300\r\n\r\n{"code": "LSBE'
    )


def test_an_answer_cut_off_mid_body_is_unreachable(truncated_ok: str) -> None:
    with pytest.raises(Unreachable, match=r"127\.0\.0\.1"):
        Client(truncated_ok, "t", timeout=5).call("GET", "/v1/jobs/1/resize")


def test_a_refusal_cut_off_mid_body_keeps_its_status(truncated_refusal: str) -> None:
    with pytest.raises(RemoteError) as info:
        Client(truncated_refusal, "t", timeout=5).call("DELETE", "/v1/jobs/1/resize/pending")
    assert info.value.http_status == 409
    assert info.value.code == "HTTP_409"
