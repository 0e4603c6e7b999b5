"""Grows and the queue on the live controller, with real agents and task processes: a
grow never takes the blocked head's slots, and ``reclaim = "shrink"`` starts the head
by shrinking a resizable job (docs/admin-guide.md, "Reclaim")."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from xce_resize_plugin.controllers.live import settings as live_config
from xce_resize_plugin.controllers.live.live_controller import LiveController
from xce_resize_plugin.controllers.observer import Observer
from xce_resize_plugin.core.models import GrowRequest
from xce_resize_plugin.host import Principal
from xce_resize_plugin.manager import get_plugin_manager
from xce_resize_plugin.testing.live import kill_marked, wait_until

CONFIG = """
[controller]
listen = "127.0.0.1:7001"
state_dir = "state"
single_user = true

[cluster]
hosts = {{ h1 = 2, h2 = 2 }}

[users]
tokens = {{ alice = "alice-secret-1" }}

[resize]
stop_grace = 1
{resize}
"""


class Cycles(Observer):
    """Counts the controller's settled instants (each one ran the plugin's hooks)."""

    def __init__(self) -> None:
        self.count = 0
        self._lock = threading.Lock()

    def cycles_ended(self, time: float, changed: bool) -> None:
        with self._lock:
            self.count += 1


def _controller(tmp_path: Path, resize: str = "") -> LiveController:
    path = tmp_path / "c.toml"
    path.write_text(CONFIG.format(resize=resize))
    cfg = live_config.load(path)
    ctl = LiveController(get_plugin_manager(cfg.resize), cfg)
    ctl.open()
    return ctl


def _submit(ctl: LiveController, tasks: str | int, **extra: Any) -> str:
    body = {"command": ["sleep", "600"], "tasks": tasks, **extra}
    job_id: str = ctl.submit_job(Principal("alice"), body)["id"]
    return job_id


def test_a_grow_waits_while_the_head_is_blocked(tmp_path: Path) -> None:
    ctl = _controller(tmp_path)
    try:
        cycles = Cycles()
        ctl.embedded.add_observer(cycles)
        grower = _submit(ctl, "1,4", alloc={"h1": 1}, resizable=True)
        wait_until(lambda: ctl.job_json(grower)["state"] == "RUN", 10, "the job running")
        head = _submit(ctl, 4)  # needs every slot: blocked behind the grower
        ctl.embedded.settle()
        assert ctl.embedded.reservation is not None
        assert ctl.embedded.reservation.job_id == head
        ctl.plugin_manager.hook.xce_resize_request(
            controller=ctl, principal=Principal("alice"), job_id=grower, request=GrowRequest(1, 3)
        )
        seen = cycles.count
        wait_until(lambda: cycles.count >= seen + 5, 20, "five more controller cycles")
        job = ctl.job_json(grower)
        # Three slots are free, but all of them are the head's: the grow still waits.
        assert job["resize"]["phase"] == "GROW_PENDING"
        assert len(job["allocation"]) == 1
        assert ctl.job_json(head)["state"] == "PEND"
    finally:
        ctl.shutdown()
        kill_marked(str(tmp_path))


def test_reclaim_shrinks_a_resizable_job_for_the_head(tmp_path: Path) -> None:
    ctl = _controller(tmp_path, 'reclaim = "shrink"')
    try:
        donor = _submit(ctl, "1,4", alloc={"h1": 2, "h2": 1}, resizable=True)
        wait_until(lambda: ctl.job_json(donor)["state"] == "RUN", 10, "the donor running")
        head = _submit(ctl, 2)  # one slot is free: the donor gives one task
        wait_until(lambda: ctl.job_json(head)["state"] == "RUN", 20, "the head running")
        job = ctl.job_json(donor)
        assert len(job["allocation"]) == 2
        assert 0 in {t["id"] for t in job["allocation"]}
        assert ctl.check_invariants() == []
    finally:
        ctl.shutdown()
        kill_marked(str(tmp_path))
