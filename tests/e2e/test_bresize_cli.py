"""The real ``bresize`` process where its transport or its output fails: a script sees
only the exit codes docs/user-guide.md lists (0, 2, 141, 255), never a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.test_cli import closed_pipe_run
from tests.http_stub import answering

ROOT = Path(__file__).resolve().parents[2]
BRESIZE = str(Path(sys.executable).parent / "bresize")


def bresize(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {**os.environ, **env}
    environ.pop("XCE_JOB_TOKEN", None)
    if "XCE_TOKEN" not in env:
        environ.pop("XCE_TOKEN", None)
    return subprocess.run(
        [BRESIZE, *args], capture_output=True, text=True, env=environ, cwd=ROOT, timeout=60
    )


@pytest.fixture
def not_a_controller() -> Iterator[str]:
    """Answers every request 200 with a web page, as a proxy or another service might."""
    with answering(b"<html><body>Welcome</body></html>", "text/html") as stub:
        yield stub.url


@pytest.mark.parametrize(
    ("env", "explanation"),
    [
        ({"XCE_CONTROLLER_URL": "controller"}, "'controller': unknown url type"),
        ({"XCE_CONTROLLER_URL": "http://[::1"}, "Invalid IPv6 URL"),
        # A token no HTTP header can carry is refused before connecting.
        (
            {"XCE_CONTROLLER_URL": "http://127.0.0.1:9", "XCE_TOKEN": "tok\u20ac"},
            "the token holds a character no HTTP header can carry",
        ),
        # A CRLF token file: the token is not shown (urllib's message quotes it).
        (
            {"XCE_CONTROLLER_URL": "http://127.0.0.1:9", "XCE_TOKEN": "s3cr3t\r"},
            "the token holds a character no HTTP header can carry",
        ),
    ],
)
def test_a_request_urllib_refuses_is_unreachable_not_a_traceback(
    env: dict[str, str], explanation: str
) -> None:
    for argv in (["request", "4", "12"], ["release", "all", "12"], ["cancel", "12"]):
        proc = bresize(*argv, **env)
        assert (proc.returncode, proc.stdout) == (255, ""), proc.stderr
        assert proc.stderr.startswith("Cannot reach the controller: "), proc.stderr
        assert explanation in proc.stderr and "Traceback" not in proc.stderr
        assert "s3cr3t" not in proc.stderr


def test_an_answer_that_is_not_json_is_unreachable_not_a_traceback(
    not_a_controller: str,
) -> None:
    proc = bresize("request", "4", "12", XCE_CONTROLLER_URL=not_a_controller)
    assert (proc.returncode, proc.stdout) == (255, ""), proc.stderr
    assert proc.stderr == (
        f"Cannot reach the controller: {not_a_controller}: the answer is not JSON: "
        "Expecting value: line 1 column 1 (char 0)\n"
    )
    # The client commands share the client: the same message, their exit 255.
    environ = {**os.environ, "XCE_CONTROLLER_URL": not_a_controller}
    exe = str(Path(sys.executable).parent / "xce-resize")
    for argv in (["jobs"], ["target", "12", "3"], ["host", "down", "h1"]):
        proc = subprocess.run(
            [exe, *argv], capture_output=True, text=True, env=environ, cwd=ROOT, timeout=60
        )
        assert proc.returncode == 255, (argv, proc.stderr)
        assert "the answer is not JSON" in proc.stderr and "Traceback" not in proc.stderr


def test_an_empty_controller_url_is_the_default_as_an_empty_token_is_none() -> None:
    from xce_resize_plugin.rest.client import DEFAULT_URL, Client

    saved = {k: os.environ.get(k) for k in ("XCE_CONTROLLER_URL", "XCE_TOKEN", "XCE_JOB_TOKEN")}
    try:
        os.environ.update(XCE_CONTROLLER_URL="", XCE_TOKEN="", XCE_JOB_TOKEN="")
        client = Client.from_env()
        assert (client.url, client.token) == (DEFAULT_URL, None)
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@pytest.mark.parametrize(
    "argv",
    [
        ["request", "4,2", "12"],  # a usage error
        ["cancel", "abc"],  # a bad job ID
        ["request", "1", "12"],  # no controller
    ],
)
def test_a_closed_stderr_pipe_ends_the_command_quietly(argv: list[str]) -> None:
    """``bresize ... 2>&1 | head -0``: the status of a C command killed by SIGPIPE, as
    for a closed stdout (tests/e2e/test_cli.py), not 1 from a swallowed traceback."""
    env = {**os.environ, "XCE_CONTROLLER_URL": "http://127.0.0.1:9"}
    assert closed_pipe_run(["bresize", *argv], "stderr", env) == (141, "")


@pytest.mark.parametrize(
    ("line", "status"),
    [
        ('"$0" cancel abc 2>&-', 255),  # a bad job ID
        ('"$0" request 4,2 12 2>&-', 2),  # a usage error
        ('"$0" -V >&-', 0),
    ],
)
def test_a_closed_descriptor_loses_the_text_not_the_status(line: str, status: int) -> None:
    """Started with stderr (or stdout) closed: the text is lost, as a C command's, and
    the status is the command's. An error never lands on stdout, where scripts read."""
    proc = subprocess.run(
        ["/bin/sh", "-c", line, BRESIZE], capture_output=True, text=True, cwd=ROOT, timeout=60
    )
    assert (proc.returncode, proc.stdout, proc.stderr) == (status, "", "")


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux)")
def test_a_full_standard_output_is_said_and_keeps_the_status() -> None:
    """``> /dev/full``: a traceback, exit 1. Now one line on stderr, and the status
    is the command's (0 for -V; for a request, 0 still means it was recorded)."""
    with open("/dev/full", "w") as full:
        proc = subprocess.run(
            [BRESIZE, "-V"], stdout=full, stderr=subprocess.PIPE, text=True, cwd=ROOT, timeout=60
        )
    assert (proc.returncode, proc.stderr) == (
        0,
        "bresize: standard output: cannot write (No space left on device)\n",
    )
