"""The worker agent's server: its HTTP routes and the process that serves them.

``xce-resize worker`` runs :func:`serve`: it takes the host's agent lock, kills what a
dead predecessor left behind, and serves :class:`~.worker.WorkerAgent` (what the agent
does and why, :mod:`.worker`) with uvicorn on an ephemeral loopback port, every call
and every answer signed with the secret the controller created (:mod:`.agent_auth`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from xce_resize_plugin.controllers.live import cgroups, fd_limits
from xce_resize_plugin.controllers.live.agent_auth import (
    HEADER,
    RESPONSE_HEADER,
    Keys,
    NotAuthorised,
    RequestCheck,
    sign_response,
)
from xce_resize_plugin.controllers.live.proc import FileLock, atomic_write, become_subreaper
from xce_resize_plugin.controllers.live.worker import Fenced, WorkerAgent, secret_path

if TYPE_CHECKING:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response

# The agent's one logger, whichever of its two modules logs (operators filter on it).
log = logging.getLogger(WorkerAgent.__module__)


def make_app(agent: WorkerAgent, secret: str, port: int) -> Starlette:
    """The agent's routes, for calls signed for ``port`` (:mod:`.agent_auth`). Sync
    handlers: Starlette runs them in its thread pool, which is what the blocking long
    poll needs."""
    from starlette.applications import Starlette
    from starlette.routing import Route

    keys = Keys(secret)
    checker = RequestCheck(keys, port)

    def guarded(fn: Any) -> Any:
        async def handler(request: Request) -> Response:
            try:
                signed = checker.check(
                    request.method, _target(request), request.headers.get(HEADER, ""), time.time()
                )
            except NotAuthorised as exc:
                # Unsigned: whoever sent it cannot check an answer anyway. The body is
                # not read (nor a long one waited for) before the signature holds.
                return _refuse("unauthorised", str(exc), 401)
            response = await _answer(request, signed[1], fn)
            response.headers[RESPONSE_HEADER] = sign_response(
                keys, signed[0], response.status_code, bytes(response.body)
            )
            return response

        return handler

    def ping(request: Request, data: Any) -> dict[str, Any]:
        return {"host": agent.host, "instance": agent.instance, "pid": os.getpid()}

    def snapshot(request: Request, data: Any) -> dict[str, Any]:
        return agent.snapshot(int(request.query_params.get("epoch", "0")))

    def events(request: Request, data: Any) -> dict[str, Any]:
        q = request.query_params
        return agent.wait_events(
            int(q.get("after", "0")), float(q.get("timeout", "5")), int(q.get("epoch", "0"))
        )

    def commands(request: Request, data: Any) -> dict[str, Any]:
        agent.execute(int(data["epoch"]), str(data["instance"]), list(data["commands"]))
        return {"ok": True, "seq": agent.seq}

    app = Starlette(
        routes=[
            Route("/v1/ping", guarded(ping), methods=["GET"]),
            Route("/v1/snapshot", guarded(snapshot), methods=["GET"]),
            Route("/v1/events", guarded(events), methods=["GET"]),
            Route("/v1/commands", guarded(commands), methods=["POST"]),
        ]
    )
    # As the controller's (rest/http.py, exact_paths): no redirect built from the
    # client's Host header for a path with a trailing slash; a 404.
    app.router.redirect_slashes = False
    return app


def _refuse(code: str, detail: str, status: int) -> JSONResponse:
    from starlette.responses import JSONResponse

    return JSONResponse({"code": code, "detail": detail}, status_code=status)


async def _answer(request: Request, digest: str, fn: Any) -> JSONResponse:
    """Run a signed call's handler ``fn`` (in the thread pool) on its checked body; its
    answer, or the refusal its error means."""
    from starlette.concurrency import run_in_threadpool
    from starlette.requests import ClientDisconnect
    from starlette.responses import JSONResponse

    try:
        body = await request.body()
    except ClientDisconnect:
        # The controller went away mid-call (a crash, a failover): nothing was done and
        # nobody reads the answer. Raised on, it wrote a traceback in worker.log.
        log.info("the controller's %s call was cut before its body", request.url.path)
        return _refuse("disconnected", "the call's body did not arrive", 400)
    try:
        RequestCheck.check_body(body, digest)
        data = json.loads(body) if body else {}
        return JSONResponse(await run_in_threadpool(fn, request, data))
    except NotAuthorised as exc:
        return _refuse("unauthorised", str(exc), 401)
    except Fenced as exc:
        return _refuse("fenced", str(exc), 409)
    except LookupError as exc:
        return _refuse("instance", str(exc), 409)
    except (KeyError, ValueError, TypeError) as exc:
        return _refuse("bad_request", repr(exc), 400)
    except RuntimeError as exc:
        # No thread to run the call on ("can't start new thread": the agent's pids
        # budget, which its tasks share). Raised on, it ended the connection with an
        # unsigned 500 and a traceback in worker.log; the controller reconciles after
        # this answer as after a broken connection (tasks.py).
        log.warning("cannot serve %s: %s", request.url.path, exc)
        return _refuse("unavailable", f"the agent cannot serve this call now: {exc}", 503)


def _target(request: Request) -> str:
    """The path and query as sent (what the controller signed)."""
    path: bytes = request.scope.get("raw_path") or request.scope["path"].encode()
    query: bytes = request.scope.get("query_string", b"")
    return (path + b"?" + query if query else path).decode("latin-1")


def _only_agent(agent: WorkerAgent) -> FileLock | None:
    """The host's agent lock, held; ``None`` when another agent for the host holds it."""
    agent.dir.mkdir(parents=True, exist_ok=True)
    lock = FileLock(agent.dir / "lock")
    # A controller probing the lock holds it shared for an instant: retry briefly.
    deadline = time.monotonic() + 2.0
    while not lock.acquire():
        if time.monotonic() > deadline:
            return None
        time.sleep(0.02)
    # An agent that crashed left its registration: until this one writes its own, the
    # file would send the controller to a port that any process may have taken since.
    (agent.dir / "worker.json").unlink(missing_ok=True)
    return lock


