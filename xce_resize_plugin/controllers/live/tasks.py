"""The controller's side of the worker agents: starting them, sending them commands,
reading their events, and noticing when one dies.

One :class:`WorkerChannel` per host, with two threads:

- the **sender** posts queued commands (launch, stop, notify, forget) to the agent in
  batches, only while the channel is *ready*, i.e. connected to an agent instance the
  controller has reconciled with;
- the **poller** long-polls the agent's events and hands them to the controller; when
  the agent cannot be reached it (re)connects: if the agent's ``flock`` is free the
  agent is dead (the controller fails the host and, with ``manage_workers``, starts a
  new agent); otherwise it takes a snapshot and the controller reconciles its records
  with it before the channel is ready again. An agent that holds its lock but has not
  answered for ``agent_timeout`` seconds (each long poll's answer is its heartbeat:
  at least one every :data:`POLL_WAIT` seconds) is lost too: the controller fails
  the host once, and takes it back when the agent answers again.

Commands reach a channel only through :class:`WorkerFleet`'s outbox, which the
controller releases after the store write that records them (``after_commit``): a
task is never started, stopped or notified before the controller's durable state says
so, which is what lets a restarted controller trust its records (docs/failover.md).

Lock order: a channel's ``send_lock`` may be taken before the controller lock (connect
and reconcile), never after; the controller only ever touches a channel's queue, under
the queue's own condition.
"""

from __future__ import annotations

import atexit
import json
import logging
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from xce_resize_plugin.controllers.live.proc import (
    listens_on,
    lock_held,
    pid_alive,
    secret_file,
    start_ticks,
)
from xce_resize_plugin.controllers.live.worker import secret_path, worker_dir

log = logging.getLogger(__name__)

#: How long the agent holds an event long poll (seconds).
POLL_WAIT = 2.0
#: Pause before retrying an agent that could not be reached (seconds).
RETRY = 0.05


