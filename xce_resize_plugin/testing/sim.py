"""The embedded controller in simulated time for tests, scenario runs, and small builders.

:class:`SimControllers` makes controllers (with the real plugin unless told otherwise)
and closes every one it made; :func:`run_scenario` runs a scenario file or table;
:func:`make_job` and :func:`grow_host_view` build what a policy hook receives, for
testing a policy's functions directly. The fixtures in :mod:`xce_resize_plugin.testing`
are built on these.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pluggy

from xce_resize_plugin.controllers.sim import EmbeddedController
from xce_resize_plugin.controllers.sim.sim_controller import HostSpec
from xce_resize_plugin.core.models import JobInfo, JobState, Task
from xce_resize_plugin.core.placement import FreeSlotIndex, GrowHostView
from xce_resize_plugin.manager import get_plugin_manager
from xce_resize_plugin.scenarios import files, runner
from xce_resize_plugin.scenarios.result import ScenarioResult

__all__ = [
    "DEFAULT_HOSTS",
    "SimControllers",
    "grow_host_view",
    "make_job",
    "run_scenario",
]

#: The cluster of a controller made without ``hosts``: four hosts with 4 slots each.
DEFAULT_HOSTS: Mapping[str, int] = {"hA": 4, "hB": 4, "hC": 4, "hD": 4}


class SimControllers:
    """Makes embedded controllers in simulated time; :meth:`close_all` closes them.

    :param state_dir: where a controller keeps its state unless told otherwise. Making
        a second controller on the same directory (after closing the first:
        ``close()`` is a crash, ``stop()`` a clean stop) restarts from that state.
    :param config: the ``[resize]`` section used when a call gives none.
    """

    def __init__(self, state_dir: Path, config: Mapping[str, Any] | None = None) -> None:
        self.state_dir = state_dir
        self.config: Mapping[str, Any] = dict(config or {})
        self.made: list[EmbeddedController] = []

    def __call__(
        self,
        *,
        pm: pluggy.PluginManager | None = None,
        config: Mapping[str, Any] | None = None,
        hosts: HostSpec | None = DEFAULT_HOSTS,
        state_dir: Path | None = None,
        **options: Any,
    ) -> EmbeddedController:
        """A started controller (``durable=False`` unless given).

        :param pm: the plugin manager; default: :func:`~xce_resize_plugin.get_plugin_manager`
            on ``config`` without entry points (the plugin, the built-in policies and
            the configured policy files, nothing installed elsewhere).
        :param config: the ``[resize]`` section; default: the factory's. With ``pm``
            and no ``config``, none is passed (a restart then keeps the saved one).
        :param hosts: host name -> slots; ``None`` on a restart keeps the saved hosts.
        :param options: any other :class:`EmbeddedController` keyword.
        """
        if pm is None:
            config = self.config if config is None else config
            pm = get_plugin_manager(config, entry_points=False)
        options.setdefault("durable", False)
        ctl = EmbeddedController(pm, state_dir or self.state_dir, hosts, config=config, **options)
        self.made.append(ctl)
        return ctl

    def close_all(self) -> None:
        """Close every controller made (a closed one is left as it is)."""
        for ctl in self.made:
            ctl.close()


def run_scenario(
    scenario: Path | str | Mapping[str, Any],
    state_dir: Path,
    *,
    resize: Mapping[str, Any] | None = None,
    base_dir: Path | None = None,
) -> ScenarioResult:
    """Run a scenario file, or a scenario given as the table a file would hold.

    :param state_dir: a new or empty directory for the run's state.
    :param resize: the ``[resize]`` section for a table that has none.
    :param base_dir: where a table's relative paths (policy files) are taken from, as
        from a file in that directory (default: the current directory).
    """
    if isinstance(scenario, Mapping):
        data = dict(scenario)
        if resize is not None and "resize" not in data:
            data["resize"] = dict(resize)
        loaded = files.parse(data, (base_dir or Path.cwd()) / "<scenario>")
    else:
        loaded = files.load(scenario)
    return runner.run(loaded, state_dir)


def make_job(alloc: Mapping[str, int], **fields: Any) -> JobInfo:
    """A running resizable job owned by ``alice`` (id ``"7"``, 1..64 tasks) with
    ``alloc[host]`` tasks on each host in order (task 0 on the first); ``fields``
    replace any :class:`~xce_resize_plugin.JobInfo` field."""
    flat = [host for host, n in alloc.items() for _ in range(n)]
    values: dict[str, Any] = {
        "id": "7",
        "user": "alice",
        "state": JobState.RUN,
        "min_tasks": 1,
        "max_tasks": 64,
        "tasks": tuple(Task(i, host) for i, host in enumerate(flat)),
        "resizable": True,
    }
    values.update(fields)
    return JobInfo(**values)


def grow_host_view(free: Mapping[str, int], job_tasks: Mapping[str, int]) -> GrowHostView:
    """What ``xce_resize_order_grow_hosts`` sees: free slots per host (cluster order)
    and the job's tasks per host (allocation order)."""
    return GrowHostView(FreeSlotIndex(free), job_tasks)
