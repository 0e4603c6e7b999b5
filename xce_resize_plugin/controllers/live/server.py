"""The live controller's REST API (Starlette, served by uvicorn) and its process.

Host routes (this module), every one but ``/v1/health`` and ``/openapi.json`` behind
``Authorization: Bearer <token>`` (a user's token from ``[users] tokens``, or a job's
``XCE_JOB_TOKEN``):

- ``GET /v1/health``: liveness and epoch (no token);
- ``POST /v1/jobs`` (201): submit; ``GET /v1/jobs``: the caller's jobs (all for an
  administrator); ``GET /v1/jobs/{id}``: one job; ``DELETE /v1/jobs/{id}`` (202): kill;
- ``GET /v1/cluster``: hosts, users, worker agents and the invariant check;
- ``GET /openapi.json``: the OpenAPI 3.1 document of everything served.

The plugin's routes are whatever ``xce_rest_routes`` returns (the resize API,
``/v1/jobs/{id}/resize/...``), mounted as they are; their OpenAPI fragment comes from
``xce_resize_plugin.rest.routes.openapi_paths()`` when that module offers it, otherwise a
minimal entry is generated per route, so the document always lists exactly what is
served. Errors are RFC 9457 problem documents (``application/problem+json``) with
LSF's code name, number and message, in the same shape as the plugin's.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import logging
import signal
import socket
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attrs import evolve

from xce_resize_plugin import __version__
from xce_resize_plugin.controllers.live.live_controller import LiveController
from xce_resize_plugin.controllers.live.settings import parse_listen
from xce_resize_plugin.controllers.violations import EmbeddedError
from xce_resize_plugin.errors import (
    ConfigError,
    FencedError,
    InvalidRequest,
    NotAuthenticated,
    ResizeError,
)
from xce_resize_plugin.rest import routes as api

if TYPE_CHECKING:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response

log = logging.getLogger(__name__)

PROBLEM_JSON = "application/problem+json"
MAX_BODY = 256 * 1024
EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_FENCED = 0, 1, 2, 3


# One problem-document shape for the host's routes and the plugin's (api.py).
problem = api.problem_json
error_problem = api.error_json


def _bearer(header: str | None) -> str | None:
    if not header:
        return None
    scheme, _, token = header.partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token and " " not in token else None


def plugin_routes(ctl: LiveController) -> list[Any]:
    """What ``xce_rest_routes`` returned, flattened (one list per implementation)."""
    from starlette.routing import BaseRoute

    out: list[Any] = []
    for result in ctl.plugin_manager.hook.xce_rest_routes(controller=ctl):
        for route in result or ():
            if not isinstance(route, BaseRoute):
                raise ConfigError(f"xce_rest_routes returned {type(route).__name__}, not a route")
            out.append(route)
    return out


def build_app(ctl: LiveController) -> Starlette:
    """The controller's ASGI application: host routes, plugin routes, OpenAPI."""
    from starlette.applications import Starlette
    from starlette.concurrency import run_in_threadpool
    from starlette.exceptions import HTTPException
    from starlette.responses import Response
    from starlette.routing import Route

    def render(data: Any, status: int = 200, media: str = "application/json") -> Response:
        body = json.dumps(data, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
        return Response(body.encode("utf-8", "backslashreplace"), status, media_type=media)

    def answer_error(error: ResizeError) -> Response:
        response = render(error_problem(error), error.http_status, PROBLEM_JSON)
        if error.http_status == 401:
            response.headers["WWW-Authenticate"] = 'Bearer realm="xce"'
        return response

    Op = Callable[[Any, "Request", Any], Any]

    def endpoint(fn: Op, *, body: bool = False, status: int = 200) -> Any:
        async def handle(request: Request) -> Response:
            try:
                data: Any = None
                if body:
                    raw = await request.body()
                    if len(raw) > MAX_BODY:
                        raise InvalidRequest(f"body larger than {MAX_BODY} bytes")
                    try:
                        data = json.loads(raw) if raw else None
                    except ValueError as exc:
                        raise InvalidRequest(f"body is not JSON: {exc}") from None
                token = _bearer(request.headers.get("authorization"))
                principal = await run_in_threadpool(ctl.authenticate, token)
                if principal is None:
                    raise NotAuthenticated(
                        "send Authorization: Bearer <token>" if token is None else "unknown token"
                    )
                result = await run_in_threadpool(fn, principal, request, data)
                return render(result, status)
            except ResizeError as exc:
                if isinstance(exc, FencedError):
                    ctl.fence(exc)
                return answer_error(exc)
            except Exception as exc:
                if isinstance(exc.__cause__, FencedError):
                    ctl.fence(exc.__cause__)
                    return answer_error(exc.__cause__)
                log.exception("%s %s failed", request.method, request.url.path)
                return render(
                    problem(500, "Internal error", "see the controller log", "XCE_INTERNAL"),
                    500,
                    PROBLEM_JSON,
                )

        return handle

    def list_jobs(principal: Any, request: Request, data: Any) -> Any:
        return {"jobs": ctl.jobs_view(principal)}

    def submit(principal: Any, request: Request, data: Any) -> Any:
        return ctl.submit_job(principal, data)

    def show(principal: Any, request: Request, data: Any) -> Any:
        return ctl.job_view(principal, request.path_params["id"])

    def kill(principal: Any, request: Request, data: Any) -> Any:
        return ctl.kill_job(principal, request.path_params["id"])

    def cluster(principal: Any, request: Request, data: Any) -> Any:
        return ctl.cluster_json()

    async def health(request: Request) -> Response:
        ok = ctl.fenced is None
        return render(
            {"status": "ok" if ok else "fenced", "epoch": ctl.live_store.epoch},
            200 if ok else 503,
        )

    extra = plugin_routes(ctl)
    host_routes = [
        Route("/v1/health", health, methods=["GET"], name="health"),
        Route("/v1/jobs", endpoint(list_jobs), methods=["GET"], name="list_jobs"),
        Route(
            "/v1/jobs", endpoint(submit, body=True, status=201), methods=["POST"], name="submit_job"
        ),
        Route("/v1/jobs/{id}", endpoint(show), methods=["GET"], name="show_job"),
        Route("/v1/jobs/{id}", endpoint(kill, status=202), methods=["DELETE"], name="kill_job"),
        Route("/v1/cluster", endpoint(cluster), methods=["GET"], name="cluster"),
    ]
    document = openapi_document(host_routes + extra)

    async def openapi(request: Request) -> Response:
        return render(document)

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        doc = problem(exc.status_code, str(exc.detail), str(exc.detail), f"HTTP_{exc.status_code}")
        doc["type"] = "about:blank"
        response = render(doc, exc.status_code, PROBLEM_JSON)
        for key, value in (exc.headers or {}).items():
            response.headers[key] = value
        return response

    async def internal(request: Request, exc: Exception) -> Response:
        log.error("unhandled error on %s", request.url.path, exc_info=exc)
        doc = problem(500, "Internal error", "see the controller log", "XCE_INTERNAL")
        return render(doc, 500, PROBLEM_JSON)

    async def resize_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, ResizeError)
        return answer_error(exc)

    handlers: Mapping[Any, Callable[[Request, Exception], Awaitable[Response]]] = {
        HTTPException: http_error,
        ResizeError: resize_error,
        Exception: internal,
    }
    return Starlette(
        routes=[
            *host_routes,
            *extra,
            Route("/openapi.json", openapi, methods=["GET"], name="openapi"),
        ],
        exception_handlers=dict(handlers),
    )


