"""A stand-in for "something else answers at that address": an HTTP server in a thread
that answers every request with one status and body (200 by default), and records what
it was sent (the request line and headers). The tests of clients pointed at the wrong
place use it."""

from __future__ import annotations

import contextlib
import http.server
import threading
import time
from collections.abc import Iterator

from attrs import define, field


@define
class Stub:
    """The running stub: its URL and the requests it got."""

    url: str
    seen: list[bytes] = field(factory=list)


@contextlib.contextmanager
def answering(
    body: bytes,
    content_type: str = "application/json",
    status: int = 200,
    headers: dict[str, str] | None = None,
    delay: float = 0.0,
) -> Iterator[Stub]:
    """Serve ``body`` to every request on a free loopback port until the block ends."""
    stub = Stub("")

    class Handler(http.server.BaseHTTPRequestHandler):
        def _answer(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            stub.seen.append(self.requestline.encode("latin-1") + bytes(self.headers))
            time.sleep(delay)  # as a controller holding a long poll
            self.send_response(status)
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = do_PUT = do_DELETE = _answer

        def log_message(self, *args: object) -> None:
            """Quiet."""

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    stub.url = f"http://127.0.0.1:{server.server_address[1]}"
    # A short poll: shutdown() waits for it (0.5 s by default, at every test).
    thread = threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True)
    thread.start()
    try:
        yield stub
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)
