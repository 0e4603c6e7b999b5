"""The fast paths the trace simulator relies on decide exactly what the plain ones do.

- ``easy_pass`` over only the free hosts (``order``) with the running jobs sorted by
  end (``presorted``) against the original dense call;
- the cluster's bulk ``allocate``/``release_all`` against ``reserve``/``free``, and its
  sparse free view against the dense one;
- the journal's state encoding with its cached records against plain cattrs + json.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from xce_resize_plugin.controllers.scheduler import PendingJob, RunningJob, easy_pass
from xce_resize_plugin.controllers.sim import Cluster
from xce_resize_plugin.core import converters, engine
from xce_resize_plugin.core.models import (
    Committed,
    GrowPlaced,
    GrowRequested,
    JobTracked,
    ReleaseAccepted,
    ResizeState,
    Task,
    TasksLaunched,
    TaskStarted,
    TaskStopped,
)
from xce_resize_plugin.journal import StoredState


@st.composite
def pass_inputs(
    draw: st.DrawFn,
) -> tuple[dict[str, int], list[RunningJob], list[PendingJob], dict[str, int]]:
    n_hosts = draw(st.integers(1, 8))
    hosts = {f"h{i}": draw(st.integers(1, 4)) for i in range(n_hosts)}
    free = dict(hosts)
    running: list[RunningJob] = []
    for j in range(draw(st.integers(0, 8))):
        taken: dict[str, int] = {}
        for h in hosts:
            k = draw(st.integers(0, free[h]))
            if k:
                taken[h] = k
                free[h] -= k
        if taken:
            end = draw(st.one_of(st.none(), st.sampled_from([5.0, 10.0, 10.0, 30.0, 50.0])))
            running.append(RunningJob(f"r{j}", end, taken))
    pending = []
    for j in range(draw(st.integers(1, 8))):
        lo = draw(st.integers(1, 6))
        hi = draw(st.integers(lo, 8))
        ptile = draw(st.one_of(st.none(), st.integers(1, 3)))
        duration = draw(st.one_of(st.none(), st.sampled_from([1.0, 8.0, 20.0, 100.0])))
        fill = draw(st.one_of(st.none(), st.integers(hi, 10)))
        pending.append(PendingJob(f"p{j}", f"u{j % 2}", lo, hi, ptile, duration, fill_to=fill))
    return hosts, running, pending, free


@settings(max_examples=300, deadline=None)
@given(pass_inputs(), st.sampled_from([0.0, 7.0, 10.0]))
def test_sparse_sorted_pass_matches_the_dense_one(
    data: tuple[dict[str, int], list[RunningJob], list[PendingJob], dict[str, int]], now: float
) -> None:
    hosts, running, pending, free = data
    dense = easy_pass(now, pending, running, free, lambda user: None)
    order = {h: i for i, h in enumerate(hosts)}
    sparse_free = {h: n for h, n in free.items() if n > 0}
    by_end = sorted((r for r in running if r.end is not None), key=lambda r: r.end or 0.0)
    fast = easy_pass(now, pending, by_end, sparse_free, lambda user: None, order, presorted=True)
    assert fast.starts == dense.starts
    if dense.reservation is None:
        assert fast.reservation is None
    else:
        assert fast.reservation is not None
        assert fast.reservation.job_id == dense.reservation.job_id
        assert fast.reservation.shadow == dense.reservation.shadow
        # The sparse reservation lists only the hosts it saw; the others have 0 extra.
        for host, n in dense.reservation.extra.items():
            assert fast.reservation.extra.get(host, 0) == n


def test_fill_takes_leftovers_only_when_nobody_waits() -> None:
    free = {"a": 4, "b": 4}
    grow = PendingJob("m", "u", 1, 2, None, 10.0, fill_to=6)
    alone = easy_pass(0.0, [grow], [], free, lambda user: None)
    assert alone.starts[0].placement == (("a", 4), ("b", 2))  # 2 preferred, filled to 6
    blocked = PendingJob("big", "u", 8, 8, None, 10.0)
    waiting = easy_pass(0.0, [grow, blocked], [], free, lambda user: None)
    assert waiting.starts[0].placement == (("a", 2),)  # someone waits: the preferred 2


def test_cluster_bulk_paths_agree_with_per_task_ones() -> None:
    hosts = [("a", 2), ("b", 1), ("c", 3)]
    bulk, plain = Cluster(hosts), Cluster(hosts)
    for c in (bulk, plain):
        c.register_job("1", "u")
        c.register_job("2", "v")
    tasks = bulk.allocate("1", (("a", 2), ("c", 1)))
    assert tasks == (Task(0, "a"), Task(1, "a"), Task(2, "c"))
    plain.reserve("1", list(tasks))
    assert bulk.free_slots() == plain.free_slots() == {"a": 0, "b": 1, "c": 2}
    assert bulk.open_slots() == {"b": 1, "c": 2}
    assert bulk.held("1") == plain.held("1")
    assert bulk.check() == plain.check() == []
    bulk.allocate("2", (("b", 1),))
    assert bulk.open_slots() == {"c": 2}
    assert bulk.release_all("1") == 3
    plain.free("1", [0, 1, 2])
    assert bulk.open_slots() == {"a": 2, "c": 3}
    assert bulk.held("1") == plain.held("1") == {}
    assert bulk.check() == []


def test_cluster_allocate_refuses_what_reserve_refuses() -> None:
    import pytest

    from xce_resize_plugin.controllers.sim import ContractViolation

    c = Cluster([("a", 1)], user_slots={"u": 1})
    c.register_job("1", "u")
    with pytest.raises(ContractViolation, match="exceed"):
        c.allocate("1", (("a", 2),))
    with pytest.raises(ContractViolation, match="unknown host"):
        c.allocate("1", (("zz", 1),))
    c.allocate("1", (("a", 1),))
    with pytest.raises(ContractViolation, match="already holds"):
        c.allocate("1", (("a", 1),))
    assert c.check() == []


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(1, 4)), min_size=0, max_size=12))
def test_history_rows_written_per_transition_rebuild_the_state(
    steps: list[tuple[bool, int]],
) -> None:
    """The journal keeps a job's history as rows that each transition patches at the
    end: after every fact of a job's life the rows and the state decode to the state."""
    rows: dict[str, list[bytes]] = {"records": [], "charges": []}
    previous: ResizeState | None = None

    def stored(state: ResizeState) -> ResizeState:
        nonlocal previous
        for tail in converters.history_tails(previous, state):
            assert tail.stop == len(rows[tail.name])
            rows[tail.name][tail.start :] = tail.rows
        previous = state
        data = StoredState(
            converters.encode_state(state), tuple(rows["records"]), tuple(rows["charges"])
        )
        assert converters.decode_state(data) == state
        return state

    state = engine.evolve(
        None,
        JobTracked(
            job_id="7",
            at=0.0,
            user="u",
            min_tasks=1,
            max_tasks=99,
            tasks=(Task(0, "h0"), Task(1, "h1")),
            started_at=0.0,
        ),
    )
    state = stored(state)
    t = 0.0
    for grow, k in steps:
        t += 1.0
        if grow:
            state = engine.evolve(
                state,
                GrowRequested(
                    job_id="7", at=t, min_add=1, max_add=k, notify_cmd=None, principal="u"
                ),
            )
            new = tuple(Task(state.next_task_id + i, f"h{i}") for i in range(k))
            facts = [GrowPlaced(job_id="7", at=t, tasks=new), TasksLaunched(job_id="7", at=t)]
            facts += [TaskStarted(job_id="7", at=t, task_id=x.id) for x in new]
        else:
            gone = state.tasks[-min(k, len(state.tasks) - 1) :] if len(state.tasks) > 1 else ()
            if not gone:
                continue
            facts = [
                ReleaseAccepted(job_id="7", at=t, tasks=gone, notify_cmd=None, principal="u"),
                TasksLaunched(job_id="7", at=t),
            ]
            facts += [TaskStopped(job_id="7", at=t, task_id=x.id) for x in gone]
        for fact in [*facts, Committed(job_id="7", at=t, version=state.version + 1)]:
            state = stored(engine.evolve(state, fact))
