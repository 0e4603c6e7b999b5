"""The cluster ledger and the host's FCFS + EASY scheduler."""

from __future__ import annotations

import math

import pytest

from tests.conftest import CtlFactory
from xce_resize_plugin.controllers.scheduler import (
    PendingJob,
    RunningJob,
    easy_pass,
    reservation_for,
)
from xce_resize_plugin.controllers.sim import Cluster, ContractViolation, SubmissionRejected
from xce_resize_plugin.controllers.slots import FreeSlots
from xce_resize_plugin.core.models import JobState, Task

# -- cluster ledger ---------------------------------------------------------------------


def test_reserve_and_free_are_idempotent_per_task_id() -> None:
    c = Cluster({"a": 2, "b": 2})
    c.register_job("1", "alice")
    assert c.reserve("1", [Task(0, "a"), Task(1, "a")]) == [Task(0, "a"), Task(1, "a")]
    assert c.reserve("1", [Task(0, "a")]) == []  # already held: no-op
    assert c.free_slots() == {"a": 0, "b": 2}
    assert c.free("1", [1, 7]) == 1  # 7 unknown: ignored
    assert c.held("1") == {0: "a"}
    assert c.free("1", [1]) == 0
    assert c.free("unknown-job", [0]) == 0
    assert c.free_slots() == {"a": 1, "b": 2}
    assert c.check() == []


def test_reserve_beyond_slots_or_elsewhere_raises_and_changes_nothing() -> None:
    c = Cluster([("a", 1), ("b", 1)])
    c.register_job("1", "u")
    with pytest.raises(ContractViolation, match="exceed"):
        c.reserve("1", [Task(0, "b"), Task(1, "a"), Task(2, "a")])
    assert c.free_slots() == {"a": 1, "b": 1}
    c.reserve("1", [Task(0, "a")])
    with pytest.raises(ContractViolation, match="held on a"):
        c.reserve("1", [Task(0, "b")])
    with pytest.raises(ContractViolation, match="unknown host"):
        c.reserve("1", [Task(1, "zz")])
    with pytest.raises(ContractViolation, match="not known"):
        c.reserve("2", [Task(0, "b")])


def test_user_limit_and_headroom() -> None:
    c = Cluster({"a": 8}, user_slots={"alice": 3})
    c.register_job("1", "alice")
    c.register_job("2", "bob")
    assert c.headroom("alice") == 3
    assert c.headroom("bob") is None
    c.reserve("1", [Task(0, "a"), Task(1, "a")])
    assert c.headroom("alice") == 1
    with pytest.raises(ContractViolation, match="limit"):
        c.reserve("1", [Task(2, "a"), Task(3, "a")])
    c.reserve("2", [Task(i, "a") for i in range(6)])
    assert c.users_in_use() == {"alice": 2, "bob": 6}


# -- pure scheduler -------------------------------------------------------------------


def test_place_host_order_ptile_headroom() -> None:
    free = FreeSlots.of({"a": 3, "b": 1, "c": 4})
    assert free.place(2, 8, None) == (("a", 3), ("b", 1), ("c", 4))
    assert free.place(2, 5, 2) == (("a", 2), ("b", 1), ("c", 2))
    assert free.place(2, 8, None, headroom=4) == (("a", 3), ("b", 1))
    assert free.place(9, 9, None) is None
    assert free.place(2, 8, None, headroom=1) is None
    assert free.capacity(None) == 8 and free.capacity(2) == 5 and free.capacity(1) == 3


def test_reservation_with_ptile_is_per_host() -> None:
    # Head needs 2 tasks with ptile 1: one more host must free up, not just 2 slots.
    head = PendingJob("h", "u", 2, 2, 1, 10.0)
    running = [RunningJob("x", 50.0, {"a": 2}), RunningJob("y", 80.0, {"b": 2})]
    res, at_shadow = reservation_for(0.0, head, FreeSlots.of({"a": 0, "b": 0}), running)
    assert res.shadow == 80.0
    assert at_shadow is not None and at_shadow.as_dict() == {"a": 2, "b": 2}
    assert res.extra == 0  # both hosts are needed, one task each
    never, _ = reservation_for(
        0.0, head, FreeSlots.of({"a": 0, "b": 0}), [RunningJob("x", None, {"a": 2})]
    )
    assert never.shadow == math.inf
    # Without ptile, 2 slots are enough: the first release gives them.
    counted, _ = reservation_for(
        0.0, PendingJob("h", "u", 2, 2, None, 10.0), FreeSlots.of({"a": 0, "b": 0}), running
    )
    assert (counted.shadow, counted.extra) == (50.0, 0)


