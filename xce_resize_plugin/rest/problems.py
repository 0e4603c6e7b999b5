"""Problem documents: how every refusal of every route looks (RFC 9457).

A :class:`~xce_resize_plugin.errors.ResizeError` becomes ``application/problem+json``
carrying LSF's code name, number and message (docs/rest-api.md, "Errors"); anything
unexpected becomes the same shape with status 500, its text kept for the log. A storage
error (the state could not be written) is a 503 that says when to retry
(:func:`retry_after`).
"""

from __future__ import annotations

import json
from typing import Any

from xce_resize_plugin.errors import FencedError, JournalError, ResizeError

#: Base of the problem ``type`` URIs: the code is appended.
PROBLEM_BASE = "https://xce.example/problems/"
PROBLEM_JSON = "application/problem+json"
JSON = "application/json"
#: Seconds a client waits before it sends again a request refused because the state
#: could not be written (the ``Retry-After`` header of those 503 answers).
RETRY_AFTER = 5


def render(data: Any) -> bytes:
    """The compact UTF-8 JSON of an answer."""
    # ensure_ascii=False keeps host names readable; "backslashreplace" turns a lone
    # surrogate (which json.loads lets through) into a \udXXX escape, which is itself
    # valid JSON, so a reply can never fail to encode.
    text = json.dumps(data, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    return text.encode("utf-8", "backslashreplace")


def problem_json(
    status: int, title: str, detail: str, code: str, lsf_number: int | None = None
) -> dict[str, Any]:
    """An RFC 9457 problem document with the resize extension members."""
    return {
        "type": PROBLEM_BASE + code,
        "title": title,
        "status": status,
        "detail": detail,
        "code": code,
        "lsf_number": lsf_number,
    }


def error_json(error: ResizeError) -> dict[str, Any]:
    """The problem document of a resize error: LSF's code name, number and message."""
    return problem_json(error.http_status, error.message, error.text, error.code, error.lsf_number)


def retry_after(error: ResizeError) -> int | None:
    """``Retry-After`` (seconds) for a refusal that passes by itself, else ``None``.

    Storage errors — the journal or the controller's state could not be written or
    read (a full or failing disk) — are answered 503 with :data:`RETRY_AFTER`: nothing
    was changed, and the same request may succeed once the disk works again. A fenced
    controller never comes back (a newer one took over), so it gets none.
    """
    if isinstance(error, JournalError) and not isinstance(error, FencedError):
        return RETRY_AFTER
    return None


def internal_json() -> dict[str, Any]:
    """The problem document of a bug: its text is in the log, never in the answer."""
    return problem_json(500, "Internal error", "see the controller log", "XCE_INTERNAL")


def routing_json(status: int, detail: str) -> dict[str, Any]:
    """The problem document of a routing refusal (unknown path 404, method 405)."""
    doc = problem_json(status, detail, detail, f"HTTP_{status}")
    doc["type"] = "about:blank"
    return doc


__all__ = [
    "JSON",
    "PROBLEM_BASE",
    "PROBLEM_JSON",
    "RETRY_AFTER",
    "error_json",
    "internal_json",
    "problem_json",
    "render",
    "retry_after",
    "routing_json",
]
