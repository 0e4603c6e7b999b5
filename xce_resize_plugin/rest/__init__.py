"""The REST layer: one HTTP machinery for the plugin's resize routes and a host's own.

- :mod:`.http`: the endpoint wrapper (authentication before any body byte, bounded
  body reading within a deadline, problem documents), :class:`~.http.ApiRoute`,
  exception handlers (imports Starlette: imported only when routes are built);
- :mod:`.header_deadline`: the uvicorn protocol that closes a connection whose request
  headers do not come in time (imports uvicorn: imported only when serving);
- :mod:`.openapi`: the one OpenAPI builder, from the operations the routes carry;
- :mod:`.operation`, :mod:`.parsing`, :mod:`.problems`: what a route is, reading the
  parts of a request, what a refusal looks like;
- :mod:`.routes`: the resize routes (``xce_rest_routes``), built from the table in
  :mod:`.resize_operations` with the handlers in :mod:`.resize_handlers` and the
  schemas in :mod:`.schemas`;
- :mod:`.client`: the stdlib HTTP client of ``bresize``, the commands and the in-job API.
"""
