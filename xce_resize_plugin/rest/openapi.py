"""The one OpenAPI 3.1 builder: a document from the routes that are served.

Every route built from an :class:`~xce_resize_plugin.rest.operation.Operation` (see
:class:`~xce_resize_plugin.rest.http.ApiRoute`) is described by that operation, with the
schemas it names; a served route that carries no operation (another plugin's) gets a
minimal entry. So a document lists exactly what its application serves, whoever built
the routes: the resize routes (:mod:`.routes`) and a host's own (the live controller's).
Pure: nothing here imports Starlette.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterable, Mapping
from typing import Any

from xce_resize_plugin.rest.operation import Operation
from xce_resize_plugin.rest.problems import JSON, PROBLEM_JSON

#: The name of the bearer-token security scheme.
BEARER = "bearer"
SECURITY_SCHEMES: dict[str, Any] = {BEARER: {"type": "http", "scheme": "bearer"}}

#: ``GET /openapi.json``: the document itself (no token).
DOCUMENT = Operation(
    "openapi", "GET", "/openapi.json", "This document", "The OpenAPI 3.1 document.", public=True
)

PROBLEM_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "RFC 9457 problem details with LSF's code name and number.",
    "properties": {
        "type": {"type": "string"},
        "title": {"type": "string", "description": "LSF's message for the code."},
        "status": {"type": "integer"},
        "detail": {"type": "string", "description": "The message and the explanation."},
        "code": {"type": "string", "description": "LSBE_* where LSF has one."},
        "lsf_number": {"type": ["integer", "null"]},
    },
    "required": ["type", "title", "status", "detail", "code", "lsf_number"],
}

_REASONS = {
    200: "OK",
    201: "Created",
    202: "Accepted: durable; the change proceeds",
    400: "Malformed request (names the field) or an LSF condition",
    401: "No or unknown bearer token",
    403: "User permission denied",
    404: "No matching job found (also a job the caller may not see)",
    408: "Request body not received within the body deadline",
    409: "Conflicts with the job's state (pending request, change in progress, ...)",
    413: "Request body too large",
    415: "Request body is not JSON",
    503: "Unavailable: no resize plugin, or the controller is stopping",
}
_PROBLEM_CONTENT = {PROBLEM_JSON: {"schema": {"$ref": "#/components/schemas/Problem"}}}


def _ref(schema: str) -> dict[str, Any]:
    return {JSON: {"schema": {"$ref": f"#/components/schemas/{schema}"}}}


def _responses(op: Operation) -> dict[str, Any]:
    ok: dict[str, Any] = {"description": _REASONS[op.status]}
    if op.response is not None:
        ok["content"] = _ref(op.response)
    responses: dict[str, Any] = {str(op.status): ok}
    for status in op.errors:
        responses[str(status)] = {"description": _REASONS[status], "content": _PROBLEM_CONTENT}
    responses["default"] = {"description": "Unexpected error", "content": _PROBLEM_CONTENT}
    return responses


def operation_doc(op: Operation) -> dict[str, Any]:
    """The OpenAPI operation object of ``op``."""
    doc: dict[str, Any] = {"operationId": op.name, "summary": op.summary}
    if op.description:
        doc["description"] = op.description
    if op.tags:
        doc["tags"] = list(op.tags)
    doc["security"] = [] if op.public else [{BEARER: []}]
    if op.params:
        doc["parameters"] = [
            {
                "name": p.name,
                "in": p.location,
                "required": p.required,
                "description": p.description,
                "schema": dict(p.schema),
            }
            for p in op.params
        ]
    doc["responses"] = _responses(op)
    if op.body is not None:
        doc["requestBody"] = {"required": True, "content": _ref(op.body)}
    return doc


def paths_of(operations: Iterable[Operation]) -> dict[str, dict[str, Any]]:
    """The ``paths`` object describing ``operations``."""
    paths: dict[str, dict[str, Any]] = {}
    for op in operations:
        paths.setdefault(op.path, {})[op.method.lower()] = operation_doc(op)
    return paths


def components(schemas: Mapping[str, Any]) -> dict[str, Any]:
    """The ``components`` object: ``schemas`` (a copy the caller may change), the
    ``Problem`` schema every refusal uses, and the bearer security scheme."""
    return {
        "schemas": copy.deepcopy({**schemas, "Problem": PROBLEM_SCHEMA}),
        "securitySchemes": copy.deepcopy(SECURITY_SCHEMES),
    }


def fragment(operations: Iterable[Operation], schemas: Mapping[str, Any]) -> dict[str, Any]:
    """``paths`` and ``components`` of ``operations``, for a host to merge into its
    own document."""
    return {"paths": paths_of(operations), "components": components(schemas)}


def wrap(
    title: str, version: str, paths: Mapping[str, Any], parts: Mapping[str, Any]
) -> dict[str, Any]:
    """A whole OpenAPI 3.1 document from its ``paths`` and ``components``."""
    return {
        "openapi": "3.1.0",
        "info": {"title": title, "version": version},
        "paths": dict(paths),
        "components": dict(parts),
        "security": [{BEARER: []}],
    }


def _undescribed(path: str) -> dict[str, Any]:
    names = [m.split(":")[0] for m in re.findall(r"{([^}]+)}", path)]
    return {
        "summary": "Plugin route",
        "parameters": [
            {"name": n, "in": "path", "required": True, "schema": {"type": "string"}} for n in names
        ],
        "responses": {"default": {"description": "see the plugin's documentation"}},
    }


def document(title: str, version: str, routes: Iterable[Any]) -> dict[str, Any]:
    """The document of exactly these (Starlette) routes.

    A route with an ``operation`` attribute (an ``ApiRoute``) is described by it and
    brings its ``schemas``; any other route with a path and methods gets a minimal
    entry (``HEAD``, which Starlette answers for every ``GET``, is not listed).
    """
    described: list[Operation] = []
    schemas: dict[str, Any] = {}
    others: list[tuple[str, str]] = []
    for route in routes:
        op = getattr(route, "operation", None)
        if isinstance(op, Operation):
            described.append(op)
            schemas.update(getattr(route, "schemas", None) or {})
            continue
        path = getattr(route, "path", None)
        for method in sorted(getattr(route, "methods", None) or ()):
            if path is not None and method != "HEAD":
                others.append((path, method.lower()))
    paths = paths_of(described)
    for path, method in others:
        paths.setdefault(path, {}).setdefault(method, _undescribed(path))
    return wrap(title, version, paths, components(schemas))


__all__ = [
    "BEARER",
    "DOCUMENT",
    "PROBLEM_SCHEMA",
    "SECURITY_SCHEMES",
    "components",
    "document",
    "fragment",
    "operation_doc",
    "paths_of",
    "wrap",
]
