"""What a route is, for serving and for describing: one :class:`Operation` per route.

The routes are built from operations (:func:`xce_resize_plugin.rest.http.api_route`) and
the OpenAPI document is built from the same operations
(:mod:`xce_resize_plugin.rest.openapi`), so what is documented is what is served.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from attrs import frozen


@frozen
class Param:
    """A path or query parameter: its name, schema, whether it is required, what it
    means, and where it is (``"path"`` or ``"query"``)."""

    name: str
    schema: Mapping[str, Any]
    required: bool
    description: str
    location: str = "query"


@frozen
class Operation:
    """One served operation.

    ``status`` and ``response`` are the success answer (``response`` names a schema,
    ``None``: no JSON body described); ``body`` names the request body's schema;
    ``errors`` lists the problem statuses it can answer; a ``public`` operation needs no
    token.
    """

    name: str
    method: str
    path: str
    summary: str
    description: str = ""
    status: int = 200
    response: str | None = None
    body: str | None = None
    params: tuple[Param, ...] = ()
    errors: tuple[int, ...] = ()
    public: bool = False
    tags: tuple[str, ...] = ()

    @property
    def query(self) -> tuple[Param, ...]:
        """The query parameters (a request with any other is refused)."""
        return tuple(p for p in self.params if p.location == "query")


__all__ = ["Operation", "Param"]
