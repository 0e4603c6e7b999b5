"""Grows and the queue (docs/admin-guide.md, "Reclaim"): scenario runs of
``[resize] reclaim``, and the rule that no grow takes the blocked head's slots."""

from __future__ import annotations

import logging
import re
import tomllib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from xce_resize_plugin import hookimpl
from xce_resize_plugin.controllers.sim import EmbeddedController
from xce_resize_plugin.core.facts import ReleaseAccepted
from xce_resize_plugin.core.models import ChangeKind, JobInfo, JobState
from xce_resize_plugin.core.reclaim import ReclaimCandidate, ReclaimHead
from xce_resize_plugin.errors import ConfigError
from xce_resize_plugin.host import Principal
from xce_resize_plugin.manager import get_plugin_manager
from xce_resize_plugin.scenarios import files, runner
from xce_resize_plugin.scenarios.files import Scenario
from xce_resize_plugin.testing.sim import SimControllers

ROOT = Path(__file__).resolve().parents[2]

# Job 101 (resizable 2..8) holds 6 of the 8 slots until t=1000; job 102 (rigid, 4
# tasks) arrives at t=10 and is the blocked head: it needs 2 more slots.
BASE = """
[cluster]
hosts = {{ a = 4, b = 4 }}

[users]
admins = ["root"]

[resize]
{resize}

[[jobs]]
id = "101"
user = "ann"
tasks = "2,8"
resizable = true
alloc = {{ a = 4, b = 2 }}
runtime = 1000
{notify}

[[jobs]]
id = "102"
user = "bob"
tasks = {head_tasks}
submit = 10
runtime = 100
{extra}
"""


def scenario(
    tmp_path: Path,
    resize: str = 'reclaim = "shrink"',
    *,
    head_tasks: int = 4,
    notify: str = "",
    extra: str = "",
) -> Scenario:
    text = BASE.format(resize=resize, head_tasks=head_tasks, notify=notify, extra=extra)
    return parse(tmp_path, text)


def parse(tmp_path: Path, text: str) -> Scenario:
    """A scenario from its text, as a file in ``tmp_path`` (policy paths are absolute)."""
    path = tmp_path / "scenario.toml"
    path.write_text(text)
    return files.parse(tomllib.loads(text), path)


def run(sc: Scenario, tmp_path: Path, name: str = "state") -> runner.ScenarioResult:
    result = runner.run(sc, tmp_path / name)
    assert result.problems == ()
    return result


def releases(result: runner.ScenarioResult) -> list[tuple[str, tuple[int, ...], str]]:
    return [
        (f.job_id, tuple(t.id for t in f.tasks), f.principal)
        for _, f in result.facts
        if isinstance(f, ReleaseAccepted)
    ]


def shrinks(result: runner.ScenarioResult, job: str) -> list[dict[str, Any]]:
    return [r for r in result.jobs[job]["resize_records"] if r["type"] == ChangeKind.SHRINK.value]


def test_reclaim_off_leaves_the_head_waiting(tmp_path: Path) -> None:
    result = run(scenario(tmp_path, resize=""), tmp_path)
    assert releases(result) == []
    assert result.jobs["102"]["start_time"] == 1000.0
    assert len(result.jobs["101"]["tasks"]) == 6


def test_reclaim_shrinks_the_newest_tasks_and_the_head_starts_now(tmp_path: Path) -> None:
    result = run(scenario(tmp_path), tmp_path)
    # Only what the head lacks (2 slots), the newest tasks, asked by the plugin itself.
    assert releases(result) == [("101", (4, 5), "reclaim")]
    assert result.jobs["102"]["start_time"] == 10.0
    assert result.jobs["101"]["hosts"] == {"a": 4}
    assert len(shrinks(result, "101")) == 1


def test_reclaim_takes_from_the_largest_excess_first(tmp_path: Path) -> None:
    # A second resizable job with less excess (3 tasks, min 2) is left alone.
    extra = """
[[jobs]]
id = "103"
user = "cat"
tasks = "2,4"
resizable = true
alloc = { b = 2 }
runtime = 1000
"""
    text = BASE.format(resize='reclaim = "shrink"', head_tasks=2, notify="", extra=extra)
    result = run(parse(tmp_path, text.replace("{ a = 4, b = 2 }", "{ a = 4, b = 1 }")), tmp_path)
    # 101: 5 tasks (excess 3), 103: 2 tasks (excess 0); 1 slot free, the head needs 2.
    assert releases(result) == [("101", (4,), "reclaim")]
    assert result.jobs["102"]["start_time"] == 10.0


