"""The live controller's server as a site runs it (a real `xce-resize controller`
process): what ``GET /v1/cluster`` shows to whom; listening on port 0; the deadlines
for receiving a request, checked with raw sockets against the controller and an agent."""

from __future__ import annotations

import json
import select
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx

from xce_resize_plugin.testing.live import (
    ALICE,
    BOB,
    ROOT,
    LiveCluster,
    controller_command,
    wait_until,
)


def test_cluster_details_are_for_administrators(resize_live_factory: Any) -> None:
    """A user (or a job's token) sees the hosts' slots and use, whether each agent is
    ready, and their own usage; not bob's usage, not the agents' pids and ports, not
    the invariant check. The administrator sees all of it."""
    live: LiveCluster = resize_live_factory(
        {"h1": 2, "h2": 2}, limits="[limits]\nuser_slots = { carol = 3 }"
    )
    live.start()
    bobs = live.submit(BOB, tasks=2)
    mine = live.ok("POST", "/v1/jobs", ALICE, {"command": ["sleep", "600"], "tasks": 1})
    live.running(bobs, 2)
    live.running(mine["id"], 1)

    full = live.cluster()
    assert set(full["users"]) == {"alice", "bob", "carol"}
    assert all(isinstance(h["worker"]["pid"], int) for h in full["hosts"].values())
    assert all(isinstance(h["worker"]["port"], int) for h in full["hosts"].values())
    assert full["problems"] == []

    for token in (ALICE, mine["token"]):
        seen = live.ok("GET", "/v1/cluster", token)
        assert seen == {
            "epoch": full["epoch"],
            "hosts": {
                name: {"slots": h["slots"], "used": h["used"], "worker": {"ready": True}}
                for name, h in full["hosts"].items()
            },
            "users": {"alice": {"slots_in_use": 1, "limit": None}},
        }
    assert live.ok("GET", "/v1/cluster", BOB)["users"] == {
        "bob": {"slots_in_use": 2, "limit": None}
    }
    # A user who holds nothing and has no limit still sees their own (empty) entry.
    assert live.call("DELETE", f"/v1/jobs/{bobs}", BOB).status_code == 202
    wait_until(lambda: live.job(bobs)["state"] == "EXIT", 10, "bob's job killed")
    assert live.ok("GET", "/v1/cluster", BOB)["users"] == {
        "bob": {"slots_in_use": 0, "limit": None}
    }


def _start_on_port_0(live: LiveCluster, ready: Path) -> subprocess.Popen[bytes]:
    """The controller with ``listen = "127.0.0.1:0"`` in its configuration, started as a
    site starts it (cleaned up by the fixture, by pid)."""
    text = live.config.read_text()
    live.config.write_text(
        text.replace(f'listen = "127.0.0.1:{live.port}"', 'listen = "127.0.0.1:0"')
    )
    log = open(live.tmp / "controller-0.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen(
        [*controller_command(live.config), "--ready-file", str(ready)],
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    log.close()
    live.procs.append(proc)
    return proc


def test_listen_on_port_0_reports_the_bound_port(resize_live_factory: Any) -> None:
    """``listen = "127.0.0.1:0"`` is accepted; the port the system chose is in the
    start-up line and the ready file, serves, and is the URL the tasks get."""
    live: LiveCluster = resize_live_factory({"h1": 1})
    ready = live.tmp / "ready.json"
    proc = _start_on_port_0(live, ready)

    def written() -> dict[str, Any] | None:
        assert proc.poll() is None, (live.tmp / "controller-0.log").read_text()
        return json.loads(ready.read_text()) if ready.exists() else None

    info = wait_until(written, 20, "the ready file")
    port = info["port"]
    assert isinstance(port, int) and port > 0
    assert info["url"] == f"http://127.0.0.1:{port}" and info["listen"] == f"127.0.0.1:{port}"
    assert isinstance(info["epoch"], int) and isinstance(info["time"], float)
    log = (live.tmp / "controller-0.log").read_text()
    assert f"serving http://127.0.0.1:{port} " in log
    live.port = port
    assert live.ok("GET", "/v1/health")["status"] == "ok"
    job = live.submit(command=["/bin/sh", "-c", 'echo "$XCE_CONTROLLER_URL"; exec sleep 600'])
    out = live.state / "jobs" / job / "task-0.out"
    assert wait_until(lambda: out.exists() and out.read_text().strip()) == info["url"]


# -- deadlines for receiving a request -----------------------------------------------------

#: How long a raw client waits for the server before the test gives up: a bound that
#: keeps a broken server from hanging the test, far above the deadlines set here.
PATIENCE = 30.0
#: The deadlines the tests set, short so that they pass quickly.
DEADLINES = "header_timeout = 0.5\nbody_timeout = 0.5\n"


def _short_deadlines(live: LiveCluster) -> None:
    text = live.config.read_text()
    live.config.write_text(text.replace("[controller]\n", f"[controller]\n{DEADLINES}", 1))


def _connect(port: int, first: bytes = b"") -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=PATIENCE)
    if first:
        sock.sendall(first)
    return sock