def _listen() -> tuple[socket.socket, fd_limits.ConnectionLimits]:
    """The agent's listening socket, on an ephemeral loopback port, and what its
    connections may take of the descriptors (the limit raised first). Its port is open
    to every process on the host: a crowd of connections must not take the descriptors
    its tasks' launches and the controller's calls need."""
    limits = fd_limits.connection_limits(fd_limits.raise_nofile())
    sock = fd_limits.listener()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    fd_limits.guard(sock, limits)
    return sock, limits


def _containment(
    state_dir: Path, host: str, mode: str, pids_max: str | int
) -> cgroups.Containment | None:
    """The agent's cgroups as ``mode`` (``[worker] containment``) asks, said once in
    worker.log; ``None``: the ``/proc`` tracking alone. :class:`~.cgroups.Unavailable`
    when ``mode`` is ``"cgroup"`` and there are none."""
    if mode == "proc":
        log.info("containment: /proc tracking (containment = proc)")
        return None
    limit = cgroups.pids_limit(pids_max)
    try:
        found = cgroups.open_containment(state_dir, host, limit)
    except cgroups.Unavailable as exc:
        if mode == "cgroup":
            raise
        log.warning("containment: /proc tracking only, no cgroups: %s", exc)
        return None
    if limit is None:
        pids = "no pids.max (task_pids_max = max)"
    elif found.pids_where:
        pids = f"pids.max {limit} ({found.pids_where} pids controller)"
    else:
        pids = f"no pids controller: task_pids_max = {pids_max!r} is not applied"
    log.info("containment: a cgroup per task under %s; %s", found.root, pids)
    return found


