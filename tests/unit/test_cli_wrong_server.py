"""A client command pointed at another service (``XCE_CONTROLLER_URL`` wrong) that
answers JSON of another shape says so in one line, exit 255 as for no answer, instead
of a traceback (a ``KeyError`` from ``hosts`` and ``submit``)."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator

import pytest

from xce_resize_plugin.cli.main import main


class _Other(http.server.BaseHTTPRequestHandler):
    def _answer(self) -> None:
        body = b'{"status": "ok"}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_PUT = do_DELETE = _answer

    def log_message(self, *args: object) -> None:
        """Quiet."""


@pytest.fixture
def other_service(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Other)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    monkeypatch.setenv("XCE_CONTROLLER_URL", url)
    monkeypatch.setenv("XCE_TOKEN", "tok")
    try:
        yield url
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@pytest.mark.parametrize(
    ("argv", "missing"),
    [(["hosts"], "'hosts'"), (["submit", "--", "sleep", "1"], "'id'")],
)
def test_an_answer_of_another_shape_is_one_line(
    other_service: str, argv: list[str], missing: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 255
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert f"{other_service}: the answer is not one an xce-resize controller gives" in err
    assert f"KeyError: {missing}" in err and "is XCE_CONTROLLER_URL right?" in err