def _closed(sock: socket.socket) -> bool:
    """Whether the server closes ``sock`` (reading what it sends until then); raises
    ``TimeoutError`` if it neither closes nor sends within :data:`PATIENCE`."""
    with sock:
        try:
            while sock.recv(65536):
                pass
        except ConnectionResetError:
            pass
    return True


def _trickle_until_closed(sock: socket.socket) -> bool:
    """Send a header a byte every 50 ms; True once the server closed the connection."""
    deadline = time.monotonic() + PATIENCE
    with sock:
        sock.sendall(b"GET /v1/health HTTP/1.1\r\nHost: x\r\nX-Pad: ")
        while time.monotonic() < deadline:
            try:
                sock.sendall(b"a")
            except (BrokenPipeError, ConnectionResetError):
                return True
            readable, _, _ = select.select([sock], [], [], 0.05)
            if readable:
                try:
                    return sock.recv(1) == b""
                except ConnectionResetError:
                    return True
    return False


def _answer(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """The status, headers and body of the one answer on ``sock``, which the server
    then closes."""
    data = b""
    with sock:
        while chunk := sock.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    status_line, *lines = head.decode().split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in lines)
    return int(status_line.split()[1]), headers, body


def test_a_half_sent_request_is_cut_off(resize_live_factory: Any) -> None:
    """With header_timeout and body_timeout set, the controller and its agents close a
    connection whose request headers do not come (half a request line, nothing at all,
    a header trickled a byte at a time, after a kept-alive answer), and answer 408 to a
    body that stops half way; a normal client, and a long poll that outlasts both
    deadlines, are served."""
    live: LiveCluster = resize_live_factory({"h1": 2})
    _short_deadlines(live)
    live.start()
    assert _closed(_connect(live.port, b"GET /v1/heal"))
    assert _closed(_connect(live.port))
    assert _trickle_until_closed(_connect(live.port))
    kept = _connect(live.port, b"GET /v1/health HTTP/1.1\r\nHost: x\r\n\r\n")
    assert kept.recv(65536).startswith(b"HTTP/1.1 200 ")
    kept.sendall(b"GET /v1/heal")
    assert _closed(kept)
    agent = json.loads((live.state / "workers" / "h1" / "worker.json").read_text())
    assert _closed(_connect(agent["port"], b"GET /v1/pi"))
    assert _trickle_until_closed(_connect(agent["port"]))

    job = live.submit(min_tasks=1, max_tasks=2, resizable=True, alloc={"h1": 1})
    live.running(job, 1)
    for path in ("/v1/jobs", f"/v1/jobs/{job}/resize/grow"):
        head = (
            f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {ALICE}\r\n"
            "Content-Type: application/json\r\nContent-Length: 100\r\n\r\n"
        )
        status, headers, body = _answer(_connect(live.port, head.encode() + b'{"tasks": '))
        assert status == 408 and headers["connection"] == "close", body
        assert headers["content-type"] == "application/problem+json"
        assert json.loads(body)["code"] == "XCE_RESIZE_BODY_TIMEOUT"

    assert live.ok("GET", "/v1/jobs")["jobs"][0]["id"] == job
    assert live.grow(job, 1).status_code == 202
    live.idle(job, 1)
    wait = live.ok("GET", f"/v1/jobs/{job}/resize/wait?version=1&timeout=1.5")
    assert wait["done"] is False and wait["job_state"] == "RUN"