def test_no_reclaim_when_shrinking_everyone_would_not_start_the_head(tmp_path: Path) -> None:
    # The head needs 8: 2 free + 4 above 101's minimum is 6, not enough.
    result = run(scenario(tmp_path, head_tasks=8), tmp_path)
    assert releases(result) == []
    assert len(result.jobs["101"]["tasks"]) == 6
    assert result.jobs["102"]["start_time"] == 1000.0


def test_reclaim_respects_the_head_ptile(tmp_path: Path) -> None:
    # With ptile 1 the head (2 tasks) needs two hosts with a slot: b has 2 free, so
    # only a slot freed on a counts, and one is enough.
    result = run(scenario(tmp_path, head_tasks=2, extra="ptile = 1"), tmp_path)
    assert result.jobs["102"]["start_time"] == 10.0
    (job, ids, _), *more = releases(result)
    assert job == "101" and len(ids) == 1 and not more
    assert result.jobs["101"]["hosts"] == {"a": 3, "b": 2}


def test_a_veto_leaves_the_job_alone_and_is_not_retried_for_the_same_head(
    tmp_path: Path,
) -> None:
    # 104 backfills at t=500 (instants at 500 and 510 while 102 is still blocked).
    extra = """
[[jobs]]
id = "104"
user = "dan"
tasks = 1
submit = 500
runtime = 10
"""
    result = run(scenario(tmp_path, notify='notify_cmd = "exit 1"', extra=extra), tmp_path)
    # Asked once at t=10; the notification refused; the head waits for its shadow time
    # without the job being asked again at later cycles or instants.
    assert releases(result) == [("101", (4, 5), "reclaim")]
    assert [(n["time"], n["status"]) for n in result.notifications] == [(10.0, 1)]
    assert shrinks(result, "101") == []
    assert result.jobs["104"]["start_time"] == 500.0
    assert result.jobs["102"]["start_time"] == 1000.0


VETO_TWO_HEADS = """
[cluster]
hosts = { a = 4, b = 4 }

[resize]
reclaim = "shrink"

[[jobs]]
id = "101"
user = "ann"
tasks = "2,8"
resizable = true
alloc = { a = 4, b = 2 }
runtime = 1000
notify_cmd = "exit 1"

[[jobs]]
id = "105"
user = "eve"
tasks = 2
alloc = { b = 2 }
runtime = 50

[[jobs]]
id = "102"
user = "bob"
tasks = 2
submit = 10
runtime = 100

[[jobs]]
id = "104"
user = "dan"
tasks = 2
submit = 20
runtime = 100
"""


def test_a_veto_is_retried_for_the_next_head(tmp_path: Path) -> None:
    result = run(parse(tmp_path, VETO_TWO_HEADS), tmp_path)
    # 102 is the head at t=10: 101 is asked and refuses. 102 starts when 105 ends
    # (t=50); 104 is then the head and 101 is asked once more, and refuses again.
    assert [(n["time"], n["status"]) for n in result.notifications] == [(10.0, 1), (50.0, 1)]
    assert releases(result) == [("101", (4, 5), "reclaim")] * 2
    assert result.jobs["102"]["start_time"] == 50.0
    assert result.jobs["104"]["start_time"] == 150.0


OWNERS = """
[cluster]
hosts = {{ a = 4, b = 4 }}

[resize]
reclaim = "shrink"
{policy}

[[jobs]]
id = "101"
user = "ann"
tasks = "2,8"
resizable = true
alloc = {{ a = 4 }}
runtime = 1000

[[jobs]]
id = "102"
user = "bob"
tasks = "1,4"
resizable = true
alloc = {{ b = 3 }}
runtime = 1000

[[jobs]]
id = "103"
user = "bob"
tasks = 2
submit = 10
runtime = 100
"""


