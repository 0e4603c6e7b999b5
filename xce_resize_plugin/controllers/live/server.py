"""The live controller's process: its ASGI application (Starlette, served by uvicorn)
and :func:`run`, ``xce-resize controller``.

The application serves the controller's own routes (:mod:`.host_routes`), the plugin's
routes as ``xce_rest_routes`` returns them (the resize API, ``/v1/jobs/{id}/resize/...``),
``GET /metrics`` when prometheus-client is installed (:mod:`.metrics`) and
``GET /openapi.json``. All are built with one HTTP layer
(:mod:`xce_resize_plugin.rest.http`) and described by one builder
(:mod:`xce_resize_plugin.rest.openapi`): a route built from an operation is described
by it, any other plugin route gets a minimal entry, so the document always lists
exactly what is served. Errors, routing errors included, are RFC 9457 problem
documents (``application/problem+json``) with LSF's code name, number and message.

Every client has ``[controller] header_timeout`` seconds to send a request's headers
(:mod:`xce_resize_plugin.rest.header_deadline`) and ``body_timeout`` seconds to send
its body (:func:`xce_resize_plugin.rest.http.read_body`), so that a client that stops
half way does not hold a connection or a handler for ever.

Every request gets an id (``X-Request-ID``, echoed); the log's lines about a request
name it, its user and its job (:mod:`.logs`, ``--log-format``, ``--access-log``).
"""

from __future__ import annotations

import contextlib
import functools
import gc
import json
import logging
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attrs import evolve

from xce_resize_plugin import __version__
from xce_resize_plugin.controllers.live import fd_limits
from xce_resize_plugin.controllers.live.live_controller import LiveController
from xce_resize_plugin.controllers.live.settings import LiveConfig, parse_listen
from xce_resize_plugin.controllers.violations import EmbeddedError
from xce_resize_plugin.errors import ConfigError, FencedError, JournalError
from xce_resize_plugin.host import HostHooks

if TYPE_CHECKING:
    import uvicorn
    from starlette.applications import Starlette
    from starlette.routing import BaseRoute

    from xce_resize_plugin.controllers.live.metrics import ControllerMetrics

log = logging.getLogger(__name__)

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_FENCED = 0, 1, 2, 3
TITLE = "XCE embedded live controller"


def plugin_routes(ctl: LiveController) -> list[BaseRoute]:
    """What ``xce_rest_routes`` returned, flattened (one list per implementation)."""
    from starlette.routing import BaseRoute

    out: list[BaseRoute] = []
    for result in HostHooks(ctl.plugin_manager).rest_routes(ctl):
        for route in result or ():
            if not isinstance(route, BaseRoute):
                raise ConfigError(f"xce_rest_routes returned {type(route).__name__}, not a route")
            out.append(route)
    return out


def build_app(ctl: LiveController, metrics: ControllerMetrics | None = None) -> Starlette:
    """The controller's ASGI application: host routes, plugin routes, ``/metrics`` (with
    ``metrics``), OpenAPI; every request through the REST layer's
    :class:`~xce_resize_plugin.rest.http.RequestContext` (request id, log context,
    access line, the metrics' HTTP counters), with a worker thread for each concurrent
    change (:class:`~xce_resize_plugin.rest.http.RequestThreads`)."""
    from starlette.applications import Starlette
    from starlette.middleware import Middleware

    from xce_resize_plugin.controllers.live.host_routes import host_routes
    from xce_resize_plugin.rest.http import (
        RequestContext,
        RequestThreads,
        exact_paths,
        exception_handlers,
        openapi_route,
        set_body_timeout,
        set_request_limit,
    )

    served = [*host_routes(ctl), *plugin_routes(ctl)]
    if metrics is not None:
        from xce_resize_plugin.controllers.live.metrics import metrics_route

        served.append(metrics_route(ctl, metrics))
    document = openapi_route(TITLE, __version__, served)
    observe = None if metrics is None else metrics.http_request
    app = Starlette(
        routes=[*served, document],
        exception_handlers=exception_handlers(),
        middleware=[Middleware(RequestContext, observe=observe), Middleware(RequestThreads)],
    )
    set_body_timeout(app, ctl.cfg.body_timeout)
    set_request_limit(app, ctl.cfg.request_limit)
    return exact_paths(app)


def watch(ctl: LiveController) -> ControllerMetrics | None:
    """The controller's metrics, attached (before it opens); ``None``, said in the log,
    when prometheus-client is not installed (``GET /metrics`` is then not served)."""
    try:
        from xce_resize_plugin.controllers.live.metrics import ControllerMetrics
    except ImportError as exc:
        log.warning("no metrics (GET /metrics is not served): %s", exc)
        return None
    metrics = ControllerMetrics(ctl)
    metrics.attach()
    return metrics


# -- the process --------------------------------------------------------------------------


