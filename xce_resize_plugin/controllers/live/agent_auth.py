"""Calls between the controller and its agents, signed both ways: the secret never
crosses the wire.

An agent listens on a loopback port that every process on the host can reach, and
that any process can take once the agent is gone (a crash, an OOM kill). A call that
carried the secret itself (``Authorization: Bearer``) gave it to whoever held the port:
a job that took a crashed agent's port learnt it, and could then have the next agent
run a command as root. So the secret only keys signatures (HMAC-SHA256):

- **A request** carries :data:`HEADER`: ``v1 TIME NONCE BODY-SHA256 SIGNATURE``, the
  signature over the method, the path and query, the agent's port (from its
  registration: a request made for one port is refused on another), the time, the
  nonce and the body's hash. The agent checks the signature before it reads the body,
  the time within :data:`WINDOW` seconds of its own clock (the controller and its
  agents share the host's clock), the nonce as not seen within that window (a recorded
  call cannot be played again), and then the body against its hash.
- **An answer** carries :data:`RESPONSE_HEADER`: a signature over the request's nonce,
  the status and the body, so the controller takes an answer only from a process that
  holds the secret, and only for the call it made (a squatter cannot replay an old one).

Each direction has its own key derived from the secret: a request's signature is no
answer's. The functions here are pure but for the nonce cache; the HTTP side is
:mod:`.worker_server` (the agent) and :class:`.agent_client.AgentAuth` (the controller).
"""

from __future__ import annotations

import hashlib
import hmac
import threading

__all__ = [
    "HEADER",
    "RESPONSE_HEADER",
    "WINDOW",
    "Keys",
    "NotAuthorised",
    "RequestCheck",
    "check_response",
    "sign_request",
    "sign_response",
]

#: The request's signature header, and the answer's.
HEADER = "X-XCE-Agent-Auth"
RESPONSE_HEADER = "X-XCE-Agent-Signature"
#: How far a request's time may be from the agent's clock, in seconds; nonces are kept
#: this long.
WINDOW = 60.0
_VERSION = "v1"
#: More nonces than this within the window is not the controller (it makes a few calls
#: a second per host): refused rather than kept without bound.
_MAX_NONCES = 100_000


class Keys:
    """The two keys derived from the controller-agent secret."""

    def __init__(self, secret: str) -> None:
        raw = secret.encode()
        self.request = hmac.new(raw, b"xce-resize agent request", hashlib.sha256).digest()
        self.response = hmac.new(raw, b"xce-resize agent response", hashlib.sha256).digest()


class NotAuthorised(Exception):
    """A request the agent must refuse (401), with the reason for its log."""


def _mac(key: bytes, *parts: str) -> str:
    return hmac.new(key, "\n".join(parts).encode(), hashlib.sha256).hexdigest()


def sign_request(
    keys: Keys, method: str, target: str, port: int, body: bytes, now: float, nonce: str
) -> str:
    """The :data:`HEADER` value of a request to the agent on ``port``; ``target`` is
    the path with its query (``/v1/events?after=3``)."""
    digest = hashlib.sha256(body).hexdigest()
    stamp = f"{now:.3f}"
    sig = _mac(keys.request, _VERSION, method.upper(), target, str(port), stamp, nonce, digest)
    return f"{_VERSION} {stamp} {nonce} {digest} {sig}"


def sign_response(keys: Keys, nonce: str, status: int, body: bytes) -> str:
    """The :data:`RESPONSE_HEADER` value of the answer to the request of ``nonce``."""
    return _mac(keys.response, _VERSION, nonce, str(status), hashlib.sha256(body).hexdigest())


def check_response(keys: Keys, nonce: str, status: int, body: bytes, signature: str) -> bool:
    """Whether an answer was signed by a holder of the secret for this request."""
    return hmac.compare_digest(sign_response(keys, nonce, status, body), signature)


class RequestCheck:
    """The agent's check of requests (see the module docstring); thread-safe."""

    def __init__(self, keys: Keys, port: int) -> None:
        self._keys = keys
        self._port = port
        self._lock = threading.Lock()
        self._seen: dict[str, float] = {}

    def check(self, method: str, target: str, header: str, now: float) -> tuple[str, str]:
        """``(nonce, body hash)`` of a request whose signature holds, or
        :class:`NotAuthorised`. The body is checked later (:meth:`check_body`)."""
        parts = header.split(" ")
        if len(parts) != 5 or parts[0] != _VERSION:
            raise NotAuthorised("no signature")
        _, stamp, nonce, digest, sig = parts
        signed = (_VERSION, method.upper(), target, str(self._port), stamp, nonce, digest)
        expected = _mac(self._keys.request, *signed)
        if not hmac.compare_digest(expected, sig):
            raise NotAuthorised("bad signature")
        try:
            at = float(stamp)
        except ValueError:
            raise NotAuthorised("bad time") from None
        if not abs(now - at) <= WINDOW:  # also NaN
            raise NotAuthorised("request too old or from the future")
        with self._lock:
            self._forget(now)
            if nonce in self._seen:
                raise NotAuthorised("request played again")
            if len(self._seen) >= _MAX_NONCES:
                raise NotAuthorised("too many requests")
            self._seen[nonce] = now
        return nonce, digest

    def _forget(self, now: float) -> None:
        """Drop the nonces older than the window (kept in arrival order)."""
        stale = []
        for nonce, at in self._seen.items():
            # abs(): after the clock stepped back the oldest entries are "in the
            # future", and nothing was forgotten until every call was refused.
            if abs(now - at) <= 2 * WINDOW:
                break
            stale.append(nonce)
        for nonce in stale:
            del self._seen[nonce]

    @staticmethod
    def check_body(body: bytes, digest: str) -> None:
        """The body is the one signed, or :class:`NotAuthorised`."""
        if not hmac.compare_digest(hashlib.sha256(body).hexdigest(), digest):
            raise NotAuthorised("body not the one signed")