@pytest.mark.parametrize(
    ("policy", "released"),
    [
        # Built in: both are 2 above their minimum; the tie goes by id.
        ("", [("101", (3,), "reclaim")]),
        # The example site policy: the head's owner (bob) gives first.
        (
            f'policy_files = ["{ROOT / "hooks" / "reclaim_owner_first.py"}"]',
            [("102", (2,), "reclaim")],
        ),
    ],
)
def test_hook_xce_resize_select_reclaim_a_site_policy_overrides_it(
    tmp_path: Path, policy: str, released: list[tuple[str, tuple[int, ...], str]]
) -> None:
    result = run(parse(tmp_path, OWNERS.format(policy=policy)), tmp_path)
    assert releases(result) == released
    assert result.jobs["103"]["start_time"] == 10.0


def test_a_bad_reclaim_value_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"reclaim must be one of 'off', 'shrink', got 'grow'"):
        scenario(tmp_path, resize='reclaim = "grow"')
    with pytest.raises(ConfigError, match=r"reclaim_min_delay must be at least 0"):
        scenario(tmp_path, resize="reclaim_min_delay = -1")


def test_reclaim_min_delay_skips_a_head_that_starts_soon_anyway(tmp_path: Path) -> None:
    result = run(scenario(tmp_path, resize='reclaim = "shrink"\nreclaim_min_delay = 991'), tmp_path)
    assert releases(result) == []  # its shadow time (t=1000) is 990 s away
    result = run(
        scenario(tmp_path, resize='reclaim = "shrink"\nreclaim_min_delay = 990'), tmp_path, "s2"
    )
    assert result.jobs["102"]["start_time"] == 10.0


# -- no grow takes the blocked head's slots, in every controller ----------------------

# 101 (resizable) runs past the head's shadow time; 103 ends at t=1000, which is when
# the head 102 (6 tasks) can start. A grow of 101 at t=20 into the 4 free slots would
# push the head back to 101's end (t=5000).
PROTECT = """
[cluster]
hosts = {{ a = 4, b = 4 }}

[scenario]
{protect}

[[jobs]]
id = "101"
user = "ann"
tasks = "1,6"
resizable = true
alloc = {{ a = 2 }}
runtime = 5000

[[jobs]]
id = "103"
user = "cat"
tasks = 2
alloc = {{ a = 2 }}
runtime = 1000

[[jobs]]
id = "102"
user = "bob"
tasks = 6
submit = 10
runtime = 100

[[commands]]
at = 20
user = "ann"
bresize = "request 1,4 101"
"""


@pytest.mark.parametrize(
    ("protect", "head_start"), [("", 1000.0), ("protect_reservation = false", 5000.0)]
)
def test_scenario_grows_leave_the_head_its_slots_by_default(
    tmp_path: Path, protect: str, head_start: float
) -> None:
    result = run(parse(tmp_path, PROTECT.format(protect=protect)), tmp_path)
    assert result.jobs["102"]["start_time"] == head_start
    grows = [r for r in result.jobs["101"]["resize_records"] if r["type"] == "grow"]
    if protect:
        assert grows[0]["time"] == 20.0  # the option off: the grow took the head's slots
    else:
        assert all(g["time"] >= 1000.0 for g in grows)


# The same cluster as a trace: 6 processors; job 1 (made malleable below) runs past the
# shadow time of job 3, which can start once job 2 ends at t=1000.
SWF = """; MaxProcs: 6
1 0 0 5000 2 -1 -1 2 5000 -1 1 1 1 -1 1 -1 -1 -1
2 0 0 1000 3 -1 -1 3 1000 -1 1 2 1 -1 1 -1 -1 -1
3 0 0 100 4 -1 -1 4 100 -1 1 3 1 -1 1 -1 -1 -1
"""


def test_simulated_grows_leave_the_head_its_slots(tmp_path: Path) -> None:
    import attrs

    from xce_resize_plugin.simulation.simulate import SimOptions, load_workload, run_mode

    trace = tmp_path / "t.swf"
    trace.write_text(SWF)
    # Grow whenever a slot is idle, even while a job waits: only the protection of the
    # reservation keeps job 1 out of the slot job 3 needs at t=1000.
    options = SimOptions(
        malleable_fraction=0.0,
        driver="grow-when-idle",
        grow_cooldown=0.0,
        grow_margin=0.0,
        grow_when_queue_empty=False,
    )
    workload = load_workload(trace, options)
    jobs = tuple(
        attrs.evolve(j, malleable=True, min_procs=1, max_procs=4) if j.id == "1" else j
        for j in workload.jobs
    )
    workload = attrs.evolve(workload, jobs=jobs)
    rigid = run_mode(workload, options, "rigid", job_rows=True)
    elastic = run_mode(workload, options, "elastic", job_rows=True)
    assert rigid.problems == () and elastic.problems == ()
    # Rows: (run, job_id, user, submit, start, ...).
    start = {(row[0], row[1]): row[4] for res in (rigid, elastic) for row in res.jobs}
    assert start["rigid", "3"] == start["elastic", "3"] == 1000.0
    # Job 1 did grow, once the head had started (into the slots job 3 left at 1100).
    assert elastic.metrics.resizes >= 1