def test_a_ptile_heads_slots_at_the_shadow_time_are_its_own() -> None:
    """The pass gives the reservation its slots, not a copy (a scratch, which its
    backfills then change): the slots at the shadow time must not follow them."""
    head = PendingJob("h", "u", 2, 2, 1, 10.0)
    running = [RunningJob("x", 50.0, {"a": 1}), RunningJob("y", 80.0, {"b": 1})]
    free = FreeSlots.of({"a": 0, "b": 0, "c": 1}).scratch()
    _, at_shadow = reservation_for(0.0, head, free, running)
    assert at_shadow is not None and at_shadow.as_dict() == {"a": 1, "b": 0, "c": 1}
    free.take([("c", 1)])  # a backfill on the host free now
    assert at_shadow.as_dict() == {"a": 1, "b": 0, "c": 1}
    assert at_shadow.capacity(1) == 2
    free.restore()


def test_a_backfill_past_the_shadow_time_leaves_a_ptile_head_its_hosts() -> None:
    # a (2 slots) and b (1 slot) are busy until 80, c (1 slot) is free. The head (3
    # tasks, ptile 1) needs all three hosts at 80, so a long 1-task job may not take c,
    # although 4 slots are free at 80 and the head needs 3.
    running = [RunningJob("x", 80.0, {"a": 2}), RunningJob("y", 80.0, {"b": 1})]
    free = FreeSlots.of({"a": 0, "b": 0, "c": 1})
    head = PendingJob("h", "u", 3, 3, 1, 10.0)
    long = PendingJob("l", "u", 1, 1, None, 500.0)
    result = easy_pass(0.0, [head, long], running, free, lambda user: None)
    assert result.starts == ()
    assert result.reservation is not None and result.reservation.shadow == 80.0
    # Without ptile the head needs 3 of the 4 slots free at 80: the long job may start.
    plain = PendingJob("h", "u", 3, 3, None, 10.0)
    result = easy_pass(0.0, [plain, long], running, free, lambda user: None)
    assert [s.job_id for s in result.starts] == ["l"]
    # A slot the ptile head cannot use (a second one on c) is extra: taken at once.
    free = FreeSlots.of({"a": 0, "b": 0, "c": 2})
    result = easy_pass(0.0, [head, long], running, free, lambda user: None)
    assert [s.placement for s in result.starts] == [(("c", 1),)]
    res = result.reservation
    assert res is not None and res.excess == {"a": (1, 0)}  # c's second slot is taken


def test_easy_pass_skips_limit_blocked_jobs() -> None:
    pending = [PendingJob("1", "alice", 2, 2, None, 5.0), PendingJob("2", "bob", 2, 2, None, 5.0)]
    result = easy_pass(0.0, pending, [], FreeSlots.of({"a": 2}), {"alice": 1}.get)
    assert [s.job_id for s in result.starts] == ["2"]
    assert result.reservation is None


# -- through the controller -----------------------------------------------------------


def starts(ctl: object) -> dict[str, float | None]:
    return {j.id: j.start_time for j in ctl.jobs()}  # type: ignore[attr-defined]


def test_fcfs_order(make_ctl: CtlFactory) -> None:
    ctl = make_ctl(hosts={"h1": 4})
    a = ctl.submit("u", 4, runtime=10)
    b = ctl.submit("u", 4, runtime=10)
    c = ctl.submit("u", 1, runtime=100)  # would fit nowhere before b: no backfill gap
    ctl.run()
    s = starts(ctl)
    assert (s[a], s[b]) == (0.0, 10.0)
    assert s[c] == 20.0
    assert [j.state for j in ctl.jobs()] == [JobState.DONE] * 3
    assert ctl.check_invariants() == []


