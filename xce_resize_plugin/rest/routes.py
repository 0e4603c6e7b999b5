"""The resize REST API: ASGI routes the host mounts, and their OpenAPI description.

The host gets the routes from the ``xce_rest_routes`` hook (:func:`routes`); a host
that builds its application with :mod:`.http` gets them described in its own
``/openapi.json`` by :func:`.openapi.document`, and any other host merges
:func:`openapi_paths` into its document; a host with no API of its own can serve
:func:`app`. The routes and the document are built from one table of operations
(:data:`OPERATIONS`, in :mod:`.resize_operations` with the API's limits and parameter
checks), so what is documented is what is served.

Every route is built with the HTTP layer (:mod:`.http`): authentication first (401
before any byte of the body is read), bodies read up to
:data:`~.resize_operations.MAX_BODY` bytes, every
:class:`~xce_resize_plugin.errors.ResizeError` answered as an RFC 9457 problem document
(``application/problem+json``) with LSF's code name, number and message; what each
route then does is in :mod:`.resize_handlers`. The JSON answers are made by
:mod:`xce_resize_plugin.core.converters`.

Starlette is imported only when routes are built, so importing the plugin (which the
host does at start) stays light.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

from xce_resize_plugin.core.converters import history_json, record_json, status_json
from xce_resize_plugin.errors import BodyTooLarge, UnsupportedMediaType
from xce_resize_plugin.host import Controller
from xce_resize_plugin.rest import openapi
from xce_resize_plugin.rest.operation import Operation, Param
from xce_resize_plugin.rest.parsing import bearer_token, check_fields, check_query, parse_json
from xce_resize_plugin.rest.problems import (
    PROBLEM_BASE,
    PROBLEM_JSON,
    error_json,
    problem_json,
)
from xce_resize_plugin.rest.resize_operations import OPERATIONS
from xce_resize_plugin.rest.schemas import SCHEMAS

if TYPE_CHECKING:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

BEARER = openapi.BEARER


def routes(controller: Controller) -> list[Route]:
    """The resize routes for ``controller`` (what ``xce_rest_routes`` returns)."""
    from xce_resize_plugin.rest.resize_handlers import resize_routes

    return list(resize_routes(controller))


def exception_handlers() -> dict[Any, Callable[[Request, Exception], Awaitable[Response]]]:
    """Starlette exception handlers that answer routing errors (404, 405) and uncaught
    exceptions as problem documents, for an app that serves these routes."""
    from xce_resize_plugin.rest import http

    return http.exception_handlers()


def app(controller: Controller, *, title: str = "XCE resize API", version: str = "") -> Starlette:
    """A Starlette app serving only the resize routes and ``/openapi.json``: for a host
    (or a test) with no API of its own."""
    from starlette.applications import Starlette

    from xce_resize_plugin import __version__
    from xce_resize_plugin.rest import http

    served = routes(controller)
    document = http.openapi_route(title, version or __version__, served)
    return http.exact_paths(
        Starlette(routes=[*served, document], exception_handlers=http.exception_handlers())
    )


def openapi_paths() -> dict[str, Any]:
    """The OpenAPI 3.1 fragment of the resize routes: ``paths`` and ``components``
    (schemas and the bearer security scheme), for a host to merge into its document."""
    return openapi.fragment(OPERATIONS, SCHEMAS)


def openapi_document(
    title: str,
    version: str,
    extra_paths: Mapping[str, Any] | None = None,
    extra_schemas: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A whole OpenAPI 3.1 document: the resize routes plus the host's ``extra_paths``
    (and the schemas they refer to), for a host with no document of its own."""
    fragment = openapi_paths()
    paths = dict(fragment["paths"])
    for path, item in (extra_paths or {}).items():
        paths[path] = {**paths.get(path, {}), **item}
    components = fragment["components"]
    components["schemas"].update(extra_schemas or {})
    return openapi.wrap(title, version, paths, components)


__all__ = [
    "BEARER",
    "OPERATIONS",
    "PROBLEM_BASE",
    "PROBLEM_JSON",
    "SCHEMAS",
    "BodyTooLarge",
    "Operation",
    "Param",
    "UnsupportedMediaType",
    "app",
    "bearer_token",
    "check_fields",
    "check_query",
    "error_json",
    "exception_handlers",
    "history_json",
    "openapi_document",
    "openapi_paths",
    "parse_json",
    "problem_json",
    "record_json",
    "routes",
    "status_json",
]