# -- OpenAPI ------------------------------------------------------------------------------

_PROBLEM_SCHEMA = {
    "type": "object",
    "description": "RFC 9457 problem document with LSF's code name and number.",
    "properties": {
        "type": {"type": "string"},
        "title": {"type": "string"},
        "status": {"type": "integer"},
        "detail": {"type": "string"},
        "code": {"type": "string", "description": "LSBE_* where LSF has one, else XCE_*"},
        "lsf_number": {"type": ["integer", "null"]},
    },
    "required": ["type", "title", "status", "detail", "code"],
}
_TASK_REF = {
    "type": "object",
    "properties": {"id": {"type": "integer"}, "host": {"type": "string"}},
    "required": ["id", "host"],
}
_SCHEMAS: dict[str, Any] = {
    "Problem": _PROBLEM_SCHEMA,
    "JobSubmission": {
        "type": "object",
        "additionalProperties": False,
        "required": ["command"],
        "properties": {
            "command": {
                "type": "array",
                "items": {"type": "string"},
                "minItems": 1,
                "description": 'argv of every task (no shell; use ["/bin/sh", "-c", ...])',
            },
            "tasks": {
                "oneOf": [
                    {"type": "integer", "minimum": 1},
                    {"type": "string", "pattern": "^[0-9]+,[0-9]+$"},
                ],
                "description": 'N, or "MIN,MAX" (bsub -n)',
            },
            "min_tasks": {"type": "integer", "minimum": 1},
            "max_tasks": {"type": "integer", "minimum": 1},
            "ptile": {"type": ["integer", "null"], "minimum": 1},
            "resizable": {"type": "boolean", "default": False},
            "grow_hosts": {"enum": ["prefer-existing", "new-only", "any"]},
            "notify_cmd": {"type": ["string", "null"]},
            "env": {"type": "object", "additionalProperties": {"type": "string"}},
            "cwd": {"type": ["string", "null"], "description": "absolute; default: the log dir"},
            "estimate": {"type": ["number", "null"], "minimum": 0},
            "alloc": {
                "type": ["object", "null"],
                "additionalProperties": {"type": "integer", "minimum": 1},
                "description": "start at once on exactly these hosts (host: tasks), in order",
            },
        },
    },
    "SubmitResult": {
        "type": "object",
        "required": ["id", "token", "job"],
        "properties": {
            "id": {"type": "string"},
            "token": {"type": "string", "description": "the job's XCE_JOB_TOKEN"},
            "job": {"$ref": "#/components/schemas/Job"},
        },
    },
    "JobTask": {
        "type": "object",
        "properties": {
            "id": {"type": "integer"},
            "host": {"type": "string"},
            "state": {"enum": ["STARTING", "RUNNING", "STOPPING", "EXITED", "FAILED"]},
            "pid": {"type": ["integer", "null"]},
            "status": {"type": ["integer", "null"]},
            "reason": {"type": "string"},
        },
    },
    "Job": {
        "type": "object",
        "properties": {
            "id": {"type": "string"},
            "user": {"type": "string"},
            "state": {"enum": ["PEND", "RUN", "DONE", "EXIT"]},
            "command": {"type": "array", "items": {"type": "string"}},
            "min_tasks": {"type": "integer"},
            "max_tasks": {"type": "integer"},
            "version": {"type": "integer"},
            "hosts": {"type": "object", "additionalProperties": {"type": "integer"}},
            "allocation": {"type": "array", "items": _TASK_REF},
            "held": {"type": "array", "items": _TASK_REF},
            "tasks": {"type": "array", "items": {"$ref": "#/components/schemas/JobTask"}},
            "ending": {"type": ["object", "null"]},
            "resize": {"type": ["object", "null"]},
            "accounting": {"type": "object"},
            "logs": {"type": "string"},
            "hostfile": {"type": "string"},
            "notifications": {"type": "array", "items": {"type": "object"}},
        },
        "additionalProperties": True,
    },
    "JobList": {
        "type": "object",
        "properties": {"jobs": {"type": "array", "items": {"$ref": "#/components/schemas/Job"}}},
    },
    "Cluster": {
        "type": "object",
        "properties": {
            "epoch": {"type": "integer"},
            "hosts": {"type": "object"},
            "users": {"type": "object"},
            "problems": {"type": "array", "items": {"type": "string"}},
        },
    },
    "Health": {
        "type": "object",
        "properties": {"status": {"enum": ["ok", "fenced"]}, "epoch": {"type": "integer"}},
    },
}


