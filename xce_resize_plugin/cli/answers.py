"""The controller's answers that the client commands show as text, checked first.

``XCE_CONTROLLER_URL`` may name another service, or a controller of another version,
that answers JSON of another shape. Each command structures the answer it shows into
the classes below (the fields it reads, as docs/rest-api.md and the OpenAPI document
describe them; other keys are left alone, so a newer controller's additions do not
break an older client) before it writes a line: an answer of another shape is then
one error naming what is wrong (``… @ $.hosts[0].slots``), and an error in the
command's own code stays a bug with its traceback, not a message about the server.
``--json`` writes the answer as it came.
"""

from __future__ import annotations

import json
import os
from typing import Any, TypeVar

from attrs import field, frozen

from xce_resize_plugin.core.strict_json import describe, strict_converter
from xce_resize_plugin.errors import Unreachable

__all__ = [
    "HostChange",
    "HostList",
    "JobDetail",
    "JobList",
    "ResizeHistory",
    "ResizeView",
    "Submitted",
    "read",
]


@frozen
class Submitted:
    """``POST /v1/jobs``."""

    id: str


@frozen
class HostRow:
    name: str
    state: str
    slots: int
    used: int
    jobs: dict[str, int] = field(factory=dict)


@frozen
class HostList:
    """``GET /v1/hosts``."""

    hosts: list[HostRow]


@frozen
class HostChange:
    """``POST /v1/hosts/{name}/{action}``: the host's state, and what became of its
    jobs (down), which were asked to release tasks there and which stay (close)."""

    host: str
    state: str
    jobs: dict[str, str] = field(factory=dict)
    asked: dict[str, list[int]] = field(factory=dict)
    stays: dict[str, str] = field(factory=dict)


@frozen
class Span:
    """A pending grow (or autoresize demand): how many tasks it adds."""

    min: int
    max: int


@frozen
class TargetSize:
    tasks: int
    release_prefer: list[int] = field(factory=list)


@frozen
class TaskRef:
    id: int


@frozen
class InFlight:
    kind: str
    tasks: list[TaskRef] = field(factory=list)


@frozen
class ResizeView:
    """A job's resize status (the ResizeStatus schema), the parts shown."""

    phase: str
    tasks: list[TaskRef]
    pending: Span | None = None
    demand: Span | None = None
    autoresize: bool = False
    target: TargetSize | None = None
    in_flight: InFlight | None = None


@frozen
class JobRow:
    id: str
    user: str = ""
    state: str = ""
    hosts: dict[str, int] = field(factory=dict)
    resize: ResizeView | None = None


@frozen
class JobList:
    """``GET /v1/jobs``."""

    jobs: list[JobRow]


@frozen
class JobDetail:
    """``GET /v1/jobs/{id}``: what ``xce-resize jobs JOB`` shows."""

    id: str
    user: str | None = None
    state: str | None = None
    command: list[str] | None = None
    min_tasks: int | None = None
    max_tasks: int | None = None
    version: int | None = None
    hosts: dict[str, int] | None = None
    logs: str | None = None
    hostfile: str | None = None
    requeues: int | None = None
    exit_reason: str | None = None
    resize: ResizeView | None = None


@frozen
class Segment:
    start: float
    end: float
    slots: int


@frozen
class Record:
    time: float
    type: str
    before: dict[str, int]
    delta: dict[str, int]
    after: dict[str, int]
    version: int


@frozen
class ResizeHistory:
    """``GET /v1/jobs/{id}/resize/history``."""

    segments: list[Segment]
    slot_seconds: float
    records: list[Record]
    autoresize: bool = False
    demand: Span | None = None


_CONVERTER = strict_converter(forbid_extra_keys=False)
T = TypeVar("T")


def read(doc: Any, kind: type[T]) -> T:
    """``doc`` (an answer's JSON) as ``kind``; :class:`Unreachable` naming the
    controller and what is wrong when it is of another shape."""
    if type(doc) is dict:
        try:
            return _CONVERTER.structure(doc, kind)
        except Exception as exc:  # cattrs' validation errors
            problem = describe(exc)
    else:
        # Every answer is an object: cattrs would name a field of it for anything else.
        what = _JSON_TYPES.get(type(doc), type(doc).__name__)
        shown = "" if doc is None else f" {json.dumps(doc)[:40]}"
        problem = f"expected a JSON object, got {what}{shown} @ $"
    url = os.environ.get("XCE_CONTROLLER_URL") or "the controller"
    raise Unreachable(
        f"{url}: the answer is not one an xce-resize controller gives "
        f"({problem}); is XCE_CONTROLLER_URL right?"
    )


_JSON_TYPES: dict[type, str] = {
    str: "a string",
    list: "an array",
    type(None): "null",
    bool: "a boolean",
    int: "a number",
    float: "a number",
}
