"""One test per hook (docs test: every hook has a test), through the embedded controller
with the real plugin and a real LMDB journal."""

from __future__ import annotations

import gc
import itertools
import json
import logging
import re
import sys
import tempfile
import weakref
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pluggy
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from xce_resize_plugin import errors, hookimpl, plugin
from xce_resize_plugin.controllers.sim import EmbeddedController, SubmissionRejected
from xce_resize_plugin.core.models import (
    CancelRequest,
    GrowRequest,
    JobInfo,
    JobState,
    LossOutcome,
    Phase,
    ReleaseRequest,
    ResizeRecord,
    Task,
)
from xce_resize_plugin.host import Principal, TaskEvent
from xce_resize_plugin.journal import Entry, Journal
from xce_resize_plugin.manager import get_plugin_manager

from .harness import Harness

HOOKS = Path(__file__).resolve().parents[2] / "hooks"


def started(tmp_path: Path, **kw: object) -> Harness:
    h = Harness(tmp_path, **kw)  # type: ignore[arg-type]
    h.ctl.submit("alice", "1,8", runtime=1000, resizable=True, alloc={"hA": 2}, job_id="1")
    h.ctl.settle()
    return h


# --- lifecycle ---------------------------------------------------------------------


def test_hook_xce_controller_start(tmp_path: Path) -> None:
    h = started(tmp_path)
    h.request("alice", "1", GrowRequest(1, 1))
    with Journal.open(tmp_path / "resize", readonly=True) as j:
        first_epoch = j.stats()["epoch"]
    h.crash_and_restart()
    with Journal.open(tmp_path / "resize", readonly=True) as j:
        assert j.stats()["epoch"] == first_epoch + 1
    assert h.ctl.job("1").state is JobState.RUN
    assert len(h.ctl.job("1").tasks) == 3  # the grow survived the crash


def test_hook_xce_controller_start_refuses_a_corrupt_journal(tmp_path: Path) -> None:
    h = started(tmp_path)
    h.request("alice", "1", GrowRequest(1, 1))
    h.ctl.stop()
    data = tmp_path / "resize" / "data.mdb"
    data.write_bytes(b"\0garbage" * 64)
    with pytest.raises(errors.JournalError, match=str(data)):
        EmbeddedController(get_plugin_manager({}, entry_points=False), tmp_path, durable=False)


def test_hook_xce_controller_stop(tmp_path: Path) -> None:
    h = started(tmp_path)
    h.ctl.stop()
    with pytest.raises(plugin.NotStartedError):
        plugin.runtime_of(h.ctl)


def test_a_crashed_controller_is_freed_with_its_runtime(tmp_path: Path) -> None:
    """A controller dropped without xce_controller_stop (a crash: close() only) must not
    stay alive through the plugin's runtime: a process that hosts many controllers one
    after another (tests, benchmarks, what-if runs) would keep every one of them."""
    h = started(tmp_path)
    h.request("alice", "1", GrowRequest(1, 1))
    h.ctl.close()
    runtime = weakref.ref(plugin.runtime_of(h.ctl))
    controller = weakref.ref(h.ctl)
    del h
    gc.collect()
    assert controller() is None
    assert runtime() is None


# --- submission, requests -------------------------------------------------------------