def run(
    config_path: Path,
    *,
    listen: str | None = None,
    state_dir: Path | None = None,
    ready_file: Path | None = None,
    record: Path | None = None,
    attach: Callable[[LiveController], object] | None = None,
    log_format: str = "text",
    access_log: bool = False,
) -> int:
    """``xce-resize controller``: serve until SIGTERM/SIGINT; the exit status.

    ``listen``, ``state_dir`` and ``record`` override the configuration's keys.
    ``attach`` is called with the controller before it opens (the command line attaches
    the run's recording there, when the configuration asks for one). ``log_format``:
    ``text`` or ``json``; ``access_log``: a line per request (:mod:`.logs`).
    """
    from xce_resize_plugin.controllers.live import logs

    logs.configure(log_format, access=access_log)
    cfg = _settings(config_path, listen=listen, state_dir=state_dir, record=record)
    # Bind first: a controller started twice by mistake on one address must fail
    # before it opens the state directory (opening it would fence the running one).
    listening = _listen(cfg)
    if listening is None:
        return EXIT_USAGE
    sock, limits = listening
    # With port 0 the system chose the port: tasks (XCE_CONTROLLER_URL), the start-up
    # line and the ready file must name the one that serves.
    cfg = evolve(cfg, listen_port=sock.getsockname()[1])
    try:
        ctl = make_controller(cfg)
    except (EmbeddedError, JournalError) as exc:
        sock.close()
        return _refuse_state(exc)
    try:
        app = _open(ctl, sock, attach)
    except (EmbeddedError, JournalError) as exc:
        return _refuse_state(exc)  # _open closed the controller and the socket
    server = None if app is None else _server(app, cfg, limits, own_log_config=log_format == "text")
    if server is not None:
        ctl.on_fenced = functools.partial(_stop_fenced, server)
    # Fenced at any moment until now (an agent refused this controller's epoch while it
    # started, e.g. on a state directory restored from a backup): stop before serving,
    # rather than hold the port and answer 503 for ever.
    if server is None or ctl.fenced is not None:
        ctl.shutdown()
        sock.close()
        return _exit_status(ctl)
    # The objects of the start (modules, configuration, the recovered state) live as
    # long as the process: out of the collector's reach, a full collection (which the
    # connections' reference cycles trigger every thousand requests or so) walks only
    # what serving made.
    gc.collect()
    gc.freeze()
    if ready_file is not None:
        _write_ready(ready_file, cfg, ctl)
    log.info(
        "controller epoch %d serving http://%s:%d (%d hosts)",
        ctl.live_store.epoch,
        cfg.listen_host,
        cfg.listen_port,
        len(cfg.hosts),
    )
    _serve(server, sock, ctl)
    logs.tell_held_back()
    status = _exit_status(ctl)
    if status == EXIT_OK:
        # Said, because a newcomer stopping an evaluation expects everything gone.
        log.info(
            "controller epoch %d stopped; the worker agents and their tasks keep running "
            "(the next controller on %s takes them over)",
            ctl.live_store.epoch,
            cfg.state_dir,
        )
    return status


def _exit_status(ctl: LiveController) -> int:
    """The exit status of a controller that stopped, after saying why if not cleanly:
    fenced (3), or stopped while its state could not be written (1)."""
    if ctl.fenced is not None:
        print(f"xce-resize controller: stopped: {ctl.fenced}", file=sys.stderr)
        return EXIT_FENCED
    if ctl.failing is not None:
        print(
            f"xce-resize controller: stopped while the state could not be written: "
            f"{ctl.failing} (what was acknowledged is on disk)",
            file=sys.stderr,
        )
        return EXIT_ERROR
    return EXIT_OK


def _open(
    ctl: LiveController, sock: socket.socket, attach: Callable[[LiveController], object] | None
) -> Starlette | None:
    """Open ``ctl`` and build its application; ``None`` when it was fenced meanwhile."""
    try:
        metrics = watch(ctl)
        if attach is not None:
            attach(ctl)
        ctl.open()
        if ctl.fenced is None:
            return build_app(ctl, metrics)
    except FencedError as exc:
        ctl.fence(exc)  # e.g. the plugin's journal found a newer epoch at start-up
    except BaseException:
        ctl.shutdown()
        sock.close()
        raise
    return None


def _refuse_state(exc: EmbeddedError | JournalError) -> int:
    """A state directory the controller cannot start on (damaged, truncated, of a newer
    schema, the two stores disagreeing; docs/live-controller.md): one line naming the
    file, and the exit status for errors. Never start on half a state."""
    if isinstance(exc, FencedError):
        print(f"xce-resize controller: stopped: {exc}", file=sys.stderr)
        return EXIT_FENCED
    print(f"xce-resize controller: {exc}", file=sys.stderr)
    return EXIT_ERROR


def make_controller(cfg: LiveConfig) -> LiveController:
    """The controller of ``cfg``, with the plugins its ``[resize]`` table names."""
    from xce_resize_plugin.manager import get_plugin_manager

    pm = get_plugin_manager(cfg.resize, base_dir=cfg.path.parent if cfg.path else None)
    return LiveController(pm, cfg)