def test_easy_backfills_short_job_and_refuses_one_that_delays_head(make_ctl: CtlFactory) -> None:
    ctl = make_ctl(hosts={"h1": 10})
    a = ctl.submit("u", 6, runtime=100)
    head = ctl.submit("u", 10, runtime=10)
    short = ctl.submit("u", 2, runtime=50)
    long = ctl.submit("u", 2, runtime=200)
    exact = ctl.submit("u", 2, runtime=100)  # ends exactly at the shadow time
    ctl.settle()
    res = ctl.reservation
    assert res is not None and res.job_id == head and res.shadow == 100.0
    ctl.run()
    s = starts(ctl)
    assert s[a] == 0.0 and s[short] == 0.0 and s[exact] == 0.0
    assert s[head] == 100.0
    assert s[long] == 110.0
    assert ctl.check_invariants() == []


def test_easy_backfills_into_extra_slots(make_ctl: CtlFactory) -> None:
    ctl = make_ctl(hosts={"h1": 10})
    ctl.submit("u", 6, runtime=100)
    head = ctl.submit("u", 8, runtime=10)
    long = ctl.submit("u", 2, runtime=500)  # 2 extra slots at the shadow time
    long2 = ctl.submit("u", 1, runtime=500)  # no extra slot left for it
    ctl.run()
    s = starts(ctl)
    assert s[long] == 0.0 and s[head] == 100.0
    assert s[long2] == 110.0  # after the head, never ahead of it


def test_backfill_uses_the_estimate(make_ctl: CtlFactory) -> None:
    ctl = make_ctl(hosts={"h1": 4})
    ctl.submit("u", 3, runtime=100)
    head = ctl.submit("u", 4, runtime=10)
    liar = ctl.submit("u", 1, runtime=30, estimate=500)  # estimate says: would delay head
    ctl.settle()
    assert ctl.job(liar).state is JobState.PEND
    assert ctl.job(head).state is JobState.PEND


def test_moldable_start_takes_as_many_as_fit(make_ctl: CtlFactory) -> None:
    ctl = make_ctl(hosts={"h1": 4, "h2": 4})
    ctl.submit("u", 3, runtime=10)
    mold = ctl.submit("u", "2,8", runtime=10)
    ctl.settle()
    job = ctl.job(mold)
    assert job.state is JobState.RUN
    assert [t.host for t in job.tasks] == ["h1", "h2", "h2", "h2", "h2"]
    assert [t.id for t in job.tasks] == [0, 1, 2, 3, 4]
    assert (job.min_tasks, job.max_tasks) == (2, 8)


def test_ptile_at_start(make_ctl: CtlFactory) -> None:
    ctl = make_ctl()
    job_id = ctl.submit("u", 5, ptile=2, runtime=10)
    ctl.settle()
    job = ctl.job(job_id)
    assert [(t.id, t.host) for t in job.tasks] == [
        (0, "h1"),
        (1, "h1"),
        (2, "h2"),
        (3, "h2"),
        (4, "h3"),
    ]
    with pytest.raises(SubmissionRejected, match="never start"):
        ctl.submit("u", 4, ptile=1)  # 3 hosts: at most 3 tasks with ptile 1


def test_user_slot_limit_blocks_start_but_not_others(make_ctl: CtlFactory) -> None:
    ctl = make_ctl(user_slots={"alice": 4})
    first = ctl.submit("alice", 4, runtime=10)
    second = ctl.submit("alice", 2, runtime=10)
    bob = ctl.submit("bob", 2, runtime=10)
    ctl.settle()
    assert ctl.job(first).state is JobState.RUN
    assert ctl.job(second).state is JobState.PEND
    assert ctl.job(bob).state is JobState.RUN
    assert ctl.slot_headroom("alice") == 0
    assert ctl.users_view() == {"alice": {"slots_in_use": 4}, "bob": {"slots_in_use": 2}}
    ctl.run()
    assert ctl.job(second).start_time == 10.0
    with pytest.raises(SubmissionRejected, match="limit of 4"):
        ctl.submit("alice", 5)