def _responses(status: int, schema: str | None, errors: tuple[int, ...]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    ok: dict[str, Any] = {"description": "OK"}
    if schema is not None:
        ok["content"] = {"application/json": {"schema": {"$ref": f"#/components/schemas/{schema}"}}}
    out[str(status)] = ok
    for code in errors:
        out[str(code)] = {
            "description": "Problem",
            "content": {PROBLEM_JSON: {"schema": {"$ref": "#/components/schemas/Problem"}}},
        }
    return out


_ID = [{"name": "id", "in": "path", "required": True, "schema": {"type": "string"}}]
_HOST_PATHS: dict[str, dict[str, Any]] = {
    "/v1/health": {
        "get": {
            "operationId": "health",
            "summary": "Liveness and the controller's epoch",
            "security": [],
            "responses": _responses(200, "Health", (503,)),
        }
    },
    "/v1/jobs": {
        "get": {
            "operationId": "list_jobs",
            "summary": "The caller's jobs (every job for an administrator)",
            "responses": _responses(200, "JobList", (401,)),
        },
        "post": {
            "operationId": "submit_job",
            "summary": "Submit a job (bsub)",
            "requestBody": {
                "required": True,
                "content": {
                    "application/json": {"schema": {"$ref": "#/components/schemas/JobSubmission"}}
                },
            },
            "responses": _responses(201, "SubmitResult", (400, 401, 403, 503)),
        },
    },
    "/v1/jobs/{id}": {
        "get": {
            "operationId": "show_job",
            "summary": "One job: allocation, tasks with pids, resize state, accounting",
            "parameters": _ID,
            "responses": _responses(200, "Job", (401, 403, 404)),
        },
        "delete": {
            "operationId": "kill_job",
            "summary": "Kill a job (bkill): tasks stopped, then EXIT",
            "parameters": _ID,
            "responses": _responses(202, "Job", (401, 403, 404, 409, 503)),
        },
    },
    "/v1/cluster": {
        "get": {
            "operationId": "cluster",
            "summary": "Hosts, users, worker agents and the invariant check",
            "responses": _responses(200, "Cluster", (401,)),
        }
    },
    "/openapi.json": {
        "get": {
            "operationId": "openapi",
            "summary": "This document",
            "security": [],
            "responses": {"200": {"description": "OpenAPI 3.1 document"}},
        }
    },
}


def _plugin_fragment() -> dict[str, Any]:
    """``api.openapi_paths()`` when the plugin's api module offers it, else empty."""
    try:
        module = importlib.import_module("xce_resize_plugin.rest.routes")
    except ImportError:
        return {}
    fn = getattr(module, "openapi_paths", None)
    if fn is None:
        return {}
    fragment = fn()
    if not isinstance(fragment, Mapping):
        return {}
    if "paths" in fragment:
        return dict(fragment)
    return {"paths": dict(fragment)}


def openapi_document(routes: list[Any]) -> dict[str, Any]:
    """The document for exactly these routes (host paths + the plugin's fragment;
    a served route the fragment does not describe gets a minimal entry)."""
    fragment = _plugin_fragment()
    paths: dict[str, dict[str, Any]] = {p: dict(item) for p, item in _HOST_PATHS.items()}
    components: dict[str, Any] = {
        "schemas": dict(_SCHEMAS),
        "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
    }
    served = _served(routes)
    for path, item in (fragment.get("paths") or {}).items():
        for method, op in item.items():
            if method in served.get(path, set()):
                paths.setdefault(path, {})[method] = op
    for name, value in (fragment.get("components") or {}).items():
        if isinstance(value, Mapping):
            components.setdefault(name, {}).update(value)
    for path, methods in served.items():
        for method in methods:
            if method not in paths.get(path, {}):
                params = [
                    {"name": n, "in": "path", "required": True, "schema": {"type": "string"}}
                    for n in _path_params(path)
                ]
                paths.setdefault(path, {})[method] = {
                    "summary": "Plugin route",
                    "parameters": params,
                    "responses": {"default": {"description": "see the plugin's documentation"}},
                }
    return {
        "openapi": "3.1.0",
        "info": {"title": "XCE embedded live controller", "version": __version__},
        "paths": paths,
        "components": components,
        "security": [{"bearer": []}],
    }


def _served(routes: list[Any]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for route in routes:
        path = getattr(route, "path", None)
        methods = getattr(route, "methods", None) or set()
        if path is None:
            continue
        out.setdefault(path, set()).update(m.lower() for m in methods if m != "HEAD")
    out["/openapi.json"] = {"get"}
    return out


def _path_params(path: str) -> list[str]:
    import re

    return [m.split(":")[0] for m in re.findall(r"{([^}]+)}", path)]


# -- the process --------------------------------------------------------------------------


def run(
    config_path: Path,
    *,
    listen: str | None = None,
    state_dir: Path | None = None,
    ready_file: Path | None = None,
    record: Path | None = None,
    attach: Callable[[LiveController], object] | None = None,
) -> int:
    """``xce-resize controller``: serve until SIGTERM/SIGINT; the exit status.

    ``listen``, ``state_dir`` and ``record`` override the configuration's keys.
    ``attach`` is called with the controller before it opens (the command line attaches
    the run's recording there, when the configuration asks for one).
    """
    import uvicorn

    from xce_resize_plugin.controllers.live import settings as config_mod

    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s controller %(levelname)s %(name)s: %(message)s"
    )
    for noisy in ("httpx", "httpcore", "uvicorn.access"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    cfg = config_mod.load(config_path)
    if listen is not None:
        host, port = parse_listen(listen)
        cfg = evolve(cfg, listen_host=host, listen_port=port)
    if state_dir is not None:
        cfg = evolve(cfg, state_dir=state_dir.resolve())
    if record is not None:
        cfg = evolve(cfg, record=record.resolve())
    # Bind first: a controller started twice by mistake on one address must fail
    # before it opens the state directory (opening it would fence the running one).
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
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
        return EXIT_USAGE
    sock.listen(128)
    from xce_resize_plugin.manager import get_plugin_manager

    pm = get_plugin_manager(cfg.resize, base_dir=cfg.path.parent if cfg.path else None)
    try:
        ctl = LiveController(pm, cfg)
    except EmbeddedError as exc:
        # A corrupt or newer-schema state directory: never start on half a state.
        sock.close()
        print(f"xce-resize controller: {exc}", file=sys.stderr)
        return EXIT_ERROR
    try:
        if attach is not None:
            attach(ctl)
        ctl.open()
        app = build_app(ctl)
    except BaseException:
        ctl.shutdown()
        sock.close()
        raise
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            log_level="warning",
            access_log=False,
            lifespan="off",
            timeout_graceful_shutdown=2,
        )
    )

    def stop_serving() -> None:
        server.should_exit = True
        # A fenced controller must not linger: if the server does not stop, exit hard.
        timer = threading.Timer(5.0, lambda: _hard_exit(EXIT_FENCED))
        timer.daemon = True
        timer.start()

    ctl.on_fenced = stop_serving
    if ready_file is not None:
        from xce_resize_plugin.controllers.live.proc import atomic_write

        atomic_write(
            ready_file,
            json.dumps(
                {"url": cfg.controller_url, "epoch": ctl.live_store.epoch, "time": time.time()}
            ),
        )
    log.info(
        "controller epoch %d serving http://%s:%d (%d hosts)",
        ctl.live_store.epoch,
        cfg.listen_host,
        cfg.listen_port,
        len(cfg.hosts),
    )

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
    if ctl.fenced is not None:
        print(f"xce-resize controller: stopped: {ctl.fenced}", file=sys.stderr)
        return EXIT_FENCED
    return EXIT_OK


def _hard_exit(code: int) -> None:
    import os

    logging.shutdown()
    os._exit(code)


__all__ = ["build_app", "error_problem", "openapi_document", "plugin_routes", "problem", "run"]
