"""The fixtures of the ``xce_resize`` pytest plugin (xce_resize_plugin.testing)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from xce_resize_plugin import GrowRequest, JobState, Principal, testing
from xce_resize_plugin.testing.sim import DEFAULT_HOSTS, SimControllers

ROOT = Path(__file__).resolve().parents[2]
SCENARIO = ROOT / "tests" / "data" / "scenarios" / "grow_limits.toml"


def test_by_default_the_manager_has_the_plugin_and_the_defaults_only(
    resize_plugin_manager: Any,
) -> None:
    names = {name for name, _ in resize_plugin_manager.list_name_plugin()}
    assert names == {"resize", "resize-defaults"}


@pytest.mark.parametrize("resize_config", [{"policy_files": ["hooks/power_of_two.py"]}])
def test_relative_policy_files_are_taken_from_the_rootdir(
    resize_plugin_manager: Any, resize_sim_factory: SimControllers
) -> None:
    policy = f"policy:{ROOT / 'hooks' / 'power_of_two.py'}"
    assert resize_plugin_manager.has_plugin(policy)
    assert resize_sim_factory.config == {"policy_files": [str(ROOT / "hooks/power_of_two.py")]}
    assert resize_sim_factory().plugin_manager.has_plugin(policy)


def test_resize_sim_runs_the_real_plugin(resize_sim: Any) -> None:
    assert resize_sim.hosts_view() == {h: {"slots": n, "used": 0} for h, n in DEFAULT_HOSTS.items()}
    job = resize_sim.submit("alice", "1,4", alloc={"hA": 1}, resizable=True, runtime=100)
    resize_sim.request_resize(Principal("alice"), job, GrowRequest(2, 2))
    resize_sim.settle()
    assert len(resize_sim.job(job).tasks) == 3
    assert resize_sim.acct_usage(job).records[0].version == 1


def test_a_second_controller_on_the_state_restarts_it(
    resize_sim_factory: SimControllers, tmp_path: Path
) -> None:
    first = resize_sim_factory()
    job = first.submit("alice", "1,4", alloc={"hA": 2}, resizable=True, runtime=100)
    first.close()  # a crash
    second = resize_sim_factory(hosts=None)
    assert second.job(job).state is JobState.RUN and len(second.job(job).tasks) == 2
    other = resize_sim_factory(state_dir=tmp_path / "other", hosts={"x": 1})
    assert list(other.hosts_view()) == ["x"]
    assert resize_sim_factory.made == [first, second, other]


def test_resize_scenario_runs_files_and_tables_each_on_a_new_state(
    resize_scenario: Any,
) -> None:
    first = resize_scenario(SCENARIO)
    again = resize_scenario(str(SCENARIO))
    assert first.to_json() == again.to_json()
    # As `xce-resize scenario run` reports it (tests/e2e/test_cli.py).
    assert [(c.exit, c.code) for c in first.commands] == [
        (0, None),
        (0, None),
        (255, "LSBE_RESIZE_NO_ACTIVE_REQUEST"),
    ]
    assert first.jobs["221"]["hosts"] == {"n1": 2, "n2": 2, "n3": 2, "n4": 1}
    table = resize_scenario(
        {
            "cluster": {"hosts": {"h": 2}},
            "jobs": [{"user": "u", "tasks": "1,2", "resizable": True, "runtime": 10}],
            "commands": [{"at": 1, "user": "u", "bresize": "request 1 101"}],
        }
    )
    assert table.jobs["101"]["hosts"] == {"h": 2} and table.problems == ()


def test_the_builders_are_reached_through_the_plugin_module() -> None:
    job = testing.make_job({"a": 2, "b": 1}, user="bob")
    assert [(t.id, t.host) for t in job.tasks] == [(0, "a"), (1, "a"), (2, "b")]
    assert job.user == "bob" and job.state is JobState.RUN
    view = testing.grow_host_view({"a": 0, "b": 3}, {"a": 2})
    assert (view.free("b"), view.job_tasks("a"), list(view)) == (3, 2, ["a", "b"])
    with pytest.raises(AttributeError):
        _ = testing.no_such_name  # type: ignore[attr-defined]