# -- jobs with something in flight or pending -----------------------------------------


def _controller(tmp_path: Path, faults: Any = None) -> Any:
    from xce_resize_plugin.controllers.sim import EmbeddedController
    from xce_resize_plugin.manager import get_plugin_manager

    config = {"journal_sync": False, "reclaim": "shrink", "stop_grace": 30.0}
    return EmbeddedController(
        get_plugin_manager(config, entry_points=False),
        tmp_path,
        {"a": 4, "b": 4},
        config=config,
        store="memory",
        strict=True,
        protect_reservation=True,
        faults=faults,
    )


def test_a_release_in_flight_counts_for_the_head_and_nothing_more_is_asked(
    tmp_path: Path,
) -> None:
    from xce_resize_plugin.controllers.sim import TaskFaults
    from xce_resize_plugin.core.models import ReleaseRequest
    from xce_resize_plugin.host import Principal

    ctl = _controller(tmp_path, TaskFaults(stop_delay=5.0))  # tasks take 5 s to exit
    try:
        ctl.submit("ann", (2, 8), runtime=1000, resizable=True, alloc={"a": 4, "b": 1})
        ctl.submit("cat", (1, 4), runtime=1000, resizable=True, alloc={"b": 3})
        ctl.run(until=0.0)
        ctl.request_resize(Principal("ann"), "101", ReleaseRequest(count=2))
        ctl.submit("bob", 2, runtime=100)  # the head: its 2 slots are being freed
        ctl.run(until=1.0)
        # 102 (resizable, 2 above its minimum) was not asked: 101's stop will do.
        assert ctl.resize_status("102").phase.value == "IDLE"
        assert len(ctl.job("102").tasks) == 3
        assert ctl.job("103").state.value == "PEND"
        ctl.run(until=5.0)
        assert ctl.job("103").start_time == 5.0
        assert len(ctl.job("101").tasks) == 3 and len(ctl.job("102").tasks) == 3
    finally:
        ctl.stop()


def test_a_pending_grow_is_cancelled_by_the_reclaim(tmp_path: Path) -> None:
    from xce_resize_plugin.core.models import GrowRequest
    from xce_resize_plugin.host import Principal

    ctl = _controller(tmp_path)
    try:
        ctl.submit("ann", (2, 10), runtime=1000, resizable=True, alloc={"a": 4, "b": 4})
        ctl.run(until=0.0)
        ctl.request_resize(Principal("ann"), "101", GrowRequest(1, 2))  # no slot: pends
        ctl.run(until=1.0)
        assert ctl.resize_status("101").pending is not None
        ctl.submit("bob", 3, runtime=100)
        ctl.run(until=2.0)
        status = ctl.resize_status("101")
        # Its newest 3 tasks went to the head, and its grow was cancelled with them.
        assert ctl.job("102").start_time == 1.0  # submitted at 1: it started at once
        assert status.pending is None and len(status.tasks) == 5
        assert {t.id for t in status.tasks} == {0, 1, 2, 3, 4}
    finally:
        ctl.stop()


def test_a_recorded_reclaim_replays_to_the_same_facts(tmp_path: Path) -> None:
    from xce_resize_plugin.recording.replay import replay

    out = tmp_path / "run.jsonl"
    with open(out, "w", encoding="utf-8") as record:
        result = runner.run(
            scenario(tmp_path, notify='notify_cmd = "exit 0"'), tmp_path / "s", record
        )
    assert releases(result) == [("101", (4, 5), "reclaim")]
    # The reclaim is the plugin's own decision: replaying the inputs under the recorded
    # [resize] section decides it again.
    replayed = replay(out, tmp_path / "replay")
    assert replayed.ok, replayed.problems
    assert replayed.facts == len(result.facts)


# --- a site's xce_resize_select_reclaim that answers wrong (docs/admin-guide.md) ------------


