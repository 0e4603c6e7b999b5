"""The controller's side of signed agent calls (:mod:`.agent_auth`): an ``httpx`` auth
that signs each request for the agent's port and takes only answers signed for it."""

from __future__ import annotations

import secrets
import time
from collections.abc import Generator

import httpx

from xce_resize_plugin.controllers.live.agent_auth import (
    HEADER,
    RESPONSE_HEADER,
    Keys,
    check_response,
    sign_request,
)

__all__ = ["AgentAuth", "NotTheAgent"]


class NotTheAgent(httpx.RemoteProtocolError):
    """An answer not signed by the agent (whoever holds the port does not hold the
    secret): handled as a broken connection, after which the controller reconnects."""


class AgentAuth(httpx.Auth):
    """Signs each request for the port it goes to (the agent refuses one signed for
    another port) and checks the answer's signature."""

    requires_request_body = True
    requires_response_body = True

    def __init__(self, secret: str) -> None:
        self._keys = Keys(secret)

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        nonce = secrets.token_hex(16)
        target = request.url.raw_path.decode("ascii")
        port = request.url.port or 80
        request.headers[HEADER] = sign_request(
            self._keys, request.method, target, port, request.content, time.time(), nonce
        )
        response = yield request
        signature = response.headers.get(RESPONSE_HEADER, "")
        if not check_response(self._keys, nonce, response.status_code, response.content, signature):
            raise NotTheAgent(
                f"the answer on port {port} is not signed by the agent", request=request
            )
