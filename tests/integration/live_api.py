"""Helpers for the REST API tests: the embedded controller behind a lock, served by a
real uvicorn server on loopback.

Why a lock: the embedded controller is not thread-safe, and the routes call it from
the server's worker threads while the test thread drives simulated time (``settle``,
``run``). :class:`LockedController` takes one re-entrant lock around every method call
and every hook call made through its plugin manager, which is exactly the
serialisation a real host provides around its controller state.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import uvicorn

from xce_resize_plugin.controllers.sim import EmbeddedController, ScriptedNotificationRunner
from xce_resize_plugin.host import Principal
from xce_resize_plugin.journal import Journal
from xce_resize_plugin.manager import get_plugin_manager
from xce_resize_plugin.rest import routes as api

HOSTS = [("hA", 4), ("hB", 4), ("hC", 4), ("hD", 4)]


class _LockedHooks:
    """``pm.hook`` whose every hook call holds the controller's lock."""

    def __init__(self, hook: Any, lock: threading.RLock) -> None:
        self._hook = hook
        self._lock = lock

    def __getattr__(self, name: str) -> Callable[..., Any]:
        caller = getattr(self._hook, name)

        def call(**kwargs: Any) -> Any:
            with self._lock:
                return caller(**kwargs)

        return call


class _LockedManager:
    def __init__(self, pm: Any, lock: threading.RLock) -> None:
        self._pm = pm
        self.hook = _LockedHooks(pm.hook, lock)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._pm, name)


class LockedController:
    """The embedded controller with one lock around every call (see the module doc).

    It compares and hashes as the controller it wraps, because the plugin keeps its
    runtime per controller object (a weak mapping): a hook called with the proxy must
    find the runtime that ``xce_controller_start`` made for the real controller.
    """

    def __init__(self, ctl: EmbeddedController) -> None:
        self._ctl = ctl
        self.lock = threading.RLock()
        self._pm = _LockedManager(ctl.plugin_manager, self.lock)

    @property
    def plugin_manager(self) -> Any:
        return self._pm

    @property
    def unwrapped(self) -> EmbeddedController:
        return self._ctl

    def __getattr__(self, name: str) -> Any:
        with self.lock:
            value = getattr(self._ctl, name)
        if not callable(value):
            return value

        def call(*args: Any, **kwargs: Any) -> Any:
            with self.lock:
                return value(*args, **kwargs)

        return call

    def __hash__(self) -> int:
        return hash(self._ctl)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, LockedController):
            other = other._ctl
        return other is self._ctl


class Switch:
    """An ASGI app that forwards to whichever app is set: one server per test module,
    a fresh controller (and app) per test."""

    def __init__(self) -> None:
        self.target: Any = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            return  # the server is started with lifespan="off"; never reached
        await self.target(scope, receive, send)


class LiveServer:
    """uvicorn on 127.0.0.1 with a free port, in a background thread."""

    def __init__(self, app: Any) -> None:
        # proto=IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY on accepted sockets only
        # when the listening socket says TCP, and without it every answer waits ~40 ms
        # for a delayed ACK (uvicorn writes headers and body separately).
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(
            app, log_level="warning", lifespan="off", timeout_graceful_shutdown=2
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True
        )

    def start(self) -> None:
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.01)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)
        self.sock.close()


@contextmanager
def live_server(app: Any) -> Iterator[LiveServer]:
    server = LiveServer(app)
    server.start()
    try:
        yield server
    finally:
        server.stop()


class Cluster:
    """A controller with the real plugin and three running jobs, ready to serve.

    ``job1`` and ``job2`` are alice's (resizable, 1..8 tasks, 2 on hA / hB), ``job3``
    is bob's and not resizable. Tokens: alice, bob, an admin, the job tokens of job1
    and job2.
    """

    def __init__(self, state_dir: Path, config: Mapping[str, Any] | None = None) -> None:
        self.state_dir = state_dir
        self.config = {"journal_sync": False, "stop_grace": 0, **(config or {})}
        pm = get_plugin_manager(self.config, entry_points=False)
        # Notifications are answered by a script, never run: fuzzed requests carry
        # arbitrary notify_cmd strings, which must not reach a shell.
        self.notifier = ScriptedNotificationRunner()
        raw = EmbeddedController(
            pm,
            state_dir,
            hosts=HOSTS,
            config=self.config,
            store="memory",
            strict=True,
            notification_runner=self.notifier,
        )
        self.ctl = LockedController(raw)
        self.job1 = raw.submit("alice", "1,8", resizable=True, alloc={"hA": 2})
        self.job2 = raw.submit("alice", "1,8", resizable=True, alloc={"hB": 2})
        self.job3 = raw.submit("bob", 2, alloc={"hC": 2})
        raw.tokens.update(
            {
                "tok-alice": Principal("alice"),
                "tok-admin": Principal("root", admin=True),
                "tok-bob": Principal("bob"),
                "tok-job1": Principal("alice", job_id=self.job1),
                "tok-job2": Principal("alice", job_id=self.job2),
            }
        )
        raw.settle()
        self.app = api.app(self.ctl)  # type: ignore[arg-type]

    def settle(self) -> None:
        self.ctl.settle()

    def journal_seq(self) -> int:
        with self.ctl.lock, Journal.open(self.state_dir / "resize", readonly=True) as journal:
            return journal.last_seq

    def snapshot(self) -> tuple[Any, ...]:
        """What a rejected request must leave as it was."""
        with self.ctl.lock:
            raw = self.ctl.unwrapped
            return (
                self.journal_seq(),
                raw.hosts_view(),
                raw.users_view(),
                [(j.id, j.state, j.tasks, j.held, j.version) for j in raw.jobs()],
                [
                    (s.phase, s.pending, s.in_flight, s.version)
                    for s in (raw.resize_status(j.id) for j in raw.jobs())
                    if s is not None
                ],
            )

    def stop(self) -> None:
        with self.ctl.lock:
            self.ctl.unwrapped.stop()