class Reclaim:
    def __init__(self, answer: Callable[[], Any]) -> None:
        self.answer = answer

    @hookimpl
    def xce_resize_select_reclaim(
        self, head: ReclaimHead, candidates: Sequence[ReclaimCandidate]
    ) -> Any:
        return self.answer()


def blocked_head(tmp_path: Path, answer: Callable[[], Any]) -> EmbeddedController:
    """As BASE: job 101 holds 6 of the 8 slots, job 102 (4 tasks) is submitted and
    blocked; the scheduler cycle that would reclaim has not run yet."""
    config = {"reclaim": "shrink"}
    pm = get_plugin_manager(config, entry_points=False)
    pm.register(Reclaim(answer))
    ctl = SimControllers(tmp_path / "state")(pm=pm, config=config, hosts={"a": 4, "b": 4})
    ctl.submit("ann", "2,8", runtime=1000, resizable=True, alloc={"a": 4, "b": 2}, job_id="101")
    ctl.settle()
    ctl.submit("bob", "4", runtime=100, job_id="102")
    return ctl


def _raise_key() -> Any:
    raise KeyError("no such rack")


@pytest.mark.parametrize(
    ("answer", "why"),
    [
        (_raise_key, "raised KeyError: 'no such rack'"),
        (lambda: [4, 5], r"returned \[4, 5\], not a mapping job id -> task ids"),
        (lambda: {"101": 5}, "returned 5 for job 101, not a list of task ids"),
        (lambda: {"101": "45"}, "returned '45' for job 101, not a list of task ids"),
        (lambda: {"101": [True, 5]}, r"returned \[True, 5\] for job 101: task ids are integers"),
    ],
)
def test_a_select_reclaim_answer_that_is_no_selection_is_refused_naming_the_hook(
    tmp_path: Path, answer: Callable[[], Any], why: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Nothing is asked for the head, the log names the hook, and the cycle goes on (it
    failed: in the live controller every job's dispatch and events stalled with it)."""
    ctl = blocked_head(tmp_path, answer)
    with caplog.at_level(logging.ERROR, "xce_resize_plugin.runtime.reclaiming"):
        ctl.settle()
    assert re.search(
        "reclaim for job 102: nothing asked: .*xce_resize_select_reclaim " + why, caplog.text
    )
    assert [t.id for t in ctl.job("101").tasks] == [0, 1, 2, 3, 4, 5]  # nothing asked
    assert ctl.job("102").state is JobState.PEND
    # Asked once: the same decision is not made again at every cycle.
    caplog.clear()
    ctl.advance(1.0)
    assert "nothing asked" not in caplog.text


class UnknownToPasswd:
    """A site's xce_resize_authorize that looks every principal up in the password
    database, which has no user named reclaim (the plugin's own principal)."""

    @hookimpl
    def xce_resize_authorize(self, principal: Principal, job: JobInfo, action: str) -> bool:
        raise KeyError(f"getpwnam(): name not found: {principal.name!r}")


def test_an_authorize_hook_failing_for_the_reclaim_principal_skips_the_job(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The job is not asked and the cycle goes on. The KeyError failed every scheduler
    cycle, and with it every job's dispatch and events (an admin's release of another
    job stayed in flight)."""
    ctl = blocked_head(tmp_path, lambda: None)
    ctl.plugin_manager.register(UnknownToPasswd())
    with caplog.at_level(logging.ERROR, "xce_resize_plugin.runtime.reclaiming"):
        ctl.settle()
    assert "reclaim: job 101 not asked (a site hook failed)" in caplog.text
    assert "name not found: 'reclaim'" in caplog.text
    assert [t.id for t in ctl.job("101").tasks] == [0, 1, 2, 3, 4, 5]
    assert ctl.job("102").state is JobState.PEND
    ctl.advance(1000.0)  # 101 ends at its run time: the cycles went on, 102 starts
    assert ctl.job("102").state is JobState.RUN


def test_a_select_reclaim_answer_may_give_each_job_s_ids_lazily(tmp_path: Path) -> None:
    ctl = blocked_head(tmp_path, lambda: {"101": (i for i in (4, 5))})
    ctl.settle()
    assert [t.id for t in ctl.job("101").tasks] == [0, 1, 2, 3]
    assert ctl.job("102").state is JobState.RUN
    assert ctl.check_invariants() == []
