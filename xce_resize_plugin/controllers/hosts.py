"""What the controller says about its hosts: their states, and the outcome of a host
failure or a drain (the results of ``host_down`` and ``host_close``).

Frozen views for callers (scenario output, tests, the live controller's routes); the
controller keeps the states themselves in its cluster ledger
(:class:`~xce_resize_plugin.controllers.cluster.Cluster`).
"""

from __future__ import annotations

from collections.abc import Mapping

from attrs import field, frozen

from xce_resize_plugin.controllers.cluster import HostState
from xce_resize_plugin.core.models import LossOutcome

__all__ = ["HostDrain", "HostFailure", "HostState", "HostView"]


#: The exit reason of a job (and its tasks) ended by a host failure.
HOST_FAILURE = "host failure"


@frozen
class HostView:
    """One host: its state, its slots, the slots in use and the jobs holding them."""

    name: str
    state: HostState
    slots: int
    used: int
    #: Job id -> slots it holds on the host, in job order.
    jobs: Mapping[str, int] = field(factory=dict)

    def as_json(self) -> dict[str, object]:
        return {
            "name": self.name,
            "state": self.state.value,
            "slots": self.slots,
            "used": self.used,
            "jobs": dict(self.jobs),
        }


@frozen
class HostFailure:
    """What a host failure did: per job, the task ids lost and what became of the job."""

    host: str
    at: float
    lost: Mapping[str, tuple[int, ...]] = field(factory=dict)
    outcomes: Mapping[str, LossOutcome] = field(factory=dict)


@frozen
class HostDrain:
    """What closing a host with ``evacuate`` asked: the jobs asked to release their
    tasks there (``asked``: job id -> the task ids), and those left to finish there
    with the reason (``stays``: job id -> why)."""

    host: str
    at: float
    asked: Mapping[str, tuple[int, ...]] = field(factory=dict)
    stays: Mapping[str, str] = field(factory=dict)
