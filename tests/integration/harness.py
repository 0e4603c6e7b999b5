"""A small harness: the embedded controller in simulated time with the real plugin
(made by :class:`~xce_resize_plugin.testing.sim.SimControllers`), crash and restart."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from xce_resize_plugin.controllers.sim import EmbeddedController
from xce_resize_plugin.core.models import ResizeRequest
from xce_resize_plugin.core.status import ResizeStatus
from xce_resize_plugin.host import Principal
from xce_resize_plugin.journal import Journal
from xce_resize_plugin.testing.sim import SimControllers

HOSTS = [("hA", 4), ("hB", 4), ("hC", 4), ("hD", 4)]


class Harness:
    def __init__(
        self,
        state_dir: Path,
        hosts: Sequence[tuple[str, int]] = HOSTS,
        config: Mapping[str, Any] | None = None,
        user_slots: Mapping[str, int] | None = None,
        **kw: Any,
    ) -> None:
        self.state_dir = state_dir
        self.config = dict(config or {})
        self.hosts = list(hosts)
        self.user_slots = dict(user_slots or {})
        self.kw = kw
        # The testing plugin's factory: the real plugin, a non-durable store.
        self.controllers = SimControllers(state_dir, self.config)
        self.ctl = self._make()

    def _make(self) -> EmbeddedController:
        return self.controllers(hosts=self.hosts, user_slots=self.user_slots, **self.kw)

    def crash_and_restart(self) -> EmbeddedController:
        """Drop the controller without any stop hook, then start a new one on its state."""
        self.ctl.close()
        self.ctl = self._make()
        return self.ctl

    def request(
        self, user: str, job_id: str, req: ResizeRequest, admin: bool = False
    ) -> ResizeStatus:
        status = self.ctl.request_resize(Principal(user, admin=admin), job_id, req)
        assert status is not None
        self.ctl.settle()
        return status

    def journal_seq(self) -> int:
        with Journal.open(self.state_dir / "resize", readonly=True) as journal:
            return journal.last_seq

    def journal_state(self, job_id: str) -> bytes | None:
        """The job's state as the journal holds it (``None``: never tracked)."""
        with Journal.open(self.state_dir / "resize", readonly=True) as journal:
            stored = journal.state(job_id)
            return None if stored is None else stored.state

    def snapshot(self) -> tuple[Any, ...]:
        """What must not change when a request is rejected."""
        return (
            self.journal_seq(),
            self.ctl.hosts_view(),
            self.ctl.users_view(),
            [(j.id, j.tasks, j.held, j.version) for j in self.ctl.jobs()],
        )
