"""What a scenario run produced: its commands' outcomes, jobs, hosts, users and facts.

:mod:`.runner` makes a :class:`ScenarioResult`; :func:`.timeline.render` draws it for
people and :meth:`ScenarioResult.to_json` is the ``--json`` document.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from attrs import field, frozen

from xce_resize_plugin.core.facts import Fact
from xce_resize_plugin.scenarios.files import HostCommand, Scenario

__all__ = ["CommandResult", "ScenarioResult"]


@frozen
class CommandResult:
    at: float
    user: str
    argv: tuple[str, ...] | None
    resize: Mapping[str, Any] | None
    exit: int
    code: str | None
    message: str
    output: str = ""
    #: The journal's last sequence number before the command ran: orders the command
    #: among the facts of the same instant in the timeline.
    seq: int = 0
    #: A ``host`` command (``argv`` and ``resize`` are then ``None``).
    host: HostCommand | None = None


@frozen
class ScenarioResult:
    """Everything a scenario run produced, for ``--json`` and for the timeline."""

    scenario: Scenario
    end_time: float
    commands: tuple[CommandResult, ...]
    jobs: Mapping[str, Mapping[str, Any]]
    hosts: Mapping[str, Mapping[str, int]]
    users: Mapping[str, Mapping[str, int]]
    facts: tuple[tuple[int, Fact], ...]
    notifications: tuple[Mapping[str, Any], ...]
    problems: tuple[str, ...]
    #: Jobs refused when they arrived (submit > 0): ``(time, job id, reason)``.
    rejected: tuple[tuple[float, str, str], ...] = ()
    #: Host -> its state at the end (``ok``, ``closed``, ``unavail``).
    host_states: Mapping[str, str] = field(factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "scenario": str(self.scenario.path),
            "end_time": self.end_time,
            "commands": [_command_json(c) for c in self.commands],
            "jobs": dict(self.jobs),
            "hosts": {
                h: {**v, "state": self.host_states.get(h, "ok")} for h, v in self.hosts.items()
            },
            "users": dict(self.users),
            "rejected_jobs": [
                {"time": t, "job": j, "reason": reason} for t, j, reason in self.rejected
            ],
            "notifications": list(self.notifications),
            "invariant_problems": list(self.problems),
        }


def _command_json(c: CommandResult) -> dict[str, Any]:
    out: dict[str, Any] = {"at": c.at, "user": c.user}
    if c.host is not None:
        out["host"] = {"name": c.host.name, "state": c.host.state, "evacuate": c.host.evacuate}
    elif c.argv is not None:
        out["argv"] = list(c.argv)
    else:
        out["resize"] = dict(c.resize or {})
    out.update({"exit": c.exit, "code": c.code, "message": c.message})
    if c.host is not None:
        out["output"] = c.output
    return out