def test_a_stop_answers_the_long_polls_it_ends(resize_live_factory: Any) -> None:
    """A clean stop (SIGTERM) while clients wait on a job (its resize, its events, a key
    of its store) answers each 503 XCE_CONTROLLER_STOPPING within the server's graceful
    shutdown, as a stopping controller answers anything else: cut off at its end they
    got a plain 500, which the in-job API and Dask took for a refusal."""
    import concurrent.futures

    from tests.e2e.live.startup import stop_cleanly

    live: LiveCluster = resize_live_factory({"h1": 2})
    live.start()
    job_id = live.submit(tasks="1,2", alloc={"h1": 1}, resizable=True)
    version = live.running(job_id, 1)["version"]
    seen = live.ok("GET", f"/v1/jobs/{job_id}/events?after=0&timeout=0")
    after = seen[-1]["seq"] if seen else 0
    paths = [
        f"/v1/jobs/{job_id}/resize/wait?version={version}&timeout=30",
        f"/v1/jobs/{job_id}/events?after={after}&timeout=30",
        f"/v1/jobs/{job_id}/kv/nothing?wait=30",
    ]

    def wait(path: str) -> tuple[int, str]:
        r = httpx.get(live.url(path), headers={"Authorization": f"Bearer {ALICE}"}, timeout=40)
        try:
            return r.status_code, r.json().get("code", "")
        except ValueError:  # not a problem document: what a cut-off request gets
            return r.status_code, r.text[:60]

    with concurrent.futures.ThreadPoolExecutor(len(paths)) as pool:
        waits = [pool.submit(wait, p) for p in paths]
        time.sleep(1.0)  # each is waiting on the controller now
        assert not any(w.done() for w in waits), [w.result() for w in waits if w.done()]
        t0 = time.monotonic()
        stop_cleanly(live)
        answers = [w.result(timeout=30) for w in waits]
    assert answers == [(503, "XCE_CONTROLLER_STOPPING")] * len(paths), answers
    assert time.monotonic() - t0 < 15


def test_an_agent_imports_nothing_from_the_state_directory(resize_live_factory: Any) -> None:
    """The agents run ``python -m xce_resize_plugin worker`` in the state directory:
    without ``-P`` that directory comes first on the import path, and a package planted
    there (by whoever can write it) would run as root in every agent instead of ours."""
    live: LiveCluster = resize_live_factory({"h1": 1})
    planted = live.state / "xce_resize_plugin"
    planted.mkdir(parents=True)
    marker = live.tmp / "planted-ran"
    code = f"open({str(marker)!r}, 'w').close()\n"
    (planted / "__init__.py").write_text(code)
    (planted / "__main__.py").write_text(code)
    live.start()
    job_id = live.submit(tasks=1)
    live.running(job_id, 1)  # an agent of the package's own started the task
    assert not marker.exists()


def test_a_query_parameter_a_route_does_not_take_is_refused_and_changes_nothing(
    resize_live_factory: Any,
) -> None:
    """Every route refuses an unknown or repeated query parameter (a client that
    believes it filters must not get everything without a word), and a path with a
    trailing slash is an unknown path: 404, no redirect built from the Host header."""
    live: LiveCluster = resize_live_factory({"h1": 4})
    live.start()
    job_id = live.submit(tasks="1,2", initial=1, resizable=True)
    live.running(job_id, 1)
    for method, path, token in (
        ("GET", "/v1/jobs?user=bob", ALICE),
        ("GET", "/v1/cluster?x=1", ROOT),
        ("GET", f"/v1/jobs/{job_id}?verbose", ALICE),
        ("DELETE", f"/v1/jobs/{job_id}?force=1", ALICE),
        ("DELETE", f"/v1/jobs/{job_id}/resize/pending?now=1", ALICE),
    ):
        r = live.call(method, path, token)
        assert r.status_code == 400, (path, r.text)
        assert r.headers["content-type"] == "application/problem+json"
        assert "unknown query parameter" in r.json()["detail"], r.text
    r = live.call("GET", f"/v1/jobs/{job_id}/resize/wait?timeout=1&timeout=2", ALICE)
    assert r.status_code == 400 and "given twice" in r.json()["detail"]
    assert live.job(job_id)["state"] == "RUN"  # the refused DELETE killed nothing

    r = httpx.post(
        live.url(f"/v1/jobs/{job_id}/resize/grow/"),
        json={"tasks": 1},
        headers={"Authorization": f"Bearer {ALICE}", "Host": "evil.example:80"},
        follow_redirects=False,
        timeout=10,
    )
    assert r.status_code == 404 and "location" not in r.headers
    assert r.headers["content-type"] == "application/problem+json"
    assert live.phase(job_id) == "IDLE"  # nothing asked