def test_explicit_alloc_starts_at_submit(make_ctl: CtlFactory) -> None:
    ctl = make_ctl()
    job_id = ctl.submit("u", alloc={"h2": 2, "h1": 1}, runtime=10)
    job = ctl.job(job_id)
    assert job.state is JobState.RUN and job.start_time == 0.0
    assert [(t.id, t.host) for t in job.tasks] == [(0, "h2"), (1, "h2"), (2, "h1")]
    assert ctl.get_job(job_id).first_host == "h2"  # type: ignore[union-attr]
    with pytest.raises(SubmissionRejected, match="does not fit"):
        ctl.submit("u", alloc={"h2": 3})
    with pytest.raises(SubmissionRejected, match="outside"):
        ctl.submit("u", 4, alloc={"h3": 2})
    assert len(ctl.jobs()) == 1
    assert ctl.hosts_view()["h2"] == {"slots": 4, "used": 2}


def test_job_ids_and_future_submissions(make_ctl: CtlFactory) -> None:
    ctl = make_ctl()
    assert ctl.submit("u", 1, runtime=5) == "101"
    assert ctl.submit("u", 1, runtime=5, job_id="103") == "103"
    later = ctl.submit("u", 1, runtime=5, submit_time=20)
    assert later == "102"
    assert ctl.submit("u", 1) == "104"
    assert ctl.get_job(later) is None  # not arrived yet
    ctl.run(until=19)
    assert ctl.get_job(later) is None
    ctl.run(until=20)
    assert ctl.job(later).state is JobState.RUN
    assert ctl.job(later).submit_time == 20.0
    with pytest.raises(SubmissionRejected, match="in use"):
        ctl.submit("u", 1, job_id="101")
    with pytest.raises(SubmissionRejected, match="before now"):
        ctl.submit("u", 1, submit_time=3)


def test_kill_pending_and_running(make_ctl: CtlFactory) -> None:
    ctl = make_ctl(hosts={"h1": 2})
    run = ctl.submit("u", 2, runtime=100)
    pend = ctl.submit("u", 2, runtime=100)
    ctl.settle()
    assert ctl.kill(pend)
    assert ctl.job(pend).state is JobState.EXIT
    ctl.advance(5)
    assert ctl.kill(run)
    assert not ctl.kill(run)
    job = ctl.job(run)
    assert job.state is JobState.EXIT and job.end_time == 5.0 and job.held == ()
    assert ctl.hosts_view() == {"h1": {"slots": 2, "used": 0}}


def test_initial_caps_the_start_even_on_an_idle_cluster(make_ctl: CtlFactory) -> None:
    """``submit --initial N``: the job starts with at most N tasks though more are free
    (unlike a trace's start size, idle slots never fill it up to max)."""
    ctl = make_ctl()
    capped = ctl.submit("u", "1,8", initial_tasks=2, runtime=10, resizable=True)
    plain = ctl.submit("u", "1,3", runtime=10)
    ctl.settle()
    assert len(ctl.job(capped).tasks) == 2
    assert len(ctl.job(plain).tasks) == 3  # the rest of the idle cluster's slots fit it
    with pytest.raises(SubmissionRejected, match="initial 9 outside the job's 1,8"):
        ctl.submit("u", "1,8", initial_tasks=9)
    with pytest.raises(SubmissionRejected, match="initial 1 outside the job's 2,8"):
        ctl.submit("u", "2,8", initial_tasks=1)
    assert len(ctl.jobs()) == 2


def test_initial_starts_smaller_when_only_min_fits(make_ctl: CtlFactory) -> None:
    ctl = make_ctl(hosts={"h1": 4, "h2": 4})
    ctl.submit("u", 7, runtime=10)
    job = ctl.submit("u", "1,4", initial_tasks=3, runtime=10)
    ctl.settle()
    assert len(ctl.job(job).tasks) == 1  # 1 slot left: min fits, the cap is a ceiling
