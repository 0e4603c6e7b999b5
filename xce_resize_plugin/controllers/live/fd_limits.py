"""How many file descriptors the live controller's servers (the controller's API, each
worker agent's) may spend on their clients' connections, and what a client gets beyond.

Every connection holds a descriptor until it closes — an idle one until the header
deadline, a long poll up to a minute — and a process out of descriptors fails every
``accept()`` (asyncio logs each failure, thousands a second, and serves nobody) and
also its own work: the journal, the hostfiles, the connections to the agents. So,
from the outermost limit in (docs/live-controller.md, "Connections and descriptors"):

1. :func:`raise_nofile`: at start the soft ``RLIMIT_NOFILE`` is raised to the hard
   limit, at most :data:`MAX_NOFILE` (systemd starts services with a soft limit of
   1024 and a much higher hard one, for programs that still use ``select()``, which
   none of ours does);
2. :func:`connection_limits`: a :data:`reserve <RESERVE_BASE>` of descriptors is kept
   for the process's own work. A connection accepted into the reserve is answered 503
   at once and closed (:class:`GuardedListener`): ``accept()`` never runs out;
3. below that, uvicorn's ``limit_concurrency``: a request that arrives while that many
   connections are open is answered 503 (uvicorn's own answer, with
   ``Connection: close``);
4. within those, the REST layer bounds each user's requests in progress (429,
   :func:`xce_resize_plugin.rest.http.in_progress`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import resource
import socket
import time
from collections.abc import Callable
from typing import Any

from attrs import frozen

from xce_resize_plugin.rest.client import UNPROCESSED_503

log = logging.getLogger(__name__)

#: The soft descriptor limit a server raises itself to, at most. Each connection costs
#: the server some memory besides its descriptor (its protocol, parser and buffers:
#: tens of KiB), so beyond this memory, not descriptors, is what runs out; and a
#: loopback client cannot hold many more (one source address has about 28,000
#: ephemeral ports).
MAX_NOFILE = 65536
#: Descriptors kept for a server's own work, whatever its clients do: the controller
#: holds about 15 when idle (its log, both LMDB environments, the recording, the
#: listening socket, an epoll) plus 1 or 2 per host (an agent's event poll and command
#: connection); an agent about 10. The rest covers what comes and goes — the pipes of
#: a process being started, a hostfile or a log being written, a lock being probed —
#: with several times the room measured.
RESERVE_BASE = 64
#: More for the controller per host it serves (its connections to the host's agent,
#: the agent's lock file when probed, the commands in flight).
RESERVE_PER_HOST = 4
#: What a connection accepted into the reserve is sent before it is closed: uvicorn's
#: own answer at ``limit_concurrency``, so that a client sees one answer whichever
#: limit refused it, and the in-job clients know it for a refusal that did nothing
#: (its body: ``rest.client.UNPROCESSED_503``).
REFUSAL = (
    b"HTTP/1.1 503 Service Unavailable\r\n"
    b"content-type: text/plain; charset=utf-8\r\n"
    b"content-length: %d\r\n"
    b"connection: close\r\n"
    b"\r\n"
    b"%s"
) % (len(UNPROCESSED_503), UNPROCESSED_503)
#: Seconds between two log lines about refused connections: a crowd refused must not
#: become a flood of lines (uvicorn says "Exceeded concurrency limit." per request).
REFUSALS_LOGGED_EVERY = 10.0
#: What uvicorn logs (``uvicorn.error``, WARNING) for each request it answers 503.
UVICORN_REFUSAL = "Exceeded concurrency limit."


@frozen
class ConnectionLimits:
    """What a server with ``nofile`` descriptors spends on connections.

    ``guard``: a connection whose descriptor is ``guard`` or more is refused at once
    (the kernel gives the lowest free descriptor, so such a connection means every
    descriptor below was taken: the ones from ``guard`` up stay for the process's own
    work). ``concurrency``: uvicorn's ``limit_concurrency``, below ``guard`` by the
    reserve again, so that a crowd of connections is answered 503 by uvicorn, request
    read, well before any is cut off at ``accept()``."""

    nofile: int
    reserve: int
    concurrency: int
    guard: int


#: The soft ``RLIMIT_NOFILE`` there was before :func:`raise_nofile` raised it, in this
#: process or in the one that started it (the controller starts the agents, which
#: inherit its raised limit and its environment). The worker agent gives it back to
#: the processes it starts (tasks, notification commands): a job's ``select()``-based
#: program breaks past descriptor 1023, which is why the soft limit was low
#: (docs/live-controller.md, "Connections and descriptors"). Never in a job's
#: environment: the agent builds theirs from the controller's commands.
NOFILE_BEFORE_ENV = "XCE_NOFILE_BEFORE_RAISE"


def nofile_before_raise() -> int | None:
    """The soft limit of open files before :func:`raise_nofile` raised it here or in
    the process that started this one, at most the soft limit now; ``None`` when it
    was not raised."""
    text = os.environ.get(NOFILE_BEFORE_ENV, "")
    if not text.isdigit():
        return None
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return int(text) if soft == resource.RLIM_INFINITY else min(int(text), soft)


def raise_nofile(maximum: int = MAX_NOFILE) -> int:
    """Raise the soft ``RLIMIT_NOFILE`` to the hard limit, at most ``maximum`` (said
    once in the log); never lower it. The descriptors the server may count on: the soft
    limit in force afterwards (the one there was, when it could not be raised: said in
    the log, the server goes on with it), at most ``maximum`` even where the soft limit
    is higher (a container's 1,048,576): the connections' memory, which ``maximum``
    bounds, runs out whatever the descriptors."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = maximum if hard == resource.RLIM_INFINITY else min(hard, maximum)
    if soft == resource.RLIM_INFINITY or soft >= target:
        return maximum if soft == resource.RLIM_INFINITY else min(soft, maximum)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (OSError, ValueError) as exc:
        log.warning("cannot raise the limit of open files from %d to %d: %s", soft, target, exc)
        return soft
    os.environ.setdefault(NOFILE_BEFORE_ENV, str(soft))  # the first raise's
    log.info(
        "raised the soft limit of open files from %d to %d (hard limit %s)", soft, target, hard
    )
    return target


def connection_limits(nofile: int, hosts: int = 0) -> ConnectionLimits:
    """The limits of a server with ``nofile`` descriptors that talks to ``hosts``
    agents (the controller; 0 for an agent). Whatever the reserve asks, connections
    get half of the descriptors at least: a limit too low for the hosts (said in the
    log) serves fewer clients rather than none."""
    wanted = RESERVE_BASE + RESERVE_PER_HOST * hosts
    reserve = min(wanted, nofile // 4)
    if reserve < wanted:
        log.warning(
            "the limit of open files, %d, is low for %d hosts: %d are kept for the "
            "server's own work, %d wanted",
            nofile,
            hosts,
            reserve,
            wanted,
        )
    guard = nofile - reserve
    return ConnectionLimits(nofile, reserve, max(guard - reserve, 1), guard)


class GuardedListener(socket.socket):
    """A listening socket whose ``accept()`` refuses a connection that got a descriptor
    at or above :attr:`guard` (:class:`ConnectionLimits`): it is sent :data:`REFUSAL`
    and closed at once, and asyncio's accept loop is told the connection went away
    (``ConnectionAbortedError``, which it takes silently and tries again at the next
    turn of the loop). asyncio only: uvloop accepts without this method, so the servers
    run on asyncio's loop."""

    guard: int = 1 << 30

    def accept(self) -> tuple[socket.socket, Any]:
        conn, addr = super().accept()
        if conn.fileno() < self.guard:
            return conn, addr
        refuse(conn)
        if REFUSALS.due():
            log.warning(
                "out of connections: a connection was answered 503 as accepted (its "
                "descriptor would be one of the last kept for the server's own work)%s",
                REFUSALS.since(),
            )
        raise ConnectionAbortedError(f"refused {addr}: descriptor {self.guard} or above")


def refuse(conn: socket.socket) -> None:
    """Send :data:`REFUSAL` on a new connection and close it, never waiting. What the
    client already sent is read first (as much as has arrived): closing with unread
    data would reset the connection, and the client could lose the answer."""
    with contextlib.suppress(OSError), conn:
        conn.send(REFUSAL, socket.MSG_DONTWAIT)
        conn.shutdown(socket.SHUT_WR)
        with contextlib.suppress(BlockingIOError):
            conn.recv(65536, socket.MSG_DONTWAIT)


class Refusals(logging.Filter):
    """Says refusals at most once per :data:`REFUSALS_LOGGED_EVERY` seconds, with how
    many went unsaid: a filter of ``uvicorn.error`` for its line per request refused at
    ``limit_concurrency``, and the clock of :class:`GuardedListener`'s line."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.clock = clock
        self.last = -REFUSALS_LOGGED_EVERY
        self.unsaid = 0

    def due(self) -> bool:
        """Whether a refusal is to be said now (otherwise it is counted)."""
        now = self.clock()
        if now - self.last < REFUSALS_LOGGED_EVERY:
            self.unsaid += 1
            return False
        self.last = now
        return True

    def since(self) -> str:
        """The refusals left unsaid since the last line (then none), as a suffix."""
        unsaid, self.unsaid = self.unsaid, 0
        return f" ({unsaid} more since the last line)" if unsaid else ""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg != UVICORN_REFUSAL:
            return True
        if not self.due():
            return False
        record.msg = f"out of connections: a request was answered 503{self.since()}"
        record.args = ()
        return True


#: The process's one record of refusals (a server process serves one socket).
REFUSALS = Refusals()


def quiet_refusals() -> None:
    """Let uvicorn's line per refused request through :data:`REFUSALS` (call it once
    uvicorn has set up its logging, which may replace a logger's configuration)."""
    logger = logging.getLogger("uvicorn.error")
    if REFUSALS not in logger.filters:
        logger.addFilter(REFUSALS)


def listener() -> GuardedListener:
    """A TCP listening socket (IPv4) to be bound, with no guard until :func:`guard` sets one."""
    # IPPROTO_TCP named, not left 0: ``accept()`` gives each connection the listener's
    # ``proto``, and asyncio disables Nagle's algorithm (TCP_NODELAY) on an accepted
    # connection only when that is IPPROTO_TCP. Without it uvicorn's answers, written
    # headers then body, waited for the client's delayed ACK: about 44 ms per request
    # on a kept-alive connection, against 1 ms on a new one (docs/performance.md, "The
    # live controller", 2026-12-06).
    return GuardedListener(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)


def guard(sock: socket.socket, limits: ConnectionLimits) -> None:
    """Refuse ``sock``'s connections from ``limits.guard`` on (a :class:`GuardedListener`)."""
    if isinstance(sock, GuardedListener):
        sock.guard = limits.guard


def uvicorn_options(limits: ConnectionLimits) -> dict[str, Any]:
    """The options of ``uvicorn.Config`` that go with ``limits``: its
    ``limit_concurrency``, and asyncio's loop, whose accept loop calls
    :meth:`GuardedListener.accept` (uvloop, which uvicorn would take if installed,
    does not)."""
    return {"limit_concurrency": limits.concurrency, "loop": "asyncio"}


__all__ = [
    "MAX_NOFILE",
    "REFUSAL",
    "REFUSALS",
    "RESERVE_BASE",
    "RESERVE_PER_HOST",
    "ConnectionLimits",
    "GuardedListener",
    "Refusals",
    "connection_limits",
    "guard",
    "listener",
    "quiet_refusals",
    "raise_nofile",
    "refuse",
    "uvicorn_options",
]
