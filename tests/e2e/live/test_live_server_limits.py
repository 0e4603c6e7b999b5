"""What the live controller's servers do when clients take more connections than they
have descriptors for (docs/live-controller.md, "Connections and descriptors"): the
controller and the agents raise their soft descriptor limit at start, and a crowd of
connections beyond what they keep for their own work is answered 503 at once, never
an ``accept()`` out of descriptors, while a request after the crowd is served. And
what their listening socket gives each connection: TCP_NODELAY."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import errno
import json
import os
import resource
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from xce_resize_plugin.controllers.live.agent_client import AgentAuth
from xce_resize_plugin.controllers.live.fd_limits import MAX_NOFILE, connection_limits
from xce_resize_plugin.controllers.live.tasks import ensure_secret
from xce_resize_plugin.controllers.live.worker import worker_dir
from xce_resize_plugin.injob.aio import AsyncResizeClient
from xce_resize_plugin.injob.protocol import Request
from xce_resize_plugin.journal.lmdb_env import private_dir
from xce_resize_plugin.rest.client import Client, RemoteError
from xce_resize_plugin.testing.live import ALICE, LiveCluster, wait_until

#: A soft limit as low as a site's could be; the crowd is well beyond it.
LOW = 256
CROWD = 400
#: What "at once" means here: the header deadline (10 s) is what a client waited for
#: without the limits, while the crowd's connections held every descriptor.
QUICK = 2.0
#: What asyncio logs for each accept() that fails for want of a descriptor.
ACCEPT_FAILED = ("out of system resource", "Too many open files")


def open_files(pid: int) -> tuple[int, int]:
    """The soft and hard ``Max open files`` of process ``pid`` (/proc/PID/limits)."""
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            soft, hard = line.split()[3:5]
            return int(soft), int(hard)
    raise AssertionError(f"no open files limit for {pid}")


def limited(soft: int, hard: int | None = None) -> Any:
    """A ``preexec_fn`` that starts a process with these descriptor limits."""

    def set_limits() -> None:
        current = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, current if hard is None else hard))

    return set_limits


def start_limited(live: LiveCluster, soft: int, hard: int | None = None) -> subprocess.Popen[bytes]:
    """Start ``live``'s controller under these descriptor limits; the fixture kills
    it, and its agents, by their pids."""
    return live.start(preexec_fn=limited(soft, hard))


def crowd(port: int, count: int) -> ExitStack:
    """``count`` connections to ``port`` that send nothing (clients without a token
    may hold theirs up to the header deadline); closed with the stack."""
    stack = ExitStack()
    for _ in range(count):
        sock = stack.enter_context(closing(socket.create_connection(("127.0.0.1", port))))
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\0" * 8)
    return stack


def timed(fn: Any) -> tuple[Any, float]:
    started = time.monotonic()
    return fn(), time.monotonic() - started


def served(client: Client) -> Any:
    """``GET /v1/jobs``, or ``None`` while the controller answers 503."""
    try:
        return client.call("GET", "/v1/jobs")
    except RemoteError as exc:
        if exc.http_status != 503:
            raise
        return None


def test_the_controller_raises_its_soft_descriptor_limit(resize_live_factory: Any) -> None:
    live: LiveCluster = resize_live_factory({"h1": 1})
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard <= LOW:
        pytest.skip(f"the hard descriptor limit ({hard}) leaves nothing to raise")
    proc = start_limited(live, LOW)
    want = min(hard, MAX_NOFILE) if hard != resource.RLIM_INFINITY else MAX_NOFILE
    assert open_files(proc.pid) == (want, hard)
    raised = f"raised the soft limit of open files from {LOW} to {want}"
    assert live.logs().count(raised) == 1, live.logs()
    # Its agents inherit it (and would raise it themselves: the next test).
    agent = json.loads((live.state / "workers" / "h1" / "worker.json").read_text())
    assert open_files(agent["pid"])[0] == want


@dataclass
class Agent:
    """An agent started by hand: its state directory, host, registration and log."""

    state: Path
    host: str
    out: Path

    def registration(self) -> dict[str, Any]:
        path = worker_dir(self.state, self.host) / "worker.json"
        wait_until(path.exists, 20, "the agent registers")
        found: dict[str, Any] = json.loads(path.read_text())
        return found


@pytest.fixture
def start_agent(tmp_path: Path) -> Iterator[Callable[..., Agent]]:
    """``start_agent(soft, hard=None)``: an agent for ``h1`` started by hand (no
    controller) under these descriptor limits; killed by its pid at the end."""
    started: list[subprocess.Popen[bytes]] = []

    def start(soft: int, hard: int | None = None) -> Agent:
        state = tmp_path / "state"
        private_dir(state)
        private_dir(state / "workers")
        ensure_secret(state)
        worker_dir(state, "h1").mkdir(parents=True)
        agent = Agent(state, "h1", tmp_path / "worker.out")
        argv = [sys.executable, "-m", "xce_resize_plugin", "worker", "--host", "h1"]
        with open(agent.out, "wb") as out:
            started.append(
                subprocess.Popen(
                    [*argv, "--state-dir", str(state)],
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    cwd=str(state),
                    preexec_fn=limited(soft, hard),
                )
            )
        return agent

    try:
        yield start
    finally:
        for proc in started:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGKILL)
            proc.wait(10)


def test_an_agent_started_by_hand_raises_its_soft_descriptor_limit(
    start_agent: Callable[..., Agent],
) -> None:
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard <= LOW:
        pytest.skip(f"the hard descriptor limit ({hard}) leaves nothing to raise")
    agent = start_agent(LOW)
    pid = agent.registration()["pid"]
    want = min(hard, MAX_NOFILE) if hard != resource.RLIM_INFINITY else MAX_NOFILE
    assert open_files(pid) == (want, hard)
    log = agent.out.read_text()
    assert log.count(f"raised the soft limit of open files from {LOW} to {want}") == 1, log


def test_a_crowd_beyond_the_descriptors_is_refused_at_once_and_nobody_is_locked_out(
    resize_live_factory: Any,
) -> None:
    live: LiveCluster = resize_live_factory({"h1": 1})
    # Soft and hard limit alike: the controller cannot raise it, the crowd exceeds it.
    proc = start_limited(live, LOW, LOW)
    assert open_files(proc.pid) == (LOW, LOW)
    limits = connection_limits(LOW, hosts=1)
    client = Client(live.url(), ALICE, timeout=30)
    with crowd(live.port, CROWD):
        # The crowd holds every connection the controller gives: the next client is
        # told 503 at once (uvicorn's answer) rather than wait for a descriptor.
        answer, took = timed(lambda: httpx.get(live.url("/v1/jobs"), timeout=30))
        assert (answer.status_code, answer.headers.get("connection")) == (503, "close")
        assert took < QUICK, took
        with pytest.raises(RemoteError) as refused:
            client.call("GET", "/v1/jobs")
        assert (refused.value.http_status, refused.value.code) == (503, "HTTP_503")
        # Its descriptors beyond the guard stayed free for its own work.
        assert len(os.listdir(f"/proc/{proc.pid}/fd")) <= limits.guard + 1
    # The crowd gone (the controller sees its connections close an instant later),
    # everybody is served again, at once.
    jobs, took = timed(lambda: wait_until(lambda: served(client), QUICK, "served again"))
    assert jobs == {"jobs": []}, jobs
    live.ok("POST", "/v1/jobs", ALICE, {"command": ["true"]})
    log = live.logs()
    assert not [s for s in ACCEPT_FAILED if s in log], log[-3000:]
    # The refusals are said, a line now and then rather than one each.
    assert 1 <= log.count("out of connections") <= 3, log[-3000:]


def test_a_burst_of_requests_gets_answers_not_resets(resize_live_factory: Any) -> None:
    live: LiveCluster = resize_live_factory({"h1": 1})
    start_limited(live, LOW, LOW)

    async def burst() -> list[int | str]:
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
        async with httpx.AsyncClient(limits=limits, timeout=30) as client:

            async def one() -> int | str:
                try:
                    return (await client.get(live.url("/v1/health"))).status_code
                except httpx.TransportError as exc:
                    return type(exc).__name__

            return list(await asyncio.gather(*(one() for _ in range(CROWD))))

    answers, took = timed(lambda: asyncio.run(burst()))
    # Each is answered, served or refused 503, and quickly: none waits for a
    # descriptor, none is cut off without an answer. (All may be refused: uvicorn
    # counts open connections, and the whole burst may be open before any request
    # is read.)
    assert set(answers) <= {200, 503}, sorted(map(str, answers))
    assert took < 5 * QUICK, (answers.count(200), took)
    # Served again once the burst's connections are closed.
    wait_until(lambda: live.call("GET", "/v1/health").status_code == 200, QUICK, "served")
    log = live.logs()
    assert not [s for s in ACCEPT_FAILED if s in log], log[-3000:]


def test_an_agent_refuses_a_crowd_at_once(start_agent: Callable[..., Agent]) -> None:
    """Every process on the host reaches an agent's port: a crowd there is refused
    without the agent running out of descriptors."""
    agent = start_agent(LOW, LOW)
    port = agent.registration()["port"]
    secret = (agent.state / "workers" / "secret").read_text().strip()
    ping = f"http://127.0.0.1:{port}/v1/ping"
    auth = AgentAuth(secret)
    with crowd(port, CROWD):
        # Refused before any answer (no signature to check): a broken connection.
        answer, took = timed(lambda: httpx.get(ping, timeout=30))
        assert answer.status_code == 503 and took < QUICK, (answer, took)
    answer, took = timed(lambda: httpx.get(ping, auth=auth, timeout=30))
    assert answer.status_code == 200 and took < QUICK, (answer, took)
    log = agent.out.read_text()
    assert not [s for s in ACCEPT_FAILED if s in log], log[-3000:]


def test_the_sites_request_limit_is_each_users(resize_live_factory: Any) -> None:
    """``[controller] request_limit`` replaces the REST layer's default of 256."""
    live: LiveCluster = resize_live_factory({"h1": 1}, controller="request_limit = 2")
    live.start()
    assert "each user at most 2 requests" in live.logs()
    job = live.ok("POST", "/v1/jobs", ALICE, {"command": ["sleep", "600"]})
    live.running(job["id"], 1)
    wait = f"/v1/jobs/{job['id']}/kv/addr?wait=30"
    auth = {"Authorization": f"Bearer {job['token']}"}

    async def scenario() -> None:
        async with httpx.AsyncClient(base_url=live.url(), timeout=60) as client:

            def send() -> asyncio.Task[httpx.Response]:
                return asyncio.create_task(client.get(wait, headers=auth))

            waits = [send(), send()]
            deadline = time.monotonic() + 20
            while True:  # until the controller holds both: the next one is refused
                r = await client.get(f"/v1/jobs/{job['id']}", headers=auth)
                if r.status_code == 429 and not any(w.done() for w in waits):
                    break
                assert time.monotonic() < deadline, r.text
                await asyncio.sleep(0.1)
                # A wait that came while the probe was in progress was the one refused
                # (the probe counts too): it is sent again; nothing else ends one.
                for i, w in enumerate(waits):
                    if w.done():
                        assert w.result().status_code == 429, w.result().text
                        waits[i] = send()
            assert "user alice has 2 requests in progress, at most 2" in r.json()["detail"]
            # Both in-job transports read the refusal's Retry-After (the pause before
            # they ask again: xce_resize_plugin/injob/protocol.py).
            with pytest.raises(RemoteError) as refused:
                await asyncio.to_thread(
                    Client(live.url(), job["token"]).call, "GET", f"/v1/jobs/{job['id']}"
                )
            assert refused.value.http_status == 429 and refused.value.retry_after == 1
            async with AsyncResizeClient(job["id"], live.url(), job["token"]) as aio:
                with pytest.raises(RemoteError) as refused:
                    await aio._send(Request("GET", f"/v1/jobs/{job['id']}"))
            assert refused.value.http_status == 429 and refused.value.retry_after == 1
            for w in waits:
                w.cancel()

    asyncio.run(scenario())


