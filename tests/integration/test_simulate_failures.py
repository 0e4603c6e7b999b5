"""``simulate --host-failures``: seeded failures, the same in both runs, counted
(docs/simulation.md, "Host failures")."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from xce_resize_plugin.controllers.sim import EmbeddedController
from xce_resize_plugin.errors import ConfigError
from xce_resize_plugin.manager import get_plugin_manager
from xce_resize_plugin.simulation import failures
from xce_resize_plugin.simulation.simulate import SimOptions, load_options, simulate

KTH200 = (
    Path(__file__).resolve().parents[2] / "tests" / "data" / "KTH-SP2-1996-2.1-cln-first200.swf.gz"
)


def test_failures_kill_rigid_jobs_and_shrink_elastic_ones() -> None:
    opts = SimOptions(malleable_fraction=0.5, host_failures=failures.HostFailures(200.0))
    result = simulate(KTH200, opts, parallel=False)
    assert result.problems == []
    rigid, elastic = result.rigid.failures, result.elastic.failures
    assert rigid is not None and elastic is not None
    assert rigid.failures > 0 and rigid.jobs_killed > 0 and rigid.jobs_shrunk == 0
    assert rigid.slot_hours_lost > 0
    assert elastic.jobs_shrunk > 0  # resizable jobs survived failures
    doc = result.to_json()
    assert doc["options"]["host_failures"] == "200:1"
    assert doc["runs"]["elastic"]["host_failures"]["jobs_shrunk"] == elastic.jobs_shrunk
    # Deterministic: the same options give the same document, in parallel or not.
    again = simulate(KTH200, opts, parallel=True).to_json()
    assert json.dumps(again) == json.dumps(doc)


def _injected(tmp_path: Path, name: str, with_job: bool) -> list[tuple[float, str]]:
    config = {"journal_sync": False}
    ctl = EmbeddedController(
        get_plugin_manager(config, entry_points=False),
        tmp_path / name,
        hosts=[("n1", 2), ("n2", 2), ("n3", 2)],
        config=config,
        store="none",
    )
    if with_job:
        ctl.submit("alice", "1,4", resizable=True, runtime=200_000.0, alloc={"n1": 1, "n2": 1})
    injector = failures.FailureInjector(
        ctl, ["n1", "n2", "n3"], failures.HostFailures(2.0, 1.0), 7, lambda: ctl.now() < 100_000
    )
    injector.start()
    ctl.run(until=200_000)
    ctl.stop()
    return injector.log


def test_both_runs_see_the_same_failure_times(tmp_path: Path) -> None:
    """What the jobs do does not move the failures: a run with a job and one without
    draw the same times per host."""
    busy = _injected(tmp_path, "a", True)
    idle = _injected(tmp_path, "b", False)
    assert busy == idle and len(busy) > 5
    assert {host for _, host in busy} == {"n1", "n2", "n3"}


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("x", "MTBF_HOURS must be a number"),
        ("0", "MTBF_HOURS must be a positive finite number"),
        ("5:-1", "REPAIR_HOURS must be a positive finite number"),
        ("5:1:2", "expected MTBF_HOURS[:REPAIR_HOURS]"),
    ],
)
def test_a_bad_spec_names_the_option(spec: str, message: str) -> None:
    with pytest.raises(ConfigError, match="--host-failures") as info:
        load_options(None, host_failures=spec)
    assert message in str(info.value)
    assert failures.parse("5") == failures.HostFailures(5.0, failures.DEFAULT_REPAIR_HOURS)


def test_cli_reports_failures_and_refuses_a_bad_spec() -> None:
    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "xce_resize_plugin.cli.main", "simulate", *args]
        return subprocess.run(argv, capture_output=True, text=True, check=False)

    proc = cli(str(KTH200), "--host-failures", "200:2", "--no-progress", "--sequential")
    assert proc.returncode == 0, proc.stderr
    for row in ("host failures", "jobs killed", "jobs shrunk", "slot-hours lost"):
        assert row in proc.stdout
    proc = cli(str(KTH200), "--host-failures", "soon")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "xce-resize: Configuration error: --host-failures: MTBF_HOURS must be a number, got 'soon'"
    ]
