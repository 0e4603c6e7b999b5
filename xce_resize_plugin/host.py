"""What the plugin needs from its host: the controller and cluster protocols.

XCE (or the embedded controller) passes an object satisfying :class:`Controller` to
every host hook. Every method that changes something is idempotent per task id, because
after a failover the plugin re-issues the effects of in-flight changes (docs/failover.md).

Threads: the plugin's REST routes run in request-handler threads and call
``authenticate``, ``get_job``, ``now`` and ``slot_headroom`` there, and the request,
status, usage and authorize hooks (which call the same methods). A host that serves the
routes must make these safe to call concurrently with its scheduler loop — the live
embedded controller takes one lock around its state.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import pluggy

from xce_resize_plugin.core.models import JobInfo, Principal, Task, TaskEvent

__all__ = ["ClusterView", "Controller", "Principal", "TaskEvent"]


@runtime_checkable
class Controller(Protocol):
    """The host controller as the plugin sees it (docs/host-integration.md)."""

    @property
    def plugin_manager(self) -> pluggy.PluginManager:
        """The manager the host calls the hooks through; the plugin calls policies on it."""

    @property
    def config(self) -> Mapping[str, Any]:
        """The ``[resize]`` section of the controller configuration."""

    @property
    def state_dir(self) -> Path:
        """A local directory the plugin owns for its journal (``state_dir/resize``)."""

    def now(self) -> float:
        """The controller clock in seconds (simulated or wall)."""

    def authenticate(self, token: str | None) -> Principal | None:
        """The principal a bearer token stands for (a user's token, or a job's own
        ``XCE_JOB_TOKEN`` with ``job_id`` set), or ``None`` when it is unknown/absent."""

    def get_job(self, job_id: str) -> JobInfo | None:
        """The job's current view, or ``None`` when the host does not know it."""

    def slot_headroom(self, user: str) -> int | None:
        """Slots ``user`` may still take under limits and quotas (``None``: unlimited)."""

    def reserve_slots(self, job_id: str, tasks: Sequence[Task]) -> None:
        """Charge the job for these tasks' slots (limits, quotas, host usage) from now."""

    def free_slots(self, job_id: str, task_ids: Sequence[int]) -> None:
        """Stop charging the job for these tasks' slots; unknown ids are ignored."""

    def launch_tasks(self, job_id: str, tasks: Sequence[Task], env: Mapping[str, str]) -> None:
        """Start these tasks (already reserved); report through ``xce_task_event``.

        A task id that was launched before is not launched again.
        """

    def stop_tasks(self, job_id: str, task_ids: Sequence[int], grace: float) -> None:
        """SIGTERM, ``grace`` seconds, SIGKILL; report ``exited`` through ``xce_task_event``."""

    def run_notification(
        self,
        job_id: str,
        attempt: int,
        host: str,
        command: str,
        env: Mapping[str, str],
        timeout: float,
    ) -> None:
        """Run ``command`` on ``host`` as the job owner; report via ``xce_notify_done``."""

    def commit_allocation(self, job_id: str, tasks: Sequence[Task], version: int) -> None:
        """The job's allocation is now ``tasks``: update its record, env and hostfile."""


@runtime_checkable
class ClusterView(Protocol):
    """The scheduler cycle's free-slot view handed to ``xce_sched_cycle``."""

    def free_slots(self) -> Mapping[str, int]:
        """Free slots per host, in the cluster's host order, as of this cycle."""