def _settings(
    config_path: Path, *, listen: str | None, state_dir: Path | None, record: Path | None
) -> LiveConfig:
    """The configuration file's settings with the command line's overrides."""
    from xce_resize_plugin.controllers.live import settings as config_mod

    cfg = config_mod.load(config_path)
    if listen is not None:
        host, port = parse_listen(listen)
        cfg = evolve(cfg, listen_host=host, listen_port=port)
    if state_dir is not None:
        cfg = evolve(cfg, state_dir=state_dir.resolve())
    if record is not None:
        cfg = evolve(cfg, record=record.resolve())
    return cfg


def _listen(cfg: LiveConfig) -> tuple[socket.socket, fd_limits.ConnectionLimits] | None:
    """The listening socket and what its connections may take of the descriptors;
    ``None`` (after saying why) when the address is taken.

    The descriptor limit is raised first, so that the agents this controller starts
    (and their tasks) inherit it and the state is opened under it."""
    limits = fd_limits.connection_limits(fd_limits.raise_nofile(), len(cfg.hosts))
    sock = _bind(cfg)
    if sock is None:
        return None
    fd_limits.guard(sock, limits)
    log.info(
        "at most %d connections in progress (open files: %d, of which %d kept for the "
        "controller); each user at most %d requests",
        limits.concurrency,
        limits.nofile,
        limits.reserve,
        cfg.request_limit,
    )
    return sock, limits


def _bind(cfg: LiveConfig) -> socket.socket | None:
    """The listening socket; ``None`` (after saying why) when the address is taken."""
    sock: socket.socket = fd_limits.listener()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((cfg.listen_host, cfg.listen_port))
    except OSError as exc:
        sock.close()
        print(
            f"xce-resize controller: cannot listen on {cfg.listen_host}:{cfg.listen_port}: "
            f"{exc.strerror or exc}",
            file=sys.stderr,
        )
        return None
    sock.listen(128)
    return sock


def _server(
    app: Starlette,
    cfg: LiveConfig,
    limits: fd_limits.ConnectionLimits,
    own_log_config: bool = True,
) -> uvicorn.Server:
    """The HTTP server, with the request deadlines of ``cfg`` and the connection limit
    of ``limits``. Without ``own_log_config`` uvicorn's loggers go to the controller's
    handler (JSON lines stay JSON) rather than to uvicorn's own."""
    import uvicorn

    from xce_resize_plugin.rest.header_deadline import header_deadline
    from xce_resize_plugin.rest.http import set_stopping

    options: dict[str, Any] = {} if own_log_config else {"log_config": None}
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            http=header_deadline(cfg.header_timeout),
            log_level="warning",
            access_log=False,
            lifespan="off",
            timeout_graceful_shutdown=2,
            **fd_limits.uvicorn_options(limits),
            **options,
        )
    )
    fd_limits.quiet_refusals()
    # Once the server is asked to stop (a signal, or fenced), the long polls answer 503
    # (XCE_CONTROLLER_STOPPING) at their next look, within the graceful shutdown, rather
    # than being cut off at its end: a plain 500, which a framework takes for a refusal.
    set_stopping(app, lambda: bool(server.should_exit))
    return server


def _stop_fenced(server: uvicorn.Server) -> None:
    """Stop serving: the controller was fenced."""
    server.should_exit = True
    # A fenced controller must not linger: if the server does not stop, exit hard.
    timer = threading.Timer(5.0, lambda: _hard_exit(EXIT_FENCED))
    timer.daemon = True
    timer.start()


def _write_ready(ready_file: Path, cfg: LiveConfig, ctl: LiveController) -> None:
    """The ready file, once the controller serves: its URL (``XCE_CONTROLLER_URL``),
    the address and port it listens on (the bound port, also when the configuration
    said 0), its epoch and the time."""
    from xce_resize_plugin.controllers.live.proc import atomic_write

    ready = {
        "url": cfg.controller_url,
        "listen": f"{cfg.listen_host}:{cfg.listen_port}",
        "port": cfg.listen_port,
        "epoch": ctl.live_store.epoch,
        "time": time.time(),
    }
    atomic_write(ready_file, json.dumps(ready))


def _serve(server: uvicorn.Server, sock: socket.socket, ctl: LiveController) -> None:
    """Serve on ``sock`` until asked to stop; then shut the controller down."""

    # uvicorn (>= 0.29) handles SIGINT/SIGTERM while it serves and, once it has stopped,
    # raises the signal again for the handler that was there before: the default one
    # would kill the process (or raise KeyboardInterrupt) before the clean stop below
    # (xce_controller_stop, the recording's last facts). That handler is this one: it
    # only asks the server to stop (a signal just before uvicorn took over is not lost).
    def stop_signal(signum: int, frame: Any) -> None:
        server.should_exit = True

    previous = {sig: signal.signal(sig, stop_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        server.run(sockets=[sock])
    finally:
        try:
            ctl.shutdown()
            with contextlib.suppress(OSError):
                sock.close()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def _hard_exit(code: int) -> None:
    import os

    logging.shutdown()
    os._exit(code)


__all__ = ["TITLE", "build_app", "make_controller", "plugin_routes", "run", "watch"]