def test_hook_xce_job_validate(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    with pytest.raises(errors.NotifyCmdTooLong):
        h.ctl.submit("alice", 2, notify_cmd="x" * 4096)
    with pytest.raises((errors.ResizeError, SubmissionRejected)):
        h.ctl.submit("alice", 2, ptile=0)
    assert h.ctl.jobs() == []


def test_xce_job_validate_parses_no_config_per_submission(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A trace simulation validates every job: the started runtime's settings are used,
    # the [resize] table is not parsed again on each submission.
    h = Harness(tmp_path)
    parsed: list[object] = []
    real = plugin.config.settings
    monkeypatch.setattr(plugin.config, "settings", lambda s: parsed.append(s) or real(s))
    for i in range(3):
        h.ctl.submit("alice", 1, runtime=10, job_id=f"v{i}")
    assert parsed == []
    assert [j.id for j in h.ctl.jobs()] == ["v0", "v1", "v2"]


def test_hook_xce_resize_request(tmp_path: Path) -> None:
    h = started(tmp_path, hosts=[("hA", 2)])
    status = h.request("alice", "1", GrowRequest(1, 2))
    assert status.phase is Phase.GROW_PENDING
    before = h.snapshot()
    for req, exc in [
        (GrowRequest(1, 1), errors.PendingRequest),
        (CancelRequest(), None),
    ]:
        if exc is None:
            h.request("alice", "1", req)
        else:
            with pytest.raises(exc):
                h.request("alice", "1", req)
            assert h.snapshot() == before  # a rejection changes nothing
    with pytest.raises(errors.NoJob):
        h.request("alice", "99", GrowRequest(1, 1))


def test_hook_xce_resize_status(tmp_path: Path) -> None:
    h = started(tmp_path, hosts=[("hA", 2)])
    status = h.ctl.resize_status("1")
    assert status is not None and status.phase is Phase.IDLE and len(status.tasks) == 2
    h.request("alice", "1", GrowRequest(1, 3))
    status = h.ctl.resize_status("1")
    assert status is not None and status.pending is not None and status.pending.max_add == 3
    assert h.ctl.resize_status("nope") is None


# --- scheduler, dispatch, events --------------------------------------------------------


def test_hook_xce_sched_cycle(tmp_path: Path) -> None:
    h = started(tmp_path, hosts=[("hA", 2), ("hB", 4)], user_slots={"alice": 5})
    h.ctl.submit("bob", 4, runtime=50, alloc={"hB": 4}, job_id="2")
    h.ctl.settle()
    h.request("alice", "1", GrowRequest(2, 4))
    assert h.ctl.job("1").tasks == h.ctl.job("1").held and len(h.ctl.job("1").tasks) == 2
    h.ctl.run(until=50)
    # placed when bob's job ended; capped by alice's limit of 5 slots
    job = h.ctl.job("1")
    assert [t.host for t in job.tasks] == ["hA", "hA", "hB", "hB", "hB"]
    assert h.ctl.users_view()["alice"]["slots_in_use"] == 5


def test_hook_xce_dispatch_cycle(tmp_path: Path) -> None:
    h = started(tmp_path)
    h.ctl.submit("bob", 1, runtime=10, alloc={"hD": 1}, job_id="2")
    notify = "echo $LSB_RESIZE_EVENT $LSB_RESIZE_HOSTS / $XCE_RESIZE_TASK_IDS"
    h.request("alice", "1", GrowRequest(2, 2, notify_cmd=notify))
    notes = h.ctl.notifications("1")
    assert len(notes) == 1 and notes[0].status == 0
    assert notes[0].stdout.strip() == "grow hA 2 / 2,3"  # the job's own host first
    assert len(h.ctl.job("1").tasks) == 4


def test_hook_xce_task_event(tmp_path: Path) -> None:
    # A host that reports task events one at a time.
    h = started(tmp_path, task_event_batches=False)
    h.ctl.faults.fail_starts.add(("1", 2))
    h.request("alice", "1", GrowRequest(1, 2, no_notify=True))
    job = h.ctl.job("1")
    assert [t.id for t in job.tasks] == [0, 1, 3]  # task 2 failed to start, slot freed
    assert job.held == job.tasks


def _count_commits(h: Harness) -> list[int]:
    """Spy on the plugin's journal: the number of entries of each transaction."""
    journal = plugin.runtime_of(h.ctl).journal
    sizes: list[int] = []
    commit = journal.commit

    def counting(entries: Sequence[Entry]) -> list[int]:
        sizes.append(len(entries))
        return commit(entries)

    journal.commit = counting  # type: ignore[method-assign]
    return sizes


@pytest.mark.parametrize("batches", [True, False])
def test_hook_xce_task_events(tmp_path: Path, batches: bool) -> None:
    h = started(tmp_path, task_event_batches=batches)
    h.ctl.faults.fail_starts.add(("1", 3))
    commits = _count_commits(h)
    h.request("alice", "1", GrowRequest(1, 4, no_notify=True))
    job = h.ctl.job("1")
    assert [t.id for t in job.tasks] == [0, 1, 2, 4, 5]  # task 3 failed to start
    assert job.held == job.tasks
    # request, placement, launch, then the four task events: in one transaction when
    # the host reports them together, one per event otherwise.
    assert len(commits) == (4 if batches else 7)
    with Journal.open(tmp_path / "resize", readonly=True) as j:
        kinds = [json.loads(payload)["type"] for _, _, payload in j.facts()]
    # Reported together, the two starts after the failure are one fact.
    together = ["TaskStarted", "TaskStartFailed", "TasksStarted", "Committed"]
    apart = ["TaskStarted", "TaskStartFailed", "TaskStarted", "TaskStarted", "Committed"]
    want = together if batches else apart
    assert kinds[-len(want) :] == want


def test_hook_xce_task_events_ignores_what_is_not_in_flight(tmp_path: Path) -> None:
    h = started(tmp_path)
    h.request("alice", "1", GrowRequest(1, 1, no_notify=True))
    seq, before = h.journal_seq(), plugin.runtime_of(h.ctl).states.get("1")
    events = [
        TaskEvent("1", 2, "exited", 0),  # committed already: no change in flight
        TaskEvent("1", 7, "started"),  # a task the job never had
        TaskEvent("404", 0, "exited"),  # a job the host does not have
    ]
    h.ctl.plugin_manager.hook.xce_task_events(controller=h.ctl, events=events)
    h.ctl.plugin_manager.hook.xce_task_events(controller=h.ctl, events=[])
    # The committed task's exit is only a job event (tasks_exited): one fact, which
    # changes nothing in the job's state.
    assert h.journal_seq() == seq + 1
    with Journal.open(tmp_path / "resize", readonly=True) as j:
        last = json.loads(list(j.facts())[-1][2])
    assert last["type"] == "TaskExited" and last["task_id"] == 2
    assert plugin.runtime_of(h.ctl).states.get("1") == before


def test_hook_xce_notify_done(tmp_path: Path) -> None:
    h = started(tmp_path, config={"notify_max_failures": 2})
    h.request("alice", "1", GrowRequest(1, 1, notify_cmd="exit 1"))
    status = h.ctl.resize_status("1")
    # failed twice in the same instant (the grow is re-placed at once) and given up
    assert status is not None and status.phase is Phase.IDLE and status.pending is None
    assert len(h.ctl.notifications("1")) == 2
    assert h.ctl.job("1").held == h.ctl.job("1").tasks


def test_hook_xce_notify_done_timeout(tmp_path: Path) -> None:
    h = started(tmp_path, config={"notify_timeout": 0.2, "notify_max_failures": 1})
    h.request("alice", "1", ReleaseRequest(count=1, notify_cmd="sleep 5"))
    note = h.ctl.notifications("1")[0]
    assert note.status is None and "timeout" in note.reason
    assert len(h.ctl.job("1").tasks) == 2  # a failed shrink leaves the allocation


def test_hook_xce_job_end(tmp_path: Path) -> None:
    h = started(tmp_path, hosts=[("hA", 2), ("hB", 2)])
    h.ctl.faults.stop_delay = 0
    h.ctl.submit("bob", 2, runtime=100, alloc={"hB": 2}, job_id="2")
    h.request("alice", "1", GrowRequest(1, 1))
    h.ctl.kill("1")
    h.ctl.settle()
    assert h.ctl.resize_status("1") is not None
    assert h.ctl.users_view().get("alice", {"slots_in_use": 0})["slots_in_use"] == 0
    h.ctl.run(until=150)
    assert h.ctl.hosts_view()["hB"]["used"] == 0  # the cancelled grow never took bob's slots
    assert h.ctl.check_invariants() == []


# --- accounting --------------------------------------------------------------------------


def test_hook_xce_acct_usage(tmp_path: Path) -> None:
    h = started(tmp_path, hosts=[("hA", 2), ("hB", 4)])
    h.ctl.run(until=100)
    h.request("alice", "1", GrowRequest(2, 2, no_notify=True))
    h.ctl.run(until=300)
    h.request("alice", "1", ReleaseRequest(spec="hB", no_notify=True))
    h.ctl.run(until=500)
    usage = h.ctl.acct_usage("1")
    assert usage.slot_seconds == 2 * 100 + 4 * 200 + 2 * 200
    assert [r.kind.value for r in usage.records] == ["grow", "shrink"]
    h.ctl.submit("bob", 1, runtime=10, job_id="2")
    h.ctl.run(until=600)
    assert h.ctl.acct_usage("2").slot_seconds == 10  # a job that never resized


# --- policy hooks -------------------------------------------------------------------------


def test_hook_xce_resize_select_release(tmp_path: Path) -> None:
    config = {"policy_files": [str(HOOKS / "free_whole_hosts.py")]}
    h = Harness(tmp_path, config=config)
    h.ctl.submit("alice", "1,8", runtime=99, resizable=True, alloc={"hA": 2, "hB": 1, "hC": 2})
    h.ctl.settle()
    job_id = h.ctl.jobs()[0].id
    h.request("alice", job_id, ReleaseRequest(count=1, no_notify=True))
    # the default takes the newest task (4, on hC); the site policy empties hB instead
    assert [t.id for t in h.ctl.job(job_id).tasks] == [0, 1, 3, 4]


def test_hook_xce_resize_order_grow_hosts(tmp_path: Path) -> None:
    h = started(
        tmp_path,
        hosts=[("hA", 2), ("hB", 4), ("hC", 1)],
        config={"policy_files": [str(HOOKS / "pack_grow_hosts.py")]},
    )
    h.request("alice", "1", GrowRequest(1, 1, no_notify=True))
    assert h.ctl.job("1").tasks[-1].host == "hC"  # best fit, not the emptiest hB


def test_hook_xce_resize_authorize(tmp_path: Path) -> None:
    h = started(tmp_path)
    before = h.snapshot()
    with pytest.raises(errors.PermissionDenied):
        h.request("mallory", "1", GrowRequest(1, 1))
    assert h.snapshot() == before
    h.request("root", "1", GrowRequest(1, 1), admin=True)
    assert h.ctl.job("1").tasks[-1].id == 2


def test_hook_xce_resize_validate(tmp_path: Path) -> None:
    h = started(tmp_path, config={"policy_files": [str(HOOKS / "power_of_two.py")]})
    before = h.snapshot()
    with pytest.raises(errors.PolicyRejected, match="powers of two"):
        h.request("alice", "1", GrowRequest(1, 1))
    assert h.snapshot() == before
    h.request("alice", "1", GrowRequest(2, 2, no_notify=True))
    assert len(h.ctl.job("1").tasks) == 4


def test_hook_xce_resize_committed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = tmp_path / "log.csv"
    monkeypatch.setenv("XCE_RESIZE_LOG", str(log))
    h = started(tmp_path / "state", config={"policy_files": [str(HOOKS / "resize_log.py")]})
    h.request("alice", "1", GrowRequest(2, 2, no_notify=True))
    h.request("alice", "1", ReleaseRequest(count=1, no_notify=True))
    lines = log.read_text().splitlines()
    assert lines[0].startswith("time,job,user,type") and len(lines) == 3
    assert lines[1].split(",")[3] == "grow" and lines[2].split(",")[3] == "shrink"


# --- a site hook's mistakes (docs/admin-guide.md, "When a policy hook fails") -------------


def with_policies(*policies: object) -> pluggy.PluginManager:
    """The plugin and the built-in policies, then ``policies`` (asked first)."""
    pm = get_plugin_manager({}, entry_points=False)
    for policy in policies:
        pm.register(policy)
    return pm


class Answer:
    """A site policy answering each hook it is built for with ``answer(...)``."""

    def __init__(self, answer: Callable[..., Any]) -> None:
        self.answer = answer

    @hookimpl
    def xce_resize_select_release(
        self, job: JobInfo, candidates: Sequence[Task], count: int
    ) -> Any:
        return self.answer(candidates, count)


def _raise_key(*_: object) -> Any:
    raise KeyError("no such rack")


def _fails_midway() -> Iterator[str]:
    yield "zz"
    raise KeyError("no such rack")


@pytest.mark.parametrize(
    ("answer", "why"),
    [
        (lambda c, n: 3, "returned 3, not a list of task ids"),
        (lambda c, n: "3", "returned '3', not a list of task ids"),
        (lambda c, n: [True], r"returned \[True\]: task ids are integers"),
        (lambda c, n: [3.0], r"returned \[3.0\]: task ids are integers"),
        (_raise_key, "raised KeyError: 'no such rack'"),
        # sys.exit() ended the thread that asked (the live controller's loop, silently).
        (lambda c, n: sys.exit(3), "raised SystemExit: 3"),
        # An endless answer took all the memory of the machine (24 GB, then OOM).
        (lambda c, n: itertools.count(1), "returned more than 3 task ids, more than it could"),
    ],
)
def test_a_select_release_answer_that_is_no_task_ids_is_refused_naming_the_hook(
    tmp_path: Path, answer: Callable[..., Any], why: str
) -> None:
    h = Harness(tmp_path, pm=with_policies(Answer(answer)))
    h.ctl.submit("alice", "1,8", runtime=1000, resizable=True, alloc={"hA": 2, "hB": 2}, job_id="1")
    h.ctl.settle()
    before = h.snapshot()
    with pytest.raises(errors.PolicyRejected, match="xce_resize_select_release " + why):
        h.request("alice", "1", ReleaseRequest(count=1, no_notify=True))
    assert h.snapshot() == before


_ids = st.one_of(st.integers(-1, 6), st.booleans(), st.floats(0, 6), st.text(max_size=2))
_answers = st.one_of(
    st.none(),
    st.integers(-1, 6),
    st.text(max_size=3),
    st.lists(_ids, max_size=6),
    st.lists(_ids, max_size=6).map(lambda ids: (i for i in ids)),
    st.frozensets(st.integers(0, 6), max_size=5),
)


@given(answer=_answers, count=st.integers(1, 4))
@settings(max_examples=60, deadline=None)
def test_any_select_release_answer_is_refused_or_releases_count_of_the_candidates(
    answer: Any, count: int
) -> None:
    """Whatever the site answers: refused (naming the hook, nothing changed), or a
    release of ``count`` distinct candidates it named as ints, task 0 kept."""
    named = list(answer) if isinstance(answer, Iterator) else answer
    with tempfile.TemporaryDirectory() as d:
        h = Harness(Path(d), pm=with_policies(Answer(lambda c, n: answer)))
        try:
            h.ctl.submit("alice", "1,8", runtime=99, resizable=True, alloc={"hA": 2, "hB": 3})
            h.ctl.settle()
            job_id = h.ctl.jobs()[0].id
            before = h.snapshot()
            try:
                h.request("alice", job_id, ReleaseRequest(count=count, no_notify=True))
            except errors.PolicyRejected as exc:
                assert "xce_resize_select_release" in exc.text
                assert h.snapshot() == before
                return
            kept = {t.id for t in h.ctl.job(job_id).tasks}
            released = {0, 1, 2, 3, 4} - kept
            assert 0 in kept and len(released) == count and len(kept) == 5 - count
            if named is not None:
                assert all(type(i) is int for i in named) and set(named) == released
            assert h.ctl.check_invariants() == []
        finally:
            h.ctl.close()


class OrderForJob1:
    """An order hook broken for job 1 only."""

    def __init__(self, answer: Callable[[], Any]) -> None:
        self.answer = answer

    @hookimpl
    def xce_resize_order_grow_hosts(self, job: JobInfo, hosts: object) -> Any:
        return self.answer() if job.id == "1" else None


@pytest.mark.parametrize(
    ("answer", "why"),
    [
        (_raise_key, "raised KeyError: 'no such rack'"),
        (_fails_midway, "raised KeyError: 'no such rack'"),
        (lambda: 5, "returned 5 for job 1, not a list of host names"),
        (lambda: "hC", "returned 'hC' for job 1, not a list of host names"),
        (lambda: [7, "hC"], "gave 7 for job 1, not a host name"),
        (lambda: [["hC"]], r"gave \['hC'\] for job 1, not a host name"),
        # sys.exit() ended the thread that asked: the live controller's loop, silently.
        (lambda: sys.exit("rack database unavailable"), "raised SystemExit: rack database"),
        # Endless, of names no host has: it held the scheduler for ever.
        (
            lambda: itertools.cycle(["nowhere", "elsewhere"]),
            r"gave more than \d+ names for job 1 \(4 per host of the cycle\)",
        ),
    ],
)
def test_a_broken_grow_order_leaves_that_grow_pending_and_the_cycle_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, answer: Callable[[], Any], why: str
) -> None:
    h = started(tmp_path, pm=with_policies(OrderForJob1(answer)))
    h.ctl.submit("bob", "1,8", runtime=1000, resizable=True, alloc={"hB": 1}, job_id="2")
    h.ctl.settle()
    caplog.set_level(logging.WARNING)
    h.request("alice", "1", GrowRequest(1, 1, no_notify=True))
    h.request("bob", "2", GrowRequest(1, 1, no_notify=True))
    assert h.ctl.resize_status("1").phase is Phase.GROW_PENDING  # on no host it did not choose
    assert len(h.ctl.job("1").tasks) == 2
    assert len(h.ctl.job("2").tasks) == 2  # grown in the same cycles
    assert re.search(
        "job 1: grow not placed this cycle: Rejected by site policy: "
        "xce_resize_order_grow_hosts " + why,
        caplog.text,
    )
    assert h.ctl.check_invariants() == []


def test_a_grow_order_is_read_up_to_four_names_per_host() -> None:
    """Four names per host of the cycle are read, repeats and unknown names included;
    the next one is taken for an endless order."""
    from xce_resize_plugin.policy import HookPolicy
    from xce_resize_plugin.testing import grow_host_view, make_job

    view = grow_host_view({"hA": 1, "hB": 0}, {"hA": 1})  # 2 hosts: 8 names
    for names, read in ((["hB"] * 7 + ["hA"], 8), (["hB"] * 8 + ["hA"], 8)):
        order = HookPolicy(with_policies(OrderForJob1(lambda n=names: iter(n))))
        got = order.order_grow_hosts(make_job({"hA": 1}, id="1"), view)
        assert list(itertools.islice(got, read)) == names[:read]
        if len(names) == read:
            assert list(got) == []
        else:
            with pytest.raises(errors.PolicyRejected, match="gave more than 8 names for job 1"):
                next(iter(got))


class AuthorizeMallory:
    def __init__(self, answer: object) -> None:
        self.answer = answer

    @hookimpl
    def xce_resize_authorize(self, principal: Principal, job: JobInfo, action: str) -> Any:
        return self.answer if principal.name == "mallory" else None


@pytest.mark.parametrize("answer", ["no", "False", 1, []])
def test_an_authorize_answer_that_is_not_a_bool_is_refused_naming_the_hook(
    tmp_path: Path, answer: object
) -> None:
    h = started(tmp_path, pm=with_policies(AuthorizeMallory(answer)))
    before = h.snapshot()
    with pytest.raises(
        errors.PolicyRejected,
        match=re.escape(f"xce_resize_authorize returned {answer!r} for grow on job 1, not True"),
    ):
        h.request("mallory", "1", GrowRequest(1, 1, no_notify=True))
    assert h.snapshot() == before


class RaisingHostLost:
    @hookimpl
    def xce_resize_host_lost(self, job: JobInfo, lost_task_ids: Sequence[int]) -> Any:
        raise KeyError("no such rack")


def test_a_host_lost_hook_that_raises_ends_the_job_and_the_failure_is_settled(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """docs/admin-guide.md: a failure is settled whatever a site hook does."""
    h = Harness(tmp_path, pm=with_policies(RaisingHostLost()))
    h.ctl.submit("alice", "2", runtime=1000, alloc={"hA": 2}, job_id="1")
    h.ctl.submit("bob", "2", runtime=1000, alloc={"hA": 1, "hB": 1}, job_id="2")
    h.ctl.settle()
    caplog.set_level(logging.WARNING)
    failure = h.ctl.host_down("hA")
    assert failure.outcomes == {"1": LossOutcome.EXIT, "2": LossOutcome.EXIT}
    assert [h.ctl.job(j).state for j in ("1", "2")] == [JobState.EXIT, JobState.EXIT]
    assert all(v["used"] == 0 for v in h.ctl.hosts_view().values())
    assert "xce_resize_host_lost raised KeyError: 'no such rack'; the job ends" in caplog.text


class Told:
    def __init__(self) -> None:
        self.changes: list[tuple[str, int]] = []

    @hookimpl
    def xce_resize_committed(self, job: JobInfo, change: ResizeRecord) -> None:
        self.changes.append((job.id, change.version))


class RaisingCommitted:
    @hookimpl
    def xce_resize_committed(self, job: JobInfo, change: ResizeRecord) -> None:
        raise KeyError("accounting is down")


def test_a_committed_hook_that_raises_is_logged_and_changes_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The change is committed before the hook is told: a raising implementation is
    logged, the others are told, and the rest of the batch goes on."""
    told = Told()
    h = started(tmp_path, pm=with_policies(told, RaisingCommitted()))  # the raising one first
    h.ctl.submit("bob", "1,8", runtime=1000, resizable=True, alloc={"hC": 2}, job_id="2")
    h.ctl.settle()
    caplog.set_level(logging.ERROR)
    h.request("alice", "1", GrowRequest(1, 1, no_notify=True))
    # Two releases whose tasks stop in one batch of task events.
    h.ctl.request_resize(Principal("alice"), "1", ReleaseRequest(count=1, no_notify=True))
    h.ctl.request_resize(Principal("bob"), "2", ReleaseRequest(count=1, no_notify=True))
    h.ctl.settle()
    assert sorted(told.changes) == [("1", 1), ("1", 2), ("2", 1)]
    assert [len(h.ctl.job(j).tasks) for j in ("1", "2")] == [2, 1]
    assert [h.ctl.resize_status(j).phase for j in ("1", "2")] == [Phase.IDLE, Phase.IDLE]
    used = {host: v["used"] for host, v in h.ctl.hosts_view().items()}
    assert used == {"hA": 2, "hB": 0, "hC": 1, "hD": 0}
    assert h.ctl.check_invariants() == []
    assert "xce_resize_committed (RaisingCommitted.xce_resize_committed" in caplog.text
    assert "raised on job 2's shrink to version 1; the change stands" in caplog.text


def test_principal_of_a_job_token_is_limited_to_its_job(tmp_path: Path) -> None:
    h = started(tmp_path)
    h.ctl.submit("alice", 1, runtime=100, resizable=True, alloc={"hC": 1}, job_id="2")
    with pytest.raises(errors.PermissionDenied):
        h.ctl.request_resize(Principal("alice", job_id="2"), "1", GrowRequest(1, 1))
    h.ctl.request_resize(Principal("alice", job_id="1"), "1", GrowRequest(1, 1))
