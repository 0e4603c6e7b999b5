"""Pytest fixtures for testing site policies, hosts and the plugin itself (a pytest plugin).

Installed with the package under the ``pytest11`` entry point ``xce_resize``, so any
test run where ``xce_resize_plugin`` is installed has these fixtures (docs/hooks.md,
"Testing your policy", has an example to copy):

- ``resize_config``: the ``[resize]`` section the other fixtures use; ``{}`` unless a
  test module or ``conftest.py`` overrides it, e.g. with ``{"policy_files": [...]}``
  (relative paths are taken from pytest's rootdir);
- ``resize_plugin_manager``: :func:`~xce_resize_plugin.get_plugin_manager` on it without
  entry points: the plugin, the built-in policies and the configured policy files;
- ``resize_sim``: the embedded controller in simulated time with that manager, on hosts
  ``hA``..``hD`` with 4 slots each, closed after the test;
- ``resize_sim_factory``: makes more such controllers
  (:class:`~xce_resize_plugin.testing.sim.SimControllers`), all closed after the test;
- ``resize_scenario``: runs a scenario file, or a scenario table, and returns its
  :class:`~xce_resize_plugin.scenarios.result.ScenarioResult`;
- ``resize_live_factory``: makes live clusters, a real controller and agents in
  ``tmp_path`` (:class:`~xce_resize_plugin.testing.live.LiveCluster`); every process
  they caused is killed by pid after the test.

:func:`make_job` and :func:`grow_host_view` build a hook's arguments for calling a
policy's functions directly. The controllers are imported inside the fixtures, so that
loading this plugin costs a pytest run nothing it does not use.
"""

from __future__ import annotations

import importlib
import itertools
import sys
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    import pluggy

    from xce_resize_plugin.controllers.sim import EmbeddedController
    from xce_resize_plugin.scenarios.result import ScenarioResult
    from xce_resize_plugin.testing.live import LiveCluster
    from xce_resize_plugin.testing.sim import SimControllers, grow_host_view, make_job

__all__ = [
    "grow_host_view",
    "make_job",
    "resize_config",
    "resize_live_factory",
    "resize_plugin_manager",
    "resize_scenario",
    "resize_sim",
    "resize_sim_factory",
]

#: The live cluster a factory call makes without ``hosts``.
LIVE_HOSTS: Mapping[str, int] = {"h1": 2, "h2": 2}
#: Short stop grace and notification timeout: tests wait for both.
LIVE_RESIZE: Mapping[str, Any] = {"stop_grace": 1.0, "notify_timeout": 5.0}


def __getattr__(name: str) -> Any:
    # The builders live with the controller they need; importing them is deferred.
    if name in ("make_job", "grow_host_view"):
        return getattr(importlib.import_module(f"{__name__}.sim"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _rooted(config: Mapping[str, Any], root: Path) -> dict[str, Any]:
    """``config`` with relative policy files taken from ``root`` (made absolute)."""
    out = dict(config)
    if isinstance(out.get("policy_files"), list):
        out["policy_files"] = [str(root / f) for f in out["policy_files"]]
    return out


@pytest.fixture
def resize_config() -> dict[str, Any]:
    """The ``[resize]`` section for the fixtures below; override it to test a policy."""
    return {}


@pytest.fixture
def resize_plugin_manager(
    resize_config: Mapping[str, Any], pytestconfig: pytest.Config
) -> pluggy.PluginManager:
    """A manager with the plugin, the built-in policies and ``resize_config``'s files."""
    from xce_resize_plugin.manager import get_plugin_manager

    return get_plugin_manager(resize_config, base_dir=pytestconfig.rootpath, entry_points=False)


@pytest.fixture
def resize_sim_factory(
    tmp_path: Path, resize_config: Mapping[str, Any], pytestconfig: pytest.Config
) -> Iterator[SimControllers]:
    """Makes embedded controllers (state in ``tmp_path/state`` unless told otherwise);
    closes them after the test."""
    from xce_resize_plugin.testing.sim import SimControllers

    factory = SimControllers(tmp_path / "state", _rooted(resize_config, pytestconfig.rootpath))
    try:
        yield factory
    finally:
        factory.close_all()


@pytest.fixture
def resize_sim(
    resize_sim_factory: SimControllers, resize_plugin_manager: pluggy.PluginManager
) -> EmbeddedController:
    """A started embedded controller with ``resize_plugin_manager``, hosts ``hA``..``hD``
    (4 slots each); a job that still holds slots after it ended is an error (strict)."""
    return resize_sim_factory(
        pm=resize_plugin_manager, config=resize_sim_factory.config, strict=True
    )


@pytest.fixture
def resize_scenario(
    tmp_path: Path, resize_config: Mapping[str, Any], pytestconfig: pytest.Config
) -> Callable[..., ScenarioResult]:
    """``resize_scenario(file_or_table)``: run a scenario, each run on a new state.

    A table without a ``[resize]`` section gets ``resize_config``; its relative paths
    are taken from the rootdir.
    """
    from xce_resize_plugin.testing.sim import run_scenario

    runs = itertools.count(1)
    root = pytestconfig.rootpath

    def run(scenario: Path | str | Mapping[str, Any]) -> ScenarioResult:
        state = tmp_path / f"scenario-{next(runs)}"
        return run_scenario(scenario, state, resize=_rooted(resize_config, root), base_dir=root)

    return run


@pytest.fixture
def resize_live_factory(
    tmp_path: Path, resize_config: Mapping[str, Any], pytestconfig: pytest.Config
) -> Iterator[Callable[..., LiveCluster]]:
    """``resize_live_factory(hosts=None, limits="", controller="", **resize)``: a live
    cluster in ``tmp_path`` (not started: call its ``start()``), ``[resize]`` =
    ``resize_config`` with short test timeouts and ``resize``, ``controller``: extra
    ``[controller]`` lines. Needs Linux and the ``live`` extra."""
    if not sys.platform.startswith("linux"):  # pragma: no cover
        pytest.skip("the live controller needs Linux (/proc, flock)")
    for module in ("httpx", "uvicorn", "starlette"):
        pytest.importorskip(module)
    from xce_resize_plugin.testing.live import LiveCluster, kill_marked

    made: list[LiveCluster] = []
    base = _rooted(resize_config, pytestconfig.rootpath)

    def make(
        hosts: Mapping[str, int] | None = None,
        limits: str = "",
        controller: str = "",
        **resize: Any,
    ) -> LiveCluster:
        settings = {**base, **LIVE_RESIZE, **resize}
        cluster = LiveCluster(tmp_path, dict(hosts or LIVE_HOSTS), settings, limits, controller)
        made.append(cluster)
        return cluster

    try:
        yield make
    finally:
        for cluster in made:
            cluster.cleanup()
        kill_marked(str(tmp_path))