#: pidfd_getfd(2)'s number, the same on every Linux architecture (Python has no call).
SYS_PIDFD_GETFD = 438


def server_end(pid: int, conn: socket.socket) -> socket.socket:
    """Process ``pid``'s end of the connection ``conn``, duplicated into this one
    (pidfd_getfd(2): the tests run as root), to read the server's socket options."""
    libc = ctypes.CDLL(None, use_errno=True)
    pidfd = os.pidfd_open(pid)
    try:
        for fd in map(int, os.listdir(f"/proc/{pid}/fd")):
            dup = libc.syscall(SYS_PIDFD_GETFD, pidfd, fd, 0)
            if dup < 0:  # closed meanwhile; anything else (EPERM) fails the test
                assert ctypes.get_errno() == errno.EBADF, os.strerror(ctypes.get_errno())
                continue
            try:
                sock = socket.socket(fileno=dup)
            except OSError:  # not a socket
                os.close(dup)
                continue
            with contextlib.suppress(OSError):  # (a listening or unix socket: no peer)
                if sock.family == socket.AF_INET and sock.getpeername() == conn.getsockname():
                    return sock
            sock.close()
    finally:
        os.close(pidfd)
    raise AssertionError(f"process {pid} holds no end of {conn}")


def test_the_servers_answer_without_waiting_for_the_clients_ack(
    resize_live_factory: Any,
) -> None:
    """The controller's and an agent's connections have TCP_NODELAY (asyncio sets it
    only when the listening socket says IPPROTO_TCP: fd_limits.listener). uvicorn writes
    an answer's headers and body apart; without it the body waited for the client's
    delayed ACK, about 44 ms a request on a kept-alive connection (docs/performance.md).
    Read on the servers' own sockets, not timed."""
    live: LiveCluster = resize_live_factory({"h1": 1})
    proc = live.start()
    agent = json.loads((live.state / "workers" / "h1" / "worker.json").read_text())
    servers = {"controller": (proc.pid, live.port), "agent": (agent["pid"], agent["port"])}
    for name, (pid, port) in servers.items():
        with socket.create_connection(("127.0.0.1", port)) as conn:
            conn.sendall(b"GET /v1/health HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n")
            assert conn.recv(65536).startswith(b"HTTP/1.1 "), name  # accepted, answered
            with server_end(pid, conn) as served:
                assert served.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY), name
