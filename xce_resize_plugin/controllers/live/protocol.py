"""The live controller's side of the Controller protocol.

The third layer of :class:`~.live_controller.LiveController` (see :mod:`.live_state`):
the protocol methods the plugin calls are the embedded controller's (under the shared
lock), with this controller's tokens (user and job tokens), hostfiles and crash points
(:data:`~.live_state.CRASH_ENV`). A job that a host failure ends keeps its allocation
until its end.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Concatenate, ParamSpec, TypeVar

import pluggy

from xce_resize_plugin.controllers.hosts import HOST_FAILURE
from xce_resize_plugin.controllers.live.job_tokens import SALT_FIELD
from xce_resize_plugin.controllers.live.live_state import CRASH_POINTS
from xce_resize_plugin.controllers.live.task_commands import TaskCommands
from xce_resize_plugin.controllers.sim.sim_controller import EmbeddedController
from xce_resize_plugin.core.models import Task
from xce_resize_plugin.host import Principal

log = logging.getLogger(__name__)

_P = ParamSpec("_P")
_R = TypeVar("_R")


def _forward(
    method: Callable[Concatenate[EmbeddedController, _P], _R], crash: str | None = None
) -> Callable[Concatenate[ControllerProtocol, _P], _R]:
    """A Controller protocol method of the live controller: the embedded controller's
    ``method``, then the crash point ``crash`` if one is given (see :data:`CRASH_ENV`).

    The signatures stay where the protocol and the embedded controller state them; mypy
    checks every forward against both.
    """
    if crash is not None and crash not in CRASH_POINTS:
        raise ValueError(f"unknown crash point {crash!r}")

    def forward(self: ControllerProtocol, /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        result = method(self.embedded, *args, **kwargs)
        if crash is not None:
            self._crash(crash)
        return result

    forward.__name__ = method.__name__
    forward.__qualname__ = f"LiveController.{method.__name__}"
    forward.__doc__ = method.__doc__
    return forward


class ControllerProtocol(TaskCommands):
    """The Controller protocol, forwarded to the embedded controller (see the module
    docstring)."""

    @property
    def plugin_manager(self) -> pluggy.PluginManager:
        return self._pm

    @property
    def config(self) -> Mapping[str, Any]:
        """The ``[resize]`` section (read-only)."""
        return self.embedded.config

    @property
    def state_dir(self) -> Path:
        return self.embedded.state_dir

    now = _forward(EmbeddedController.now)
    get_job = _forward(EmbeddedController.get_job)
    slot_headroom = _forward(EmbeddedController.slot_headroom)

    def authenticate(self, token: str | None) -> Principal | None:
        if not token:
            return None
        for entry in self.cfg.tokens:
            if entry.matches(token):
                return Principal(entry.user, admin=entry.user in self.cfg.admins)
        job_id = self._tokens.job_of(token)
        if job_id is None:
            return None
        with self.lock:
            job = self.embedded.record(job_id)
            salt = (self.live_store.get(f"job:{job_id}") or {}).get(SALT_FIELD)
            if job is None or job.finished or not isinstance(salt, str):
                return None
            if not self._tokens.matches(token, job_id, salt):
                return None
            return Principal(job.user, admin=False, job_id=job.id)

    # The plugin calls the methods below from inside its hooks, whose calls hold the
    # lock (the hook-call monitor): the crash points come before any other input.

    reserve_slots = _forward(EmbeddedController.reserve_slots, crash="after-reserve")
    launch_tasks = _forward(EmbeddedController.launch_tasks, crash="after-launch")
    stop_tasks = _forward(EmbeddedController.stop_tasks, crash="after-stop")
    run_notification = _forward(EmbeddedController.run_notification, crash="after-notify")

    def commit_allocation(self, job_id: str, tasks: Sequence[Task], version: int) -> None:
        with self.lock:
            if self._failure_ends(job_id):
                log.info("job %s: v%s not committed: a host failure ends the job", job_id, version)
                return
            before = self._job(job_id).version
            self.embedded.commit_allocation(job_id, tasks, version)
            job = self._job(job_id)
            if job.version != before:
                # Every committed change rewrites the hostfile, atomically.
                self._write_hostfile(job_id, job.tasks)
                self._crash("after-commit")

    # -- a job that a host failure ends keeps its allocation until its end ----------------

    def free_slots(self, job_id: str, task_ids: Sequence[int]) -> None:
        with self.lock:
            if self._failure_ends(job_id):
                kept = {t.id for t in self._job(job_id).tasks}
                task_ids = [i for i in task_ids if i not in kept]
            self.embedded.free_slots(job_id, task_ids)

    def _failure_ends(self, job_id: str) -> bool:
        """Whether a host failure is ending (or requeueing) the job: its processes on
        the other hosts are being stopped, and its lost tasks, unheld, stay in its
        allocation until the end (:meth:`_loss_end`). A change of the job that
        completes meanwhile (a release whose tasks stopped, a grow whose tasks started)
        is not committed and frees no slot of the allocation: a commit would name the
        lost tasks, whose slots are gone (the embedded controller refuses it), and the
        end frees every slot the job holds anyway. The plugin learns of the end then."""
        ending = self._ending.get(job_id)
        return ending is not None and ending[1] == HOST_FAILURE