def _start_agent(
    state_dir: Path, host: str, containment: str, task_pids_max: str | int
) -> tuple[WorkerAgent, FileLock] | int:
    """The host's agent, its lock held, its cgroups made, and what a dead predecessor
    left killed; or the exit status of an agent that cannot start."""
    agent = WorkerAgent(host, state_dir)
    lock = _only_agent(agent)
    if lock is None:
        print(f"xce-resize worker: an agent for {host} already runs", file=sys.stderr)
        return 3
    try:
        agent.cgroups = _containment(state_dir, host, containment, task_pids_max)
    except cgroups.Unavailable as exc:
        print(f"xce-resize worker: containment = cgroup, but {exc}", file=sys.stderr)
        lock.release()
        return 2
    agent.subreaper = become_subreaper()
    if not agent.subreaper:
        log.warning("not a child subreaper: a task's process whose parent exits may escape")
    agent.kill_orphans()
    agent.start_tracker()
    return agent, lock


def _keep_stop_signals() -> None:
    """Make SIGTERM and SIGINT no-ops outside uvicorn's own handlers. uvicorn (0.29 and
    newer) raises the signal that stopped it again once it has restored the handlers it
    found: with the default ones, that killed the agent before its clean stop (its
    tasks stopped, its cgroups removed) could run."""
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, frame: None)


def serve(
    state_dir: Path,
    host: str,
    header_timeout: float = 10.0,
    containment: str = "auto",
    task_pids_max: str | int = cgroups.DEFAULT_PIDS_MAX,
) -> int:
    """Run the agent for ``host`` until SIGTERM/SIGINT; the process's exit status.

    Its port is reachable by every process on the host, tasks included: a client gets
    ``header_timeout`` seconds to send a request's headers, then is cut off
    (:mod:`xce_resize_plugin.rest.header_deadline`), so that nobody can hold the
    agent's connections open without a request. A body is read only after the request's
    signature was checked, that is from the controller. ``containment`` and
    ``task_pids_max``: the ``[worker]`` settings (docs/live-controller.md).
    """
    import uvicorn

    from xce_resize_plugin.rest.header_deadline import header_deadline

    logging.basicConfig(
        level=logging.INFO, format=f"%(asctime)s worker[{host}] %(levelname)s %(message)s"
    )
    try:
        secret = secret_path(state_dir).read_text().strip()
    except OSError as exc:
        print(f"xce-resize worker: cannot read the secret: {exc}", file=sys.stderr)
        return 2
    started = _start_agent(state_dir, host, containment, task_pids_max)
    if isinstance(started, int):
        return started
    agent, lock = started
    sock, limits = _listen()
    port = sock.getsockname()[1]

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:
            # Wake the long polls so that the graceful shutdown does not wait for them.
            with agent._cond:
                agent.closing = True
                agent._cond.notify_all()
            super().handle_exit(sig, frame)

    config = uvicorn.Config(
        make_app(agent, secret, port),
        http=header_deadline(header_timeout),
        log_level="warning",
        access_log=False,
        lifespan="off",
        timeout_graceful_shutdown=1,
        **fd_limits.uvicorn_options(limits),
    )
    server = Server(config)
    fd_limits.quiet_refusals()
    # The registration is written once the socket listens: a controller that reads it
    # can connect at once (the kernel queues the connection until uvicorn accepts).
    atomic_write(
        agent.dir / "worker.json",
        json.dumps(
            {
                "host": host,
                "pid": os.getpid(),
                "port": port,
                # Where this host's tasks are reached (XCE_HEAD_ADDR for task 0's host).
                "addr": sock.getsockname()[0],
                "instance": agent.instance,
                "started": time.time(),
            }
        ),
    )
    log.info("agent %s for %s on 127.0.0.1:%d", agent.instance, host, port)
    _keep_stop_signals()
    try:
        server.run(sockets=[sock])
    finally:
        agent.shutdown()
        with contextlib.suppress(OSError):
            (agent.dir / "worker.json").unlink()
        lock.release()
    return 0