def wire_json(data: Any) -> bytes:
    """Commands as the sender posts them to an agent: UTF-8 JSON, without NaN."""
    return json.dumps(data, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()


def unsendable(command: Mapping[str, Any]) -> str | None:
    """Why ``command`` cannot be posted to an agent (:func:`wire_json`), or ``None``.

    Checked where a launch or a notification is made, so that such a command fails
    there, with a reason the job's history shows: in the sender's thread it would stop
    every later command to the host (a lone surrogate, which no encoder takes, did)."""
    try:
        wire_json(command)
    except (ValueError, TypeError) as exc:  # UnicodeEncodeError is a ValueError
        return f"cannot be sent to the host's agent: {exc}"
    return None


#: The agents this process started, shared by every fleet of the process: an agent
#: outlives the fleet that started it (own session), so its handle stays here, and
#: :func:`reap_agents` (at every fleet's close, and at exit) collects it once it has
#: exited (no zombie, and no "still running" warning for a handle dropped unwaited).
_AGENTS: list[subprocess.Popen[bytes]] = []
_AGENTS_LOCK = threading.Lock()


def reap_agents() -> None:
    """Collect the agents this process started that have exited."""
    with _AGENTS_LOCK:
        _AGENTS[:] = [p for p in _AGENTS if p.poll() is None]


atexit.register(reap_agents)


#: Commands still queued for an agent: ``("launch", job, task)`` and
#: ``("notify", job, attempt)``. Reconciliation leaves their tasks alone.
Queued = set[tuple[str, str, int]]


class FleetOwner(Protocol):
    """What the fleet calls back on: the live controller (each call takes its lock)."""

    def worker_events(self, host: str, events: Sequence[Mapping[str, Any]]) -> None: ...

    def worker_down(self, host: str, queued: Queued) -> None: ...

    def worker_up(self, host: str, snapshot: Mapping[str, Any], queued: Queued) -> None: ...

    def fence(self, reason: BaseException) -> None: ...


class WorkerFleet:
    """The channels to every host's agent, the outbox, and agent start-up."""

    def __init__(
        self,
        state_dir: Path,
        hosts: Sequence[str],
        epoch: int,
        *,
        manage: bool = True,
        start_timeout: float = 10.0,
        header_timeout: float = 10.0,
        agent_timeout: float = 30.0,
        worker_options: Sequence[str] = (),
    ) -> None:
        self.state_dir = state_dir
        #: More of the agents' command line (the ``[worker]`` settings).
        self.worker_options = tuple(worker_options)
        #: Seconds without an answer from a running agent before its host fails.
        self.agent_timeout = agent_timeout
        self.epoch = epoch
        self.manage = manage
        self.start_timeout = start_timeout
        #: Passed to the agents this fleet starts (``--header-timeout``).
        self.header_timeout = header_timeout
        self.secret = ensure_secret(state_dir)
        self.owner: FleetOwner | None = None
        self.outbox: list[tuple[str, dict[str, Any]]] = []
        self.channels = {h: WorkerChannel(self, h) for h in hosts}
        self.closed = False

    # -- the outbox (controller lock held) ------------------------------------------------

    def send(self, host: str, command: dict[str, Any]) -> None:
        """Queue a command until the state that implies it is durable."""
        self.outbox.append((host, command))

    def release(self) -> None:
        """The controller's state is durable: hand the queued commands to the channels."""
        if self.closed:
            self.outbox.clear()
            return
        for host, command in self.outbox:
            channel = self.channels.get(host)
            if channel is None:
                log.error("command for unknown host %s dropped: %s", host, command.get("op"))
                continue
            channel.enqueue(command)
        self.outbox.clear()

    def discard(self) -> None:
        self.outbox.clear()

    def drop(self, host: str) -> None:
        """The host failed: forget every command for it, waiting in the outbox or
        queued (its tasks are lost; a returning agent is reconciled, and what it still
        runs that no job owns is stopped then)."""
        self.outbox[:] = [(h, c) for h, c in self.outbox if h != host]
        channel = self.channels.get(host)
        if channel is not None:
            channel.clear()

    def ready(self, host: str) -> bool:
        """Whether ``host``'s agent is connected and reconciled."""
        channel = self.channels.get(host)
        return channel is not None and channel.ready

    # -- lifecycle ---------------------------------------------------------------------------

    def connect_all(self, timeout: float) -> list[str]:
        """Connect to every host's agent (starting missing ones); the hosts still not
        connected after ``timeout`` seconds (their pollers keep trying)."""
        deadline = time.monotonic() + timeout
        waiting = list(self.channels.values())
        while waiting and not self.closed:
            waiting = [c for c in waiting if not c.connect()]
            if not waiting or time.monotonic() > deadline:
                break
            time.sleep(0.02)
        return [c.host for c in waiting]

    def start_threads(self) -> None:
        for channel in self.channels.values():
            channel.start()

    def close(self) -> None:
        """Stop talking to the agents (they and their tasks keep running)."""
        self.closed = True
        for channel in self.channels.values():
            channel.stop()
        for channel in self.channels.values():
            channel.join()
        self.reap()

    def reap(self) -> None:
        """Collect agents this process started that have exited (no zombies)."""
        reap_agents()

    def spawn(self, host: str) -> None:
        """Start an agent for ``host`` in its own session (it outlives this process)."""
        wdir = worker_dir(self.state_dir, host)
        wdir.mkdir(parents=True, exist_ok=True)
        with open(wdir / "worker.log", "ab") as logfile:
            child = subprocess.Popen(
                [
                    sys.executable,
                    # -P: the working directory (the state directory) is not put first
                    # on the import path, where a planted package would run as root.
                    "-P",
                    "-m",
                    "xce_resize_plugin",
                    "worker",
                    "--state-dir",
                    str(self.state_dir),
                    "--host",
                    host,
                    "--header-timeout",
                    repr(self.header_timeout),
                    *self.worker_options,
                ],
                stdin=subprocess.DEVNULL,
                stdout=logfile,
                stderr=subprocess.STDOUT,
                close_fds=True,
                start_new_session=True,
                cwd=str(self.state_dir),
            )
        with _AGENTS_LOCK:
            _AGENTS.append(child)
        log.info("started the agent for %s (pid %d)", host, child.pid)

    def view(self) -> dict[str, dict[str, Any]]:
        return {h: c.view() for h, c in self.channels.items()}

    def address(self, host: str) -> str:
        """The address ``host``'s agent reported (its tasks' host, as other hosts reach
        it); the loopback address until it has registered."""
        channel = self.channels.get(host)
        return channel.addr if channel is not None and channel.addr else "127.0.0.1"


class WorkerChannel:
    """The connection to one host's agent (see the module docstring)."""

    def __init__(self, fleet: WorkerFleet, host: str) -> None:
        self.fleet = fleet
        self.host = host
        self.dir = worker_dir(fleet.state_dir, host)
        self._queue: deque[dict[str, Any]] = deque()
        self._cond = threading.Condition()
        #: Held while a batch is being posted, and while connecting/reconciling, so
        #: that reconciliation never races with a command on the wire.
        self.send_lock = threading.Lock()
        self.ready = False
        self.port: int | None = None
        self.addr: str | None = None
        self.instance: str | None = None
        self.pid: int | None = None
        #: The agent process (pid, start ticks) seen listening on the port at connect()
        #: (``None``: not seen, or a system without /proc to tell).
        self._verified: tuple[int, int] | None = None
        self.seq = 0
        self._stopping = False
        self._spawned_at: float | None = None
        #: When the agent last answered (monotonic), and whether the controller was
        #: told it is lost since (once per loss: see ``_check_heartbeat``).
        self.last_seen = time.monotonic()
        self.lost = False
        self._threads: list[threading.Thread] = []
        # Signed calls: the secret itself never goes to the port (docs/live-controller.md,
        # "Agents"). Imported here: httpx is loaded only by a controller with agents.
        from xce_resize_plugin.controllers.live.agent_client import AgentAuth

        self._auth = AgentAuth(fleet.secret)

    # -- queue (any thread) ---------------------------------------------------------------

    def enqueue(self, command: dict[str, Any]) -> None:
        with self._cond:
            self._queue.append(command)
            self._cond.notify_all()

    def clear(self) -> None:
        """Drop every queued command (the host failed)."""
        with self._cond:
            self._queue.clear()

    def queued(self) -> Queued:
        """Launches and notifications not sent yet."""
        with self._cond:
            out: Queued = set()
            for c in self._queue:
                if c.get("op") == "launch":
                    out.add(("launch", str(c["job"]), int(c["task"])))
                elif c.get("op") == "notify":
                    out.add(("notify", str(c["job"]), int(c["attempt"])))
            return out

    def _set_ready(self, ready: bool) -> None:
        with self._cond:
            self.ready = ready
            self._cond.notify_all()

    # -- threads ---------------------------------------------------------------------------

    def start(self) -> None:
        for target, name in ((self._send_loop, "send"), (self._poll_loop, "poll")):
            thread = threading.Thread(target=target, name=f"{name}-{self.host}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()

    def join(self) -> None:
        # Short: a poller may sit in a long poll for POLL_WAIT seconds, and the threads
        # are daemons that do nothing once the fleet is closed.
        for thread in self._threads:
            thread.join(timeout=0.2)

    def _url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def _client(self, timeout: float) -> Any:
        """An HTTP client with TCP_NODELAY: httpx writes a request's headers and body
        separately, and Nagle's algorithm would then hold the body for the peer's
        delayed ACK (40 ms on Linux) on every command."""
        import httpx

        transport = httpx.HTTPTransport(
            socket_options=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)]
        )
        return httpx.Client(auth=self._auth, timeout=timeout, transport=transport)

    def _send_loop(self) -> None:
        with self._client(10.0) as client:
            while True:
                with self._cond:
                    self._cond.wait_for(lambda: self._stopping or (self.ready and self._queue))
                    if self._stopping:
                        return
                with self.send_lock:
                    with self._cond:
                        if not self.ready or not self._queue:
                            continue
                        batch = list(self._queue)
                        self._queue.clear()
                    self._post(client, batch)

    def _post(self, client: Any, batch: list[dict[str, Any]]) -> None:
        import httpx

        owner = self.fleet.owner
        if self.fleet.closed or owner is None:
            return
        if self._verified is not None and not pid_alive(*self._verified):
            # The commands carry jobs' tokens (a launch's environment): sent only while
            # the agent whose socket connect() saw on the port lives (it holds the port
            # until it dies; a /proc read of the process, not of every socket, on this
            # path). Dead, its port may have been taken before the poll thread noticed:
            # reconnect (which waits for its successor).
            self._requeue(batch)
            self._set_ready(False)
            return
        body = {"epoch": self.fleet.epoch, "instance": self.instance, "commands": batch}
        try:
            content = wire_json(body)
        except (ValueError, TypeError):
            # Each command was checked where it was made (unsendable): one that still
            # cannot be encoded is dropped alone, loudly, rather than end this thread
            # and with it every command to this host.
            kept = []
            for command in batch:
                why = unsendable(command)
                if why is None:
                    kept.append(command)
                else:
                    log.error("agent %s: %s command dropped: %s", self.host, command.get("op"), why)
            batch = body["commands"] = kept  # nor is it queued again below
            content = wire_json(body)
        try:
            response = client.post(
                self._url("/v1/commands"),
                content=content,
                headers={"Content-Type": "application/json"},
            )
        except httpx.ConnectError:
            # Never reached the agent: keep the commands for the next agent instance.
            self._requeue(batch)
            self._set_ready(False)
            return
        except httpx.TransportError as exc:
            # It may or may not have been executed: reconnecting reconciles (launches the
            # agent does not know are resent, stops and notifications always are).
            log.warning("agent %s: commands possibly lost (%s); reconnecting", self.host, exc)
            self._set_ready(False)
            return
        if response.status_code == 200:
            return
        code = _code(response)
        if code == "fenced":
            owner.fence(RuntimeError(f"agent {self.host} refused this controller's epoch"))
        elif code == "instance":
            self._requeue(batch)
            self._set_ready(False)
        elif code == "unavailable":
            # The agent could not serve the call (no thread): as after a broken
            # connection, reconnecting reconciles what it did and did not do.
            log.warning("agent %s: commands not served (%s); reconnecting", self.host, code)
            self._set_ready(False)
        else:
            log.error("agent %s refused commands: %s %s", self.host, response.status_code, code)

    def _requeue(self, batch: list[dict[str, Any]]) -> None:
        with self._cond:
            self._queue.extendleft(reversed(batch))

    def _poll_loop(self) -> None:
        import httpx

        with self._client(POLL_WAIT + min(5.0, self.fleet.agent_timeout)) as client:
            while not self._stopping and not self.fleet.closed:
                if not self.ready:
                    if not self.connect():
                        self._check_heartbeat()
                        time.sleep(RETRY)
                    continue
                try:
                    response = client.get(
                        self._url("/v1/events"),
                        params={"after": self.seq, "timeout": POLL_WAIT, "epoch": self.fleet.epoch},
                    )
                except httpx.TransportError:
                    self._set_ready(False)
                    continue
                if response.status_code != 200:
                    if _code(response) == "fenced" and self.fleet.owner is not None:
                        self.fleet.owner.fence(
                            RuntimeError(f"agent {self.host} refused this controller's epoch")
                        )
                        return
                    self._set_ready(False)
                    continue
                try:
                    data = response.json()
                except ValueError:
                    data = None
                if not isinstance(data, dict):
                    # Not an agent's answer: reconnect (which checks who listens)
                    # rather than let the host's poll thread die.
                    self._set_ready(False)
                    continue
                self.last_seen = time.monotonic()
                if data.get("instance") != self.instance or data.get("resync"):
                    self._set_ready(False)
                    continue
                events = data.get("events", [])
                if events and self.fleet.owner is not None and not self.fleet.closed:
                    self.fleet.owner.worker_events(self.host, events)
                    self.seq = max(int(e["seq"]) for e in events)

    # -- connecting ------------------------------------------------------------------------

    def connect(self) -> bool:
        """Reach the agent and reconcile with it; ``False`` when not (yet) possible."""
        import httpx

        owner = self.fleet.owner
        if owner is None or self.fleet.closed:
            return False
        if not lock_held(self.dir / "lock"):
            with self.send_lock:
                self._set_ready(False)
                self.lost = True
                owner.worker_down(self.host, self.queued())
            self._maybe_spawn()
            return False
        try:
            reg = json.loads((self.dir / "worker.json").read_text())
            port = int(reg["port"])
            pid = int(reg["pid"])
            addr = str(reg.get("addr", "127.0.0.1"))
        except (OSError, ValueError, KeyError, TypeError):
            return False  # starting: locked, not registered yet
        listening = listens_on(pid, port)
        if listening is False:
            # Not the registered agent's socket (a stale registration, a port taken):
            # the secret is sent to no one else. The agent registers again at start.
            return False
        ticks = start_ticks(pid) if listening else None
        try:
            response = httpx.get(
                f"http://127.0.0.1:{port}/v1/snapshot",
                params={"epoch": self.fleet.epoch},
                auth=self._auth,
                timeout=min(5.0, self.fleet.agent_timeout),
            )
        except httpx.TransportError:
            return False
        if response.status_code != 200:
            if _code(response) == "fenced":
                owner.fence(RuntimeError(f"agent {self.host} refused this controller's epoch"))
            return False
        try:
            snapshot = response.json()
            if not isinstance(snapshot, dict):
                return False
        except ValueError:
            return False  # not an agent's answer: try again, as for no answer
        with self.send_lock:
            owner.worker_up(self.host, snapshot, self.queued())
            self._verified = (pid, ticks) if ticks is not None else None
            self.port = port
            self.addr = addr
            self.instance = str(snapshot["instance"])
            self.pid = int(snapshot["pid"])
            self.seq = int(snapshot["seq"])
            self._spawned_at = None
            self.last_seen = time.monotonic()
            self.lost = False
            self._set_ready(True)
        return True

    def _check_heartbeat(self) -> None:
        """An agent that still holds its lock but has not answered for
        ``agent_timeout`` seconds (stopped, hung, cut off) is lost: tell the
        controller once; it takes the host back when the agent answers again."""
        owner = self.fleet.owner
        if self.lost or owner is None or self.fleet.closed:
            return
        if time.monotonic() - self.last_seen <= self.fleet.agent_timeout:
            return
        log.warning("agent %s: no answer for %.1f s: lost", self.host, self.fleet.agent_timeout)
        with self.send_lock:
            self.lost = True
            owner.worker_down(self.host, self.queued())

    def _maybe_spawn(self) -> None:
        if not self.fleet.manage or self.fleet.closed:
            return
        now = time.monotonic()
        if self._spawned_at is not None and now - self._spawned_at < self.fleet.start_timeout:
            return  # one is starting
        self._spawned_at = now
        self.fleet.spawn(self.host)

    def view(self) -> dict[str, Any]:
        with self._cond:
            queued = len(self._queue)
        return {
            "ready": self.ready,
            "pid": self.pid,
            "port": self.port,
            "instance": self.instance,
            "queued_commands": queued,
        }


def _code(response: Any) -> str:
    try:
        data = response.json()
    except ValueError:
        return ""
    return str(data.get("code", "")) if isinstance(data, dict) else ""


def ensure_secret(state_dir: Path) -> str:
    """The controller-agent secret (``workers/secret``, 0600), created on first use."""
    return secret_file(secret_path(state_dir))


def registered_workers(state_dir: Path) -> dict[str, dict[str, Any]]:
    """``worker.json`` of every agent directory (for tests and clean-up tools)."""
    out: dict[str, dict[str, Any]] = {}
    base = state_dir / "workers"
    if not base.is_dir():
        return out
    for wdir in sorted(base.iterdir()):
        try:
            out[wdir.name] = json.loads((wdir / "worker.json").read_text())
        except (OSError, ValueError):
            continue
    return out
