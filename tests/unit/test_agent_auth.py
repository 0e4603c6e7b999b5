"""Signed calls between the controller and its agents (controllers/live/agent_auth.py):
the secret never crosses the wire, a call is good once, for one port, for a minute, with
its own body; an answer is taken only when signed for the call."""

from __future__ import annotations

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.http_stub import answering
from xce_resize_plugin.controllers.live.agent_auth import (
    HEADER,
    WINDOW,
    Keys,
    NotAuthorised,
    RequestCheck,
    check_response,
    sign_request,
    sign_response,
)
from xce_resize_plugin.controllers.live.agent_client import AgentAuth, NotTheAgent

SECRET = "s3cr3t-of-the-controller"
KEYS = Keys(SECRET)
NOW = 1_700_000_000.0


def _signed(method: str = "POST", target: str = "/v1/commands", port: int = 4000) -> str:
    return sign_request(KEYS, method, target, port, b'{"a":1}', NOW, "n1")


def test_a_signed_request_passes_once_and_carries_no_secret() -> None:
    header = _signed()
    assert SECRET not in header
    check = RequestCheck(KEYS, 4000)
    nonce, digest = check.check("POST", "/v1/commands", header, NOW + 1)
    assert nonce == "n1"
    RequestCheck.check_body(b'{"a":1}', digest)
    with pytest.raises(NotAuthorised, match="played again"):
        check.check("POST", "/v1/commands", header, NOW + 2)


@pytest.mark.parametrize(
    ("method", "target", "port", "now", "says"),
    [
        ("GET", "/v1/commands", 4000, NOW, "bad signature"),
        ("POST", "/v1/snapshot", 4000, NOW, "bad signature"),
        # Made for a port a squatter held: the agent on another port refuses it.
        ("POST", "/v1/commands", 4001, NOW, "bad signature"),
        ("POST", "/v1/commands", 4000, NOW + WINDOW + 1, "too old"),
        ("POST", "/v1/commands", 4000, NOW - WINDOW - 1, "from the future"),
    ],
)
def test_a_request_for_another_call_port_or_time_is_refused(
    method: str, target: str, port: int, now: float, says: str
) -> None:
    with pytest.raises(NotAuthorised, match=says):
        RequestCheck(KEYS, port).check(method, target, _signed(), now)


def test_another_secret_a_bearer_token_or_another_body_is_refused() -> None:
    check = RequestCheck(KEYS, 4000)
    other = sign_request(Keys("other"), "POST", "/v1/commands", 4000, b"", NOW, "n2")
    for header in (other, f"Bearer {SECRET}", "", "v1 1 2 3"):
        with pytest.raises(NotAuthorised):
            check.check("POST", "/v1/commands", header, NOW)
    _, digest = check.check("POST", "/v1/commands", _signed(), NOW)
    with pytest.raises(NotAuthorised, match="body not the one signed"):
        RequestCheck.check_body(b'{"a":2}', digest)


@given(status=st.integers(100, 599), body=st.binary(max_size=64), nonce=st.text(max_size=8))
def test_an_answer_is_taken_only_for_its_call(status: int, body: bytes, nonce: str) -> None:
    signature = sign_response(KEYS, nonce, status, body)
    assert check_response(KEYS, nonce, status, body, signature)
    assert not check_response(KEYS, nonce + "x", status, body, signature)
    assert not check_response(KEYS, nonce, status, body + b"x", signature)
    assert not check_response(Keys("other"), nonce, status, body, signature)
    # A request's key is not an answer's: one direction's signature is no other's.
    assert signature != sign_request(KEYS, "GET", "/", status, body, NOW, nonce).split()[-1]


def test_a_process_on_the_agents_port_learns_no_secret_and_is_not_believed() -> None:
    snapshot = b'{"instance": "evil", "pid": 1, "seq": 0, "tasks": []}'
    with answering(snapshot) as squatter:
        with pytest.raises(NotTheAgent), httpx.Client(auth=AgentAuth(SECRET)) as client:
            client.get(f"{squatter.url}/v1/snapshot", params={"epoch": 1})
        (sent,) = squatter.seen
    assert SECRET.encode() not in sent and b"authorization" not in sent.lower()
    assert HEADER.lower().encode() in sent.lower()
    # A handler that catches broken connections catches this one too.
    assert issubclass(NotTheAgent, httpx.TransportError)


def test_the_nonces_are_forgotten_after_the_clock_steps_back() -> None:
    """Kept in arrival order and forgotten from the oldest: after the clock stepped back
    the oldest looked "in the future" and none was forgotten until every call was
    refused (too many requests)."""
    check = RequestCheck(KEYS, 4000)
    check.check("POST", "/v1/commands", _signed(), NOW)
    back = NOW - 10_000
    later = sign_request(KEYS, "POST", "/v1/commands", 4000, b"", back, "n2")
    check.check("POST", "/v1/commands", later, back)
    assert list(check._seen) == ["n2"]
