"""``simulate --host-failures``: seeded failures, the same in both runs, counted
(docs/simulation.md, "Host failures")."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import attrs
import pytest

from xce_resize_plugin.controllers.sim import EmbeddedController
from xce_resize_plugin.errors import ConfigError
from xce_resize_plugin.manager import get_plugin_manager
from xce_resize_plugin.simulation import failures
from xce_resize_plugin.simulation.comparison import simulate
from xce_resize_plugin.simulation.jobs_csv import COLUMNS
from xce_resize_plugin.simulation.simulate import SimOptions, load_options

KTH200 = (
    Path(__file__).resolve().parents[2] / "tests" / "data" / "KTH-SP2-1996-2.1-cln-first200.swf.gz"
)
CTC = (
    Path(__file__).resolve().parents[2] / "tests" / "data" / "CTC-SP2-1996-3.1-cln-first1000.swf.gz"
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


REQUEUE_POLICY = Path(__file__).resolve().parents[2] / "hooks" / "requeue_on_host_failure.py"


@pytest.mark.parametrize("driver", ["grow-shrink", "none"])
def test_a_site_that_requeues_what_failures_end_gets_runs_that_end(driver: str) -> None:
    """With the site's requeue policy, jobs a failure ends start again from scratch
    (at most ``max_requeue`` times): every job still ends, the checks hold (a
    requeued run frees its slots, and a malleable job does all its work again), and
    the requeued runs' slot-hours count as lost."""
    opts = SimOptions(
        malleable_fraction=0.5,
        driver=driver,
        host_failures=failures.HostFailures(500.0),
        resize={"policy_files": [str(REQUEUE_POLICY)], "max_requeue": 1},
    )
    result = simulate(KTH200, opts, parallel=False, job_rows=True)
    assert result.problems == []
    plain = simulate(KTH200, attrs.evolve(opts, resize={}), parallel=False)
    for mode in ("rigid", "elastic"):
        requeued = getattr(result, mode).failures
        assert requeued is not None and requeued.jobs_requeued > 0
        doc = result.to_json()["runs"][mode]["host_failures"]
        assert doc["jobs_requeued"] == requeued.jobs_requeued
        # --jobs-out: each job's own count (at most max_requeue), adding up to the run's.
        counts = [row[COLUMNS.index("requeues")] for row in getattr(result, mode).jobs]
        assert len(counts) == 200 and set(counts) == {0, 1}
        assert sum(counts) == requeued.jobs_requeued
        resizes = [row[COLUMNS.index("resizes")] for row in getattr(result, mode).jobs]
        assert sum(resizes) == getattr(result, mode).metrics.resizes
        # Each job's end: the killed ones are EXIT "host failure", the others DONE.
        ends = [
            (row[COLUMNS.index("state")], row[COLUMNS.index("reason")])
            for row in getattr(result, mode).jobs
        ]
        assert ends.count(("EXIT", "host failure")) == requeued.jobs_killed > 0
        assert ends.count(("DONE", "done")) == 200 - requeued.jobs_killed
        # Each refused requeue is one warning, counted (not printed) as one kind.
        (refused,) = getattr(result, mode).warnings
        assert refused.count == requeued.jobs_killed > 0
        assert refused.first.endswith("the most max_requeue allows (1); the job ends")
        assert refused.logger == "xce_resize_plugin.runtime.phases"
        assert result.to_json()["runs"][mode]["warnings"] == [refused.to_json()]
    # With max_requeue = 0 every requeue is refused: the same runs as without the policy,
    # but for the warnings that say so.
    never = attrs.evolve(opts, resize={**opts.resize, "max_requeue": 0})
    same = simulate(KTH200, never, parallel=False).to_json()
    assert plain.rigid.warnings == plain.elastic.warnings == ()
    for mode in ("rigid", "elastic"):
        (refused_doc,) = same["runs"][mode].pop("warnings")
        assert refused_doc["count"] == same["runs"][mode]["host_failures"]["jobs_killed"]
        assert plain.to_json()["runs"][mode].pop("warnings") == []
    plain_doc = plain.to_json()
    for run in plain_doc["runs"].values():
        del run["warnings"]
    assert (same["runs"], same["change"]) == (plain_doc["runs"], plain_doc["change"])


