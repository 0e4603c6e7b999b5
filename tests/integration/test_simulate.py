"""``xce-resize simulate``: both runs on small traces, determinism, every correctness
check firing on a run built to break it, metrics on hand-made examples, and replay.

Real traces (../shared/traces) are used only by the benchmarks and by the test at the
end, which skips when they are absent.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import attrs
import pytest

from xce_resize_plugin.controllers.jobs import VersionRecord
from xce_resize_plugin.controllers.observer import FinishedJob
from xce_resize_plugin.controllers.scheduler import PassResult
from xce_resize_plugin.controllers.sim import scheduling as scheduling_mod
from xce_resize_plugin.controllers.sim import work as work_mod
from xce_resize_plugin.core.models import JobState, Task
from xce_resize_plugin.errors import ConfigError
from xce_resize_plugin.journal import Journal
from xce_resize_plugin.journal.verification import verify
from xce_resize_plugin.recording.format import read_recording
from xce_resize_plugin.recording.replay import replay
from xce_resize_plugin.simulation.checks import (
    CompletionCheck,
    EasyCheck,
    LedgerCheck,
    WorkCheck,
    check_utilization,
    work_done,
)
from xce_resize_plugin.simulation.comparison import simulate
from xce_resize_plugin.simulation.malleable import SpeedupModel
from xce_resize_plugin.simulation.metrics import (
    UsageTrack,
    bounded_slowdown,
    median,
    summarize,
)
from xce_resize_plugin.simulation.simulate import (
    MAX_HOSTS,
    SimOptions,
    cluster_for,
    load_options,
    load_workload,
    run_mode,
)

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data"
KTH200 = DATA / "KTH-SP2-1996-2.1-cln-first200.swf.gz"
ELASTISIM = DATA / "elastisim-sample" / "jobs.json"
SHARED = ROOT.parent / "shared" / "traces"


def options(**kw: Any) -> SimOptions:
    return SimOptions(**kw)


# -- both runs on small traces ------------------------------------------------------------


@pytest.mark.parametrize("trace", [KTH200, ELASTISIM], ids=["kth200", "elastisim"])
def test_both_runs_complete_and_pass_every_check(trace: Path) -> None:
    result = simulate(trace, options(malleable_fraction=0.5), parallel=False)
    for run in (result.rigid, result.elastic):
        assert run.problems == ()
        assert run.metrics.jobs == len(result.workload.jobs)
        assert 0 < run.metrics.utilization <= 1
    assert result.rigid.metrics.resizes == 0
    assert result.elastic.metrics.resizes > 0
    assert result.rigid.backfilled is not None and result.rigid.backfilled > 0
    doc = result.to_json()
    assert doc["runs"]["elastic"]["checks"] == {"ok": True, "problems": []}
    assert len(doc["runs"]["rigid"]["utilization_over_time"]) == 200


def test_the_table_says_where_the_malleable_jobs_come_from() -> None:
    """An SWF trace's malleable jobs are chosen by the fraction; an ElastiSim trace's
    kinds and ranges are its own, which the fraction does not touch."""
    from xce_resize_plugin.simulation.report import format_table

    swf = format_table(simulate(KTH200, options(malleable_fraction=0.5), parallel=False))
    assert "(50% chosen, seed 0, range 0.5x..2x)" in swf.splitlines()[1]
    elastisim = simulate(ELASTISIM, options(malleable_fraction=0.5), parallel=False)
    line = format_table(elastisim).splitlines()[1]
    assert line.startswith(f"Malleable: {elastisim.workload.malleable} jobs (kinds and ranges")
    assert "chosen" not in line


def test_json_is_byte_identical_across_runs_and_process_layouts() -> None:
    opts = options(malleable_fraction=0.5, seed=3)
    a = simulate(KTH200, opts, parallel=False).to_json()
    b = simulate(KTH200, opts, parallel=True).to_json()
    c = simulate(KTH200, opts, parallel=False).to_json()
    text = json.dumps(a, indent=2)
    assert text == json.dumps(b, indent=2) == json.dumps(c, indent=2)
    other = simulate(KTH200, options(malleable_fraction=0.5, seed=4), parallel=False).to_json()
    assert json.dumps(other) != json.dumps(a)  # the seed matters


def test_zero_fraction_makes_both_runs_of_an_swf_trace_equal() -> None:
    result = simulate(KTH200, options(malleable_fraction=0.0), parallel=False)
    assert result.rigid.metrics == result.elastic.metrics


def test_each_driver_runs_and_none_never_resizes() -> None:
    workload = load_workload(KTH200, options(malleable_fraction=1.0))
    counts = {}
    for name in ("none", "grow-when-idle", "shrink-for-queue", "grow-shrink"):
        opts = options(malleable_fraction=1.0, driver=name, grow_cooldown=0.0)
        run = run_mode(workload, opts, "elastic")
        assert run.problems == ()
        counts[name] = (run.metrics.grows, run.metrics.shrinks)
    assert counts["none"] == (0, 0)
    assert counts["grow-when-idle"][0] > 0 and counts["grow-when-idle"][1] == 0
    assert counts["shrink-for-queue"][0] == 0 and counts["shrink-for-queue"][1] > 0
    assert all(counts["grow-shrink"])


# -- every check can fail -----------------------------------------------------------------


def test_work_check_fires_on_a_broken_work_model(monkeypatch: pytest.MonkeyPatch) -> None:
    real = work_mod.SpeedupWork.resize

    def free_lunch(self: work_mod.SpeedupWork, now: float, size: int) -> float:
        real(self, now, size)
        return now + self.remaining * self.time_at(size)  # forgets the reconfiguration

    monkeypatch.setattr(work_mod.SpeedupWork, "resize", free_lunch)
    run = run_mode(
        load_workload(KTH200, options(malleable_fraction=1.0)),
        options(malleable_fraction=1.0, grow_cooldown=0.0),
        "elastic",
    )
    assert run.metrics.resizes > 0
    assert any("of its work" in p for p in run.problems), run.problems


def test_easy_check_fires_on_a_scheduler_that_ignores_fcfs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = scheduling_mod.easy_pass

    def last_first(now: float, pending: Any, *args: Any, **kw: Any) -> PassResult:
        # Pass the queue backwards: later jobs overtake the head whenever they fit.
        return real(now, list(pending)[::-1], *args, **kw)

    monkeypatch.setattr(scheduling_mod, "easy_pass", last_first)
    run = run_mode(load_workload(KTH200, options()), options(), "rigid")
    assert any("started before job" in p or "backfilled past" in p for p in run.problems)


def test_completion_check_fires_when_jobs_do_not_end_done() -> None:
    check = CompletionCheck()
    for j in ("1", "2", "3"):
        check.add_job(j)
    check.job_ended(_finished("1", JobState.DONE))
    check.job_ended(_finished("2", JobState.EXIT))
    problems = check.finish()
    assert any("job 2 ended EXIT" in p for p in problems)
    assert any("1 of 3 job(s) never ended: 3" in p for p in problems)


def test_ledger_check_fires_on_an_overbooked_host() -> None:
    check = LedgerCheck({"a": 1, "b": 1})
    check.job_started("1", 0.0, (Task(0, "a"),))
    check.job_started("2", 1.0, (Task(0, "a"),))  # the host has one slot
    check.allocation_committed("1", 2.0, (Task(0, "a"), Task(1, "b"), Task(2, "b")), 1)
    problems = check.finish()
    assert any("host a holds 2 tasks, only 1" in p for p in problems)
    assert any("host b holds 2 tasks" in p for p in problems)
    assert any("capacity 2" in p for p in problems)


def test_utilization_check_fires_above_one() -> None:
    assert check_utilization(0.5, 10, 10) == []
    assert check_utilization(1.2, 10, 10) and check_utilization(0.5, 11, 10)


def test_easy_check_accepts_legal_backfills_and_refuses_others() -> None:
    check = EasyCheck(capacity=4)
    check.add_job("long", 0.0, 3, 100.0)
    check.add_job("head", 1.0, 4, 10.0)
    check.add_job("short", 2.0, 1, 50.0)
    check.add_job("tall", 3.0, 1, 500.0)
    check.job_started("long", 0.0, tuple(Task(i, "h") for i in range(3)))
    check.job_started("short", 2.0, (Task(0, "h"),))  # ends at 52 <= shadow 100: legal
    assert check.finish() == [] and check.backfilled == 1
    check.job_ended(_finished("short", JobState.DONE, end=52.0))
    check.job_started("tall", 60.0, (Task(0, "h"),))  # ends at 560 and takes the head's slot
    assert any("backfilled past the shadow time 100" in p for p in check.finish())


def test_work_done_integrates_sizes_and_reconfiguration() -> None:
    model = SpeedupModel(kind="linear", reconfig_cost=10.0)
    # 100 s at 2 procs = 200 proc-seconds. 2 procs for 50 s (half), then 4 procs after
    # a 10 s reconfiguration: the other half takes 25 s -> ends at 85.
    assert work_done(model, 100.0, 2, [(0.0, 2), (50.0, 4)], 85.0) == pytest.approx(1.0)
    assert work_done(model, 100.0, 2, [(0.0, 2), (50.0, 4)], 75.0) == pytest.approx(0.8)
    check = WorkCheck(model)
    check.add_job("1", 100.0, 2, True)
    versions = (
        VersionRecord(0, 0.0, (Task(0, "a"), Task(1, "a"))),
        VersionRecord(1, 50.0, tuple(Task(i, "a") for i in range(4))),
    )
    check.job_ended(_finished("1", JobState.DONE, start=0.0, end=75.0, versions=versions))
    assert any("did 0.8" in p for p in check.finish())


def test_speedup_work_ends_where_the_integral_says() -> None:
    model = SpeedupModel(kind="amdahl", serial_fraction=0.1, reconfig_cost=5.0)
    w = work_mod.SpeedupWork(model, 1000.0, 8, estimate=2000.0)
    end = w.start(0.0, 8)
    assert end == pytest.approx(1000.0)
    end = w.resize(300.0, 16)
    end2 = w.resize(302.0, 4)  # during the reconfiguration: it starts over
    steps = [(0.0, 8), (300.0, 16), (302.0, 4)]
    assert work_done(model, 1000.0, 8, steps, end2) == pytest.approx(1.0, abs=1e-9)
    assert end2 > end
    assert w.expected_end() > end2  # the estimate is twice the run time
    assert w.gain(400.0, 8) > 0 and w.gain(400.0, 4) < 0


# -- metrics ------------------------------------------------------------------------------


def test_metrics_on_a_hand_made_example() -> None:
    assert bounded_slowdown(0.0, 5.0) == 1.0  # max(1, 5/10)
    assert bounded_slowdown(90.0, 5.0) == 9.5  # (90 + 5) / 10
    assert bounded_slowdown(100.0, 100.0) == 2.0
    assert median([3.0, 1.0, 2.0]) == 2.0 and median([4.0, 1.0, 2.0, 3.0]) == 2.5
    assert math.isnan(median([]))
    usage = UsageTrack(capacity=4)
    usage.step(0.0, 2)  # 2 slots for 10 s
    usage.step(10.0, 4)  # 4 slots for 10 s
    usage.step(20.0, 0)
    assert usage.utilization(20.0) == pytest.approx((20 + 40) / 80)
    assert usage.bins(2, 20.0) == pytest.approx([0.5, 1.0])
    m = summarize([0.0, 90.0, 100.0], [5.0, 5.0, 100.0], usage, 20.0, grows=2, shrinks=1)
    assert m.jobs == 3
    assert m.mean_wait == pytest.approx(190 / 3)
    assert m.median_wait == 90.0
    assert m.mean_turnaround == pytest.approx((5 + 95 + 200) / 3)
    assert m.mean_bounded_slowdown == pytest.approx((1 + 9.5 + 2) / 3)
    assert m.utilization == pytest.approx(0.75)
    assert (m.resizes, m.grows, m.shrinks) == (3, 2, 1)


def test_cluster_for_and_options() -> None:
    assert cluster_for(5, 2) == (("n001", 2), ("n002", 2), ("n003", 1))
    assert len(cluster_for(1000, 1)) == 1000 and cluster_for(1000, 1)[0][0] == "n0001"
    # An absurd machine (a trace's MaxProcs of 10**11) is refused before it is built,
    # saying what to change; at the limit it is built.
    with pytest.raises(ConfigError, match=r"make 1,048,577 hosts.*--slots-per-host"):
        cluster_for(MAX_HOSTS + 1, 1)
    assert len(cluster_for(2 * MAX_HOSTS, 2)) == MAX_HOSTS
    with pytest.raises(ConfigError, match="unknown driver"):
        SimOptions(driver="nope")
    with pytest.raises(ConfigError, match="fraction"):
        SimOptions(malleable_fraction=1.5)


def test_a_config_file_that_is_not_utf8_is_one_line_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from xce_resize_plugin.cli.main import main

    config = tmp_path / "latin1.toml"
    config.write_bytes(b"[simulate]\nmalleable_fraction = 0.2 # caf\xe9\n")
    assert main(["simulate", str(KTH200), "--config", str(config)]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1, captured.err
    assert f"{config}: not UTF-8 text" in captured.err


def test_config_file(tmp_path: Path) -> None:
    cfg = tmp_path / "sim.toml"
    cfg.write_text(
        '[simulate]\nmalleable_fraction = 0.5\nspeedup = "linear:cost=2"\ngrow_cooldown = 0\n'
        "[resize]\nstop_grace = 1.0\n"
    )
    opts = load_options(cfg, seed=9, malleable_fraction=None)
    assert (opts.malleable_fraction, opts.seed, opts.speedup.kind) == (0.5, 9, "linear")
    assert opts.speedup.reconfig_cost == 2.0 and opts.grow_cooldown == 0
    assert opts.resize_config() == {
        "journal_sync": False,
        "journal_defer": True,
        "journal_batch": 1024,
        "stop_grace": 1.0,
    }
    cfg.write_text("[simulate]\nmaleable_fraction = 0.5\n")
    with pytest.raises(ConfigError, match="unknown key 'maleable_fraction'"):
        load_options(cfg)
    cfg.write_text("[resize]\nstop_grac = 1\n")
    with pytest.raises(ConfigError, match="stop_grac"):
        load_options(cfg)


# -- recording and replay -----------------------------------------------------------------


def test_replay_of_a_recording_gives_the_same_facts(tmp_path: Path) -> None:
    rec = tmp_path / "run.jsonl"
    opts = options(malleable_fraction=0.5, grow_cooldown=0.0)
    run = run_mode(load_workload(KTH200, opts), opts, "elastic", record=rec)
    assert run.metrics.resizes > 0
    header, lines = read_recording(rec)
    assert header["controller"] == "simulated"
    kinds = {line["kind"] for line in lines}
    assert {"submit", "request", "task", "end", "started", "fact"} <= kinds
    facts = [line["fact"]["type"] for line in lines if line["kind"] == "fact"]
    assert {"GrowPlaced", "ReleaseAccepted", "Committed"} <= set(facts)
    result = replay(rec)
    assert result.ok, result.problems
    assert result.facts == len(facts) and result.starts == 200


def test_replay_detects_a_changed_input(tmp_path: Path) -> None:
    rec = tmp_path / "run.jsonl"
    opts = options(malleable_fraction=0.5, grow_cooldown=0.0)
    run_mode(load_workload(KTH200, opts), opts, "elastic", record=rec)
    lines = rec.read_text().splitlines()
    for i, line in enumerate(lines):
        data = json.loads(line)
        if data["kind"] == "request" and data["request"]["type"] == "grow":
            data["request"]["max_add"] = 1  # the job would have asked for less
            lines[i] = json.dumps(data)
            break
    else:
        pytest.fail("no grow request recorded")
    (tmp_path / "changed.jsonl").write_text("\n".join(lines) + "\n")
    result = replay(tmp_path / "changed.jsonl")
    assert not result.ok
    assert any("differs" in p or "recorded" in p for p in result.problems)


# -- the command line ---------------------------------------------------------------------


def cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "xce_resize_plugin", "simulate", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=120,
    )


def test_cli_table_json_record_and_replay(tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    rec = tmp_path / "rec.jsonl"
    proc = cli(str(KTH200), "--malleable-fraction", "0.5", "--json", str(out), "--record", str(rec))
    assert proc.returncode == 0, proc.stderr
    assert "mean bounded slowdown" in proc.stdout and "checks: passed" in proc.stdout
    doc = json.loads(out.read_text())
    assert doc["options"]["malleable_fraction"] == 0.5
    assert "events/s" in proc.stderr
    proc = cli("--replay", str(rec))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "identical" in proc.stdout
    proc = cli(str(KTH200), "--driver", "nope")
    assert proc.returncode == 2 and "unknown driver" in proc.stderr
    proc = cli()
    assert proc.returncode == 2 and "TRACE" in proc.stderr


@pytest.mark.parametrize(
    ("option", "name"),
    [
        ("--json", "out.json"),
        ("--record", "rec.jsonl"),
        ("--plot", "p.png"),
        ("--jobs-out", "j.csv"),
    ],
)
def test_an_output_that_cannot_be_written_is_refused_before_the_runs(
    tmp_path: Path, option: str, name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from xce_resize_plugin.cli.main import main

    (tmp_path / "taken.csv").mkdir()
    for target in (tmp_path / "none" / name, tmp_path / "taken.csv"):
        assert main(["simulate", str(KTH200), "--limit", "20", option, str(target)]) == 2
        captured = capsys.readouterr()
        assert captured.out == "" and captured.err.count("\n") == 1, captured.err
        assert f"{option} {target}: " in captured.err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["taken.csv"]


def test_cli_plot_says_how_to_install_matplotlib(tmp_path: Path) -> None:
    blocker = tmp_path / "sitecustomize.py"
    blocker.write_text(
        "import sys\nclass _Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'matplotlib' or name.startswith('matplotlib.'):\n"
        "            raise ImportError('blocked for the test')\n"
        "sys.meta_path.insert(0, _Block())\n"
    )
    import os

    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "xce_resize_plugin",
            "simulate",
            str(KTH200),
            "--plot",
            str(tmp_path / "x.png"),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "pip install matplotlib" in proc.stderr


def test_cli_plot_writes_a_png(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    png = tmp_path / "x.png"
    proc = cli(str(ELASTISIM), "--plot", str(png), "--no-progress")
    assert proc.returncode == 0, proc.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# -- a real trace, when it is there -------------------------------------------------------


@pytest.mark.slow
@pytest.mark.skipif(not (SHARED / "KTH-SP2-1996-2.1-cln.swf.gz").exists(), reason="no traces")
def test_kth_first_5000_jobs_pass_every_check() -> None:
    opts = options(malleable_fraction=0.2, limit=5000)
    result = simulate(SHARED / "KTH-SP2-1996-2.1-cln.swf.gz", opts)
    assert result.problems == []
    assert result.elastic.metrics.resizes > 0


def _finished(
    job_id: str,
    state: JobState,
    *,
    start: float = 0.0,
    end: float = 10.0,
    versions: tuple[VersionRecord, ...] = (),
) -> FinishedJob:
    return FinishedJob(job_id, "u", state, 1, 1, 0.0, start, end, versions, "")


# -- drivers, step by step ----------------------------------------------------------------


def test_drivers_grow_into_idle_slots_and_shrink_for_the_head(tmp_path: Path) -> None:
    from xce_resize_plugin.controllers.sim import EmbeddedController, ScriptedNotificationRunner
    from xce_resize_plugin.controllers.sim.work import SpeedupWork
    from xce_resize_plugin.manager import get_plugin_manager
    from xce_resize_plugin.simulation.drivers import GrowShrink, MalleableSpec

    model = SpeedupModel(kind="linear", reconfig_cost=0.0)
    work = SpeedupWork(model, 1000.0, 2)
    driver = GrowShrink({"m": MalleableSpec("ann", 1, 4, 2, work)})
    # The driver's shrinking is the plugin's reclaim policy, switched on in [resize].
    config = {"journal_sync": False, **driver.resize_settings()}
    assert config["reclaim"] == "shrink"
    ctl = EmbeddedController(
        get_plugin_manager(config, entry_points=False),
        tmp_path,
        hosts=[("a", 1), ("b", 1), ("c", 1), ("d", 1)],
        config=config,
        store="none",
        notification_runner=ScriptedNotificationRunner(),
        protect_reservation=True,
        lean_cycles=True,
    )
    ctl.add_observer(driver)
    ctl.submit("ann", (1, 4), runtime=1000.0, job_id="m", resizable=True, start_tasks=2, work=work)
    ctl.at(100.0, lambda: ctl.submit("bob", 3, runtime=50.0, job_id="r"))
    ctl.run(until=0.0)
    assert len(ctl.job("m").tasks) == 4  # started at 2 and filled to 4: nobody waited
    ctl.run(until=100.0)
    # The rigid job needs 3 of the 4 slots: the plugin shrank "m" to its min (its
    # newest tasks), "r" started; the driver itself asked for nothing.
    assert len(ctl.job("m").tasks) == 1
    assert ctl.job("r").start_time == 100.0
    assert driver.requests == 0 and driver.refused == {}
    ctl.run(until=150.0)  # "r" ended at 150 and this driver has no cooldown: "m" grows
    assert len(ctl.job("m").tasks) == 4
    assert ctl.job("m").versions[-1].time == 150.0
    ctl.run()
    assert ctl.check_invariants() == []
    ctl.stop()


def test_recording_errors_name_the_line(tmp_path: Path) -> None:
    from xce_resize_plugin.recording.format import RecordingError

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"kind": "submit"}\n')
    with pytest.raises(RecordingError, match="no header"):
        read_recording(bad)
    bad.write_text(
        '{"kind": "header", "format": "xce-resize-recording", "version": 1, "hosts": []}\n'
        '{"kind": "teleport", "t": 0}\n'
    )
    with pytest.raises(RecordingError, match=r"bad.jsonl:2: unknown kind 'teleport'"):
        read_recording(bad)
    bad.write_text('{"kind": "header", "format": "xce-resize-recording", "version": 9}\n')
    with pytest.raises(RecordingError, match="version 9"):
        read_recording(bad)


# -- the journal a simulation writes -------------------------------------------------------


def _job_facts(state_dir: Path) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    with Journal.open(state_dir / "resize", readonly=True) as journal:
        for _, job, payload in journal.facts():
            out.setdefault(job, []).append(payload.decode())
    return out


def test_a_simulations_batched_journal_is_intact_and_has_every_jobs_facts(
    tmp_path: Path,
) -> None:
    """journal_batch (a simulation's default) writes one entry per job per batch: the
    journal verifies clean, and each job has the facts of a run that writes every
    transition as it goes, in the same order."""
    opts = options(malleable_fraction=0.5, grow_cooldown=0.0)
    workload = load_workload(KTH200, opts)
    batched, plain = tmp_path / "batched", tmp_path / "plain"
    # Small batches, so that many are written during the run (1,024 by default).
    run_mode(
        workload, attrs.evolve(opts, resize={"journal_batch": 7}), "elastic", state_dir=batched
    )
    unbatched = attrs.evolve(opts, resize={"journal_defer": False})
    run_mode(workload, unbatched, "elastic", state_dir=plain)
    for state_dir in (batched, plain):
        report = verify(state_dir / "resize")
        assert report.ok, report.problems
    facts = _job_facts(batched)
    assert facts == _job_facts(plain)
    assert sum(len(f) for f in facts.values()) > 50
