"""Administrators' host commands on the live controller (``xce-resize hosts``, ``host
close|open|down|up``), and what each caller may see of the hosts.

``GET /v1/hosts`` lists every host's state, slots and use; an administrator also sees
the jobs on each host (anyone else sees only their own there). ``POST
/v1/hosts/{name}/close`` (body ``{"evacuate": bool}``, optional) and ``.../open`` drain
a host and undo it; ``.../down`` fences a host by hand (a host failure now: its tasks
are stopped if its agent answers, and lost either way) and ``.../up`` lets it take
tasks again once its agent is registered, through the controller's host API
(docs/admin-guide.md, "Host states").
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from xce_resize_plugin.controllers.hosts import HostDrain, HostFailure, HostView
from xce_resize_plugin.controllers.violations import HostStateError, UnknownHost
from xce_resize_plugin.errors import InvalidRequest, PermissionDenied, ResizeError
from xce_resize_plugin.host import Principal
from xce_resize_plugin.rest.operation import Operation, Param

ACTIONS = ("close", "open", "down", "up")
#: The controller's refusals of a host command (answered 404 and 409).
HOST_ERRORS = (UnknownHost, HostStateError)


class NoSuchHost(ResizeError):
    """A host command named a host the cluster does not have."""

    code = "XCE_NO_SUCH_HOST"
    message = "No such host"
    http_status = 404


class HostStateConflict(ResizeError):
    """A host command that does not apply to the host's state (closing a closed host,
    opening an open one, failing a failed one, bringing up one that is not down)."""

    code = "XCE_HOST_STATE"
    message = "The host is not in a state this command applies to"
    http_status = 409


def hosts_json(
    views: list[HostView], principal: Principal, owners: Mapping[str, str]
) -> list[dict[str, Any]]:
    """The hosts as ``principal`` may see them: an administrator sees every job on each
    host; a user only their own jobs (``owners``: job id -> user); a job's token only
    its job, as everywhere else (docs/rest-api.md, "Authentication and who may do
    what"): its owner's other jobs are not its to see."""
    out = []
    for view in views:
        doc = view.as_json()
        if not principal.admin:
            doc["jobs"] = {
                j: n
                for j, n in view.jobs.items()
                if j in owners and principal.may_act_on(j, owners[j])
            }
        out.append(doc)
    return out


def check_command(principal: Principal, action: str, body: Any) -> bool:
    """Who may, and the body: ``evacuate`` (only with ``close``); refuses anything else."""
    if not principal.admin:
        raise PermissionDenied("only administrators may change the state of hosts")
    if action not in ACTIONS:
        raise InvalidRequest(f"unknown host command {action!r} (known: {', '.join(ACTIONS)})")
    if body is None:
        return False
    if not isinstance(body, Mapping) or set(body) - {"evacuate"}:
        raise InvalidRequest('the body must be {"evacuate": true|false} @ $')
    evacuate = body.get("evacuate", False)
    if not isinstance(evacuate, bool):
        raise InvalidRequest("evacuate must be true or false @ $.evacuate")
    if evacuate and action != "close":
        raise InvalidRequest("evacuate goes with close only @ $.evacuate")
    return evacuate


def translated(exc: UnknownHost | HostStateError) -> ResizeError:
    """The controller's host refusals as REST errors."""
    if isinstance(exc, UnknownHost):
        return NoSuchHost(str(exc))
    return HostStateConflict(str(exc))


def drain_json(name: str, state: str, drain: HostDrain | None) -> dict[str, Any]:
    """The answer of a host command: the host's state, and what an evacuation asked."""
    doc: dict[str, Any] = {"host": name, "state": state}
    if drain is not None:
        doc["asked"] = {j: list(ids) for j, ids in drain.asked.items()}
        doc["stays"] = dict(drain.stays)
    return doc


def failure_json(name: str, state: str, failure: HostFailure | None) -> dict[str, Any]:
    """The answer of ``down``: the host's state and what became of each job that had
    tasks there (``shrunk``, ``kept``, ``exit`` or ``requeue``; an ending job's
    processes elsewhere are being stopped)."""
    doc: dict[str, Any] = {"host": name, "state": state}
    if failure is not None:
        doc["jobs"] = {j: o.value for j, o in failure.outcomes.items()}
    return doc


# -- the routes ---------------------------------------------------------------------------

_NAME = Param("name", {"type": "string"}, True, "The host.", location="path")
_ACTION = Param(
    "action", {"enum": list(ACTIONS)}, True, "close, open, down or up.", location="path"
)
LIST_HOSTS = Operation(
    "list_hosts",
    "GET",
    "/v1/hosts",
    "Every host: state (ok, closed, unavail), slots, used, jobs on it",
    "An administrator sees every job on each host; a user only their own; a job's "
    "token only its job.",
    response="HostList",
    errors=(401, 503),
)
HOST_COMMAND = Operation(
    "host_command",
    "POST",
    "/v1/hosts/{name}/{action}",
    "Close a host to new tasks (optionally evacuating resizable jobs) or open it; "
    "fail a host by hand (down) or let it take tasks again (up)",
    'Administrators only. Body (optional, close only): {"evacuate": true}.',
    response="HostCommandResult",
    params=(_NAME, _ACTION),
    errors=(400, 401, 403, 404, 409, 503),
)
HOST_ADMIN_SCHEMAS: dict[str, Any] = {
    "HostList": {
        "type": "object",
        "properties": {
            "hosts": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "name": {"type": "string"},
                        "state": {"enum": ["ok", "closed", "unavail"]},
                        "slots": {"type": "integer"},
                        "used": {"type": "integer"},
                        "jobs": {"type": "object", "additionalProperties": {"type": "integer"}},
                    },
                },
            }
        },
    },
    "HostCommandResult": {
        "type": "object",
        "required": ["host", "state"],
        "properties": {
            "host": {"type": "string"},
            "state": {"enum": ["ok", "closed", "unavail"]},
            "asked": {"type": "object", "description": "job -> task ids asked to release"},
            "stays": {"type": "object", "description": "job -> why it was not asked"},
            "jobs": {
                "type": "object",
                "description": "down: job -> shrunk, kept, exit or requeue",
            },
        },
    },
}