def test_a_requeued_malleable_job_starts_its_work_and_its_driver_over(tmp_path: Path) -> None:
    """A malleable job grown, then requeued by a failure that took its task 0: its next
    run does all its work again (at the size it runs at), and the driver, which
    forgot it while it waited, knows its new size once it runs again."""
    from xce_resize_plugin.controllers.sim.speedup import SpeedupModel
    from xce_resize_plugin.controllers.sim.work import SpeedupWork
    from xce_resize_plugin.core.models import (
        GrowRequest,
        JobState,
        LossOutcome,
        Principal,
        ReleaseRequest,
    )
    from xce_resize_plugin.simulation.drivers import MalleableSpec, NoDriver

    config = {"journal_sync": False, "policy_files": [str(REQUEUE_POLICY)]}
    ctl = EmbeddedController(
        get_plugin_manager(config, entry_points=False),
        tmp_path / "s",
        hosts=[("n1", 2), ("n2", 2)],
        config=config,
        store="none",
    )
    work = SpeedupWork(SpeedupModel("linear", reconfig_cost=0.0), 1000.0, 2)
    job = "7"
    driver = NoDriver({job: MalleableSpec("alice", 1, 4, 2, work)})
    ctl.add_observer(driver)
    ctl.submit(
        "alice",
        "1,4",
        resizable=True,
        runtime=1000.0,
        alloc={"n1": 1, "n2": 1},
        work=work,
        job_id=job,
    )
    ctl.settle()
    assert driver.sizes == {job: 2}
    ctl.request_resize(Principal("alice"), job, GrowRequest(2, 2, no_notify=True))
    ctl.settle()
    assert driver.sizes == {job: 4}
    ctl.advance(100.0)  # a fifth of its work at 4 tasks (T(4) = 500 s), credited
    ctl.request_resize(Principal("alice"), job, ReleaseRequest(count=1, no_notify=True))
    ctl.settle()  # at this change
    assert driver.sizes == {job: 3} and work.remaining == pytest.approx(0.8)
    assert ctl.host_down("n1").outcomes == {job: LossOutcome.REQUEUE}
    assert driver.sizes == {}  # waiting, not running
    ctl.host_up("n1")
    ctl.settle()
    view = ctl.job(job)
    assert view.state is JobState.RUN and driver.sizes == {job: len(view.tasks)}
    began = view.start_time
    assert began is not None
    ctl.run()
    ended = ctl.job(job)
    assert ended.state is JobState.DONE and ended.end_time is not None
    # All of its work again at its new size: T(n) = 1000 x 2 / n.
    assert ended.end_time - began == pytest.approx(2000.0 / len(view.tasks))
    assert ctl.check_invariants() == []
    ctl.stop()


def test_cli_counts_the_plugins_warnings_instead_of_printing_one_per_job(
    tmp_path: Path,
) -> None:
    """A controller logs a refused requeue per job; ``simulate`` shows each kind once
    under the table, with its count, and prints none of them on stderr."""
    config = tmp_path / "sim.toml"
    config.write_text(
        f'[resize]\npolicy_files = ["{REQUEUE_POLICY}"]\nmax_requeue = 1\n', encoding="utf-8"
    )
    argv = [sys.executable, "-m", "xce_resize_plugin.cli.main", "simulate", str(KTH200)]
    argv += ["--host-failures", "500", "--config", str(config), "--malleable-fraction", "0.5"]
    proc = subprocess.run([*argv, "-q"], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    doc = json.loads(
        subprocess.run(
            [*argv, "-q", "--json", "-"], capture_output=True, text=True, check=True
        ).stdout
    )
    lines = proc.stdout.splitlines()
    for mode in ("rigid", "elastic"):
        (kind,) = doc["runs"][mode]["warnings"]
        at = lines.index(
            f"plugin warnings in the {mode} run (how many, and the first of each kind):"
        )
        assert lines[at + 1] == f"  {kind['count']}  {kind['first']}"
        assert kind["first"].startswith("job ")


@pytest.mark.parametrize("driver", ["shrink-for-queue", "grow-shrink"])
def test_a_recording_with_requeues_and_shrinks_replays_identically(
    tmp_path: Path, driver: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A job requeued after a host failure runs again from task 0, so the same task id
    can be stopped by a shrink in two of its runs: each recorded stop answers its own
    (the replay used to keep only the last one per task id, and a requeued job shrunk
    again then never saw its tasks stop: a false "DIFFERENT")."""
    from xce_resize_plugin.cli.main import main
    from xce_resize_plugin.recording.format import read_recording
    from xce_resize_plugin.recording.replay import PolicyChoice, replay
    from xce_resize_plugin.simulation.simulate import load_workload, run_mode

    rec = tmp_path / "run.jsonl"
    opts = SimOptions(
        malleable_fraction=0.5,
        driver=driver,
        limit=400,
        host_failures=failures.HostFailures(50.0, 2.0),
        resize={"policy_files": [str(REQUEUE_POLICY)]},
    )
    run = run_mode(load_workload(CTC, opts), opts, "elastic", record=rec)
    assert run.problems == () and run.failures is not None and run.failures.jobs_requeued
    _, lines = read_recording(rec)
    stops = [
        (line["job"], line["task"])
        for line in lines
        if line["kind"] == "task" and line.get("phase") == "sync" and line["event"] == "exited"
    ]
    assert len(stops) > len(set(stops))  # a task id stopped in two runs of its job
    # The run loaded a policy file: the replay loads it only when told to.
    result = replay(rec, policies=PolicyChoice(trust_recorded=True))
    assert result.ok, result.problems
    assert result.starts == sum(1 for line in lines if line["kind"] == "started")
    # The command line says so, with the plugin's warnings counted, not one per job.
    assert main(["simulate", "--replay", str(rec), "-q", "--policy", str(REQUEUE_POLICY)]) == 0
    out = capsys.readouterr()
    assert out.out.splitlines()[0].endswith("identical") and out.err == ""
