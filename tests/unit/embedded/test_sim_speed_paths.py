"""The fast paths the trace simulator relies on decide exactly what the plain ones do.

- the scheduler's free-slot counts (:mod:`~.controllers.slots`: classes, a bitmap of
  the hosts with free slots, drafts) against a plain map;
- the cluster's bulk ``allocate``/``release_all`` against ``reserve``/``free``, and its
  sparse free view against the dense one;
- the journal's state encoding with its cached records against plain cattrs + json.
"""

from __future__ import annotations

import copy
from itertools import combinations, pairwise
from typing import Any
from unittest.mock import patch

import attrs
from hypothesis import given, settings
from hypothesis import strategies as st

from xce_resize_plugin.controllers import scheduler
from xce_resize_plugin.controllers.lazy import TaskList
from xce_resize_plugin.controllers.scheduler import (
    PendingJob,
    Reservation,
    RunningJob,
    easy_pass,
)
from xce_resize_plugin.controllers.sim import Cluster
from xce_resize_plugin.controllers.sim.cluster_view import SimClusterView, _budget, _offered
from xce_resize_plugin.controllers.slots import FreeSlots
from xce_resize_plugin.core import converters, engine, task_codec
from xce_resize_plugin.core.facts import (
    Committed,
    GrowPlaced,
    GrowRequested,
    JobTracked,
    ReleaseAccepted,
    TasksLaunched,
    TaskStarted,
    TaskStopped,
)
from xce_resize_plugin.core.models import (
    GrowRequest,
    JobInfo,
    ReleaseRequest,
    ResizeState,
    Task,
    TaskEvent,
)
from xce_resize_plugin.core.placement import SparseFree
from xce_resize_plugin.host import Principal
from xce_resize_plugin.journal import StoredState
from xce_resize_plugin.manager import get_plugin_manager
from xce_resize_plugin.policy import HookPolicy
from xce_resize_plugin.testing import grow_host_view, make_job

OWNER = Principal("alice")


def _agrees(slots: FreeSlots, model: dict[str, int], ptile: int | None) -> None:
    assert slots.problems() == []
    assert slots.as_dict() == model
    assert list(slots.open_hosts()) == [(h, n) for h, n in model.items() if n]
    assert slots.total == sum(model.values())
    assert slots.capacity(ptile) == sum(
        n if ptile is None else min(n, ptile) for n in model.values()
    )
    want = sum(model.values()) // 2 + 1
    expected, left = [], want
    for h, n in model.items():
        if n and left:
            take = min(n, left, ptile or n)
            expected.append((h, take))
            left -= take
    placed = slots.place(want, want, ptile)
    assert placed == (tuple(expected) if not left else None)
    # fit() is the size place() gives, from the counts alone.
    total = slots.total
    for lo, hi, room in (
        (1, want, None),
        (want, total + 3, None),
        (1, total, want // 2),
        (0, 0, 5),
    ):
        p = slots.place(lo, hi, ptile, room)
        assert slots.fit(lo, hi, ptile, room) == (0 if p is None else p.total)


changes = st.lists(st.tuples(st.integers(0, 149), st.integers(-3, 3)), max_size=40)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(0, 5), min_size=1, max_size=150),
    changes,
    changes,
    st.one_of(st.none(), st.integers(1, 4)),
)
def test_free_slots_agree_with_a_plain_map(
    initial: list[int],
    base_changes: list[tuple[int, int]],
    draft_changes: list[tuple[int, int]],
    ptile: int | None,
) -> None:
    """Counts per class, the bitmap of hosts with free slots (more than 64 hosts: several
    words) and greedy placement against a plain map; then a draft's changes stay in the
    draft. Snapshots taken on the way (they share the counts until the next change)
    keep the counts of their instant."""
    names = [f"h{i:03d}" for i in range(len(initial))]
    slots = FreeSlots(names, initial)
    model = dict(zip(names, initial, strict=True))
    snapshots = [(slots.snapshot(), _open(model))]
    for i, delta in base_changes:
        host = names[i % len(names)]
        model[host] = max(0, model[host] + delta)
        slots.set(host, model[host])
        _agrees(slots, model, ptile)
        snapshots.append((slots.snapshot(), _open(model)))
    draft, draft_model = slots.draft(), dict(model)
    for i, delta in draft_changes:
        host = names[i % len(names)]
        draft_model[host] = max(0, draft_model[host] + delta)
        draft.set(host, draft_model[host])
        _agrees(draft, draft_model, ptile)
        snapshots.append((draft.snapshot(), _open(draft_model)))
    _agrees(slots, model, ptile)
    for snap, expected in snapshots:
        assert dict(snap) == expected
    for (a, a_model), (b, b_model) in pairwise(snapshots):
        assert (a == b) == (a_model == b_model)


#: Free slots per host in stretches of alike hosts, some longer than a bitmap word.
host_blocks = st.lists(
    st.tuples(st.integers(0, 3), st.integers(1, 150)), min_size=1, max_size=5
).map(lambda bs: [v for v, n in bs for _ in range(n)])


@settings(max_examples=200, deadline=None)
@given(
    host_blocks,
    st.lists(
        st.tuples(
            st.sampled_from(["place", "set", "set_many", "give", "draft"]),
            st.integers(0, 10**6),
            st.integers(1, 300),
            st.one_of(st.none(), st.integers(1, 3)),
        ),
        max_size=25,
    ),
)
def test_a_scratch_agrees_with_a_plain_map_and_restores_its_parent(
    initial: list[int], steps: list[tuple[str, int, int, int | None]]
) -> None:
    """A scratch (what a scheduling pass writes in place) reads as a plain map through
    every kind of change, its drafts keep their own counts, and :meth:`restore` gives
    the parent back exactly: counts, classes, bitmap, and a snapshot taken before."""
    names = [f"h{i:03d}" for i in range(len(initial))]
    parent = FreeSlots(names, initial)
    before = parent.as_dict()
    snap = parent.snapshot()
    scratch = parent.scratch()
    model = dict(before)
    drafts: list[tuple[FreeSlots, dict[str, int]]] = []
    for kind, at, n, ptile in steps:
        host = names[at % len(names)]
        if kind == "place":
            placed = scratch.place(1, n, ptile)
            if placed is not None:
                scratch.take(placed)
                for h, k in placed:
                    model[h] -= k
        elif kind == "set":
            model[host] = n % 4
            scratch.set(host, model[host])
        elif kind == "set_many":
            hosts = [names[(at + k) % len(names)] for k in range(min(n, len(names)))]
            pairs = [(h, (at + k) % 3) for k, h in enumerate(dict.fromkeys(hosts))]
            scratch.set_many(pairs)
            model.update(pairs)
        elif kind == "give":
            scratch.give([(host, n % 3)])
            model[host] += n % 3
        else:
            child = scratch.draft()
            child.set(host, 0)
            drafts.append((child, {**model, host: 0}))
            continue  # (a draft in use: the scratch does not change meanwhile)
        _agrees(scratch, model, ptile)
        drafts = []
    for child, child_model in drafts:
        assert child.as_dict() == child_model and child.problems() == []
    scratch.restore()
    assert parent.as_dict() == before and parent.problems() == []
    assert dict(snap) == _open(before)


def _open(model: dict[str, int]) -> dict[str, int]:
    """The hosts with free slots, as a snapshot lists them."""
    return {h: n for h, n in model.items() if n}


#: Moldable jobs of a queue: (size, more it may fill, ptile, user, duration).
moldable_jobs = st.lists(
    st.tuples(
        st.integers(1, 60),
        st.integers(0, 60),
        st.one_of(st.none(), st.integers(1, 3)),
        st.sampled_from(["u", "v"]),
        st.one_of(st.none(), st.floats(1.0, 500.0)),
    ),
    min_size=1,
    max_size=8,
)


def _queue(jobs: list[tuple[int, int, int | None, str, float | None]]) -> list[PendingJob]:
    return [
        PendingJob(f"j{k}", user, size, size, ptile, duration, fill_to=size + extra)
        for k, (size, extra, ptile, user, duration) in enumerate(jobs)
    ]


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.integers(0, 3), min_size=1, max_size=80),
    moldable_jobs,
    st.one_of(st.none(), st.integers(0, 50)),
)
def test_leftovers_placed_as_runs_are_what_the_host_walk_places(
    slots: list[int],
    jobs: list[tuple[int, int, int | None, str, float | None]],
    room: int | None,
) -> None:
    """A moldable start filled with the slots left, as runs joined to its own, is the
    start the host-by-host walk makes (hosts in the same order with the same counts),
    and the pass leaves the same free slots; with ``ptile``, or a host the start has
    already, the walk decides."""
    names = [f"h{i:03d}" for i in range(len(slots))]
    pending = _queue(jobs)

    def one_pass() -> tuple[Any, dict[str, int]]:
        free = FreeSlots(names, slots)
        result = easy_pass(0.0, pending, [], free, lambda user: room)
        left = free.draft()
        for start in result.starts:
            left.take(start.placement)
        return result, left.as_dict()

    fast = one_pass()
    with patch.object(scheduler, "_fill_as_runs", lambda *a: False):
        walked = one_pass()
    assert fast == walked


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.integers(0, 3), min_size=1, max_size=150),
    moldable_jobs,
    st.lists(st.tuples(st.integers(0, 149), st.integers(1, 4), st.floats(1.0, 400.0))),
)
def test_a_pass_on_a_scratch_decides_as_on_a_copy_and_leaves_the_counts(
    slots: list[int],
    jobs: list[tuple[int, int, int | None, str, float | None]],
    held: list[tuple[int, int, float]],
) -> None:
    """The pass writes its trial starts into the cluster's counts and restores them
    (FreeSlots.scratch): it decides what it decides on a copy, with or without a head
    with ptile, and leaves the counts, classes and bitmap as they were."""
    names = [f"h{i:03d}" for i in range(len(slots))]
    pending = _queue(jobs)
    running = sorted(
        (
            RunningJob(f"r{k}", end, {names[at % len(names)]: n})
            for k, (at, n, end) in enumerate(held)
        ),
        key=lambda r: r.end or 0.0,
    )
    free = FreeSlots(names, slots)
    before = free.as_dict()
    result = easy_pass(0.0, pending, running, free, lambda user: None)
    assert free.as_dict() == before and free.problems() == []
    with (
        patch.object(FreeSlots, "scratch", FreeSlots.draft),
        patch.object(FreeSlots, "restore", lambda self: None),
    ):
        assert easy_pass(0.0, pending, running, free, lambda user: None) == result


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(1, 3), min_size=1, max_size=90),
    st.lists(st.integers(0, 89), max_size=60),
    st.one_of(
        st.none(),
        st.tuples(st.integers(0, 60), st.integers(0, 30)),
        st.tuples(st.integers(1, 3), st.lists(st.tuples(st.integers(0, 3), st.integers(0, 3)))),
    ),
)
def test_the_cycles_offered_slots_read_as_every_hosts_count(
    slots: list[int], taken: list[int], head: Any
) -> None:
    """What ``xce_sched_cycle`` is offered (the cluster's free slots, within a blocked
    head's reservation) reads as the dict of every host's count it stands for, its
    open items are that dict's hosts with slots, and later changes do not reach it."""
    names = [f"h{i:03d}" for i in range(len(slots))]
    cluster = Cluster(list(zip(names, slots, strict=True)))
    cluster.register_job("j", "u")
    pos = sorted({i % len(names) for i in taken})
    if pos:
        cluster.reserve("j", [Task(k, names[i]) for k, i in enumerate(pos)])
    res: Reservation | None = None
    if isinstance(head, tuple) and isinstance(head[1], int):
        res = Reservation("h", 10.0, head[0])
    elif isinstance(head, tuple):
        excess = {names[i % len(names)]: pair for i, pair in enumerate(head[1])}
        res = Reservation("h", 10.0, 0, head[0], excess)
    view = SimClusterView(cluster, res, taken_at_pass=0)
    offered = view.free_slots()
    # What it stood for before (every host, clamped the same way).
    want = cluster.free_slots()
    if res is not None and res.ptile is not None:
        want = {h: _offered(h, n, res) for h, n in want.items()}
    elif res is not None:
        budget = _budget(cluster, res, 0)
        for h, n in want.items():
            want[h] = give = min(n, budget)
            budget -= give
    assert isinstance(offered, SparseFree)
    assert list(offered.host_order()) == list(want) == list(offered)
    assert list(offered.open_items()) == [(h, n) for h, n in want.items() if n > 0]
    cluster.release_all("j")  # a later change is not seen
    assert dict(offered) == want and len(offered) == len(want)
    assert all(h in offered for h in names) and "ghost" not in offered


def test_leftovers_count_against_the_users_limit_in_the_pass() -> None:
    """Two moldable starts of one user with room for 10 slots: the first is filled to
    the limit, and the second, with nothing left of the user's room, is not."""
    free = FreeSlots([f"h{i}" for i in range(30)], [1] * 30)
    jobs = [PendingJob(f"m{k}", "u", 2, 2, None, 10.0, fill_to=8) for k in range(2)]
    result = easy_pass(0.0, jobs, [], free, lambda user: 10)
    assert [s.placement.total for s in result.starts] == [8, 2]
    assert result.starts[0].placement.runs is not None  # filled as runs


def test_fill_takes_leftovers_only_when_nobody_waits() -> None:
    free = FreeSlots.of({"a": 4, "b": 4})
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
    assert dict(bulk.open_slots()) == {"b": 1, "c": 2}
    assert bulk.held("1") == plain.held("1")
    assert bulk.check() == plain.check() == []
    bulk.allocate("2", (("b", 1),))
    assert dict(bulk.open_slots()) == {"c": 2}
    assert bulk.release_all("1") == 3
    plain.free("1", [0, 1, 2])
    assert dict(bulk.open_slots()) == {"a": 2, "c": 3}
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


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 600), min_size=1, max_size=30))
def test_allocations_encode_to_the_same_bytes_kept_or_not(sizes: list[int]) -> None:
    """The journal keeps the bytes of the allocations it encoded last: a tuple encoded
    again (kept, or dropped when the keep was full), and a new tuple equal to an old
    one, give the bytes of plain JSON, and facts that carry them decode to themselves."""
    import orjson

    def plain_json(tasks: tuple[Task, ...]) -> bytes:
        # The hosts here are never numbered one after another: names, not runs.
        ids = [t.id for t in tasks]
        stretches: list[list[int]] = []
        for i in ids:
            if stretches and stretches[-1][0] + stretches[-1][1] == i:
                stretches[-1][1] += 1
            else:
                stretches.append([i, 1])
        hosts = [t.host for t in tasks]
        if len(ids) < task_codec.RUN_MIN or len(stretches) > len(ids) // 16:
            return orjson.dumps([[t.id, t.host] for t in tasks])
        if len(stretches) == 1:
            return orjson.dumps({"first": ids[0], "hosts": hosts})
        return orjson.dumps({"ids": stretches, "hosts": hosts})

    made: list[tuple[Task, ...]] = []
    for i, n in enumerate(sizes):
        # Consecutive ids (from 0, or from i), or with a gap.
        ids = [k + (i if i % 3 == 1 else 0) + (k >= n // 2 if i % 3 == 2 else 0) for k in range(n)]
        made.append(tuple(Task(k, f"h{(k * 7 + i) % 13}") for k in ids))
        again = made[len(made) // 2]
        for tasks in (made[-1], again, tuple(again)[:], tuple(list(again))):
            plain = plain_json(tasks)
            assert orjson.dumps(converters.JOURNAL.unstructure(tasks, tuple[Task, ...])) == plain
            fact = JobTracked(
                job_id="7",
                at=0.0,
                user="u",
                min_tasks=1,
                max_tasks=999,
                tasks=tasks,
                started_at=0.0,
            )
            assert converters.decode_fact(converters.encode_fact(fact)) == fact


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 9), st.integers(1, 120)), min_size=1, max_size=40))
def test_the_kept_encodings_stay_within_their_budget(uses: list[tuple[int, int]]) -> None:
    """Tuples encoded again and again, new ones pushing the oldest out: every answer
    is the plain encoding, and the kept tuples never hold more tasks than the budget."""
    import orjson

    memo = converters._EncodedTasks(budget=300, small=4)
    made: dict[int, tuple[Task, ...]] = {}
    for key, n in uses:
        tasks = made.setdefault(key, tuple(Task(k, f"h{(k + key) % 7}") for k in range(n)))
        assert orjson.dumps(memo(tasks)) == orjson.dumps([[t.id, t.host] for t in tasks])
        assert memo._keep.tasks == sum(len(t) for _, (t, _) in memo._keep.items.values()) <= 300


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.integers(0, 3), min_size=30, max_size=300),
    st.lists(
        st.tuples(st.integers(0, 299), st.integers(1, 200), st.integers(0, 3), st.booleans()),
        max_size=8,
    ),
    st.booleans(),
)
def test_bulk_changes_agree_with_a_plain_map(
    initial: list[int],
    runs: list[tuple[int, int, int, bool]],
    in_draft: bool,
) -> None:
    """Changes of many hosts at once (``set_many``, ``take`` of what ``place`` gave: the
    bulk paths, run by run or scattered, across words, in a draft of a draft) leave the
    same counts, bitmap and placements as the host-by-host model."""
    names = [f"h{i:03d}" for i in range(len(initial))]
    slots = FreeSlots(names, initial)
    if in_draft:
        slots = slots.draft().draft()
    model = dict(zip(names, initial, strict=True))
    for start, length, value, scattered in runs:
        chosen = names[start % len(names) :: 2 if scattered else 1][:length]
        slots.set_many([(h, value) for h in chosen])
        model.update(dict.fromkeys(chosen, value))
        _agrees(slots, model, None)
        want = sum(model.values()) // 3 + 1
        placed = slots.place(1, want, None)
        if placed is not None:
            slots.take(placed)
            for h, n in placed:
                model[h] -= n
            _agrees(slots, model, 2)


def test_task_records_are_made_on_first_use() -> None:
    """A started job's task records stand for RUNNING records without being made; ended
    before any was made, they all read EXITED with the reason; made on first use, they
    are ordinary records, and the end hands them to the caller to mark."""
    from xce_resize_plugin.controllers.task_records import TaskRecord, TaskState, TaskStates

    tasks = (Task(0, "a"), Task(1, "b"))
    untouched = TaskStates(tasks, TaskState.RUNNING, 5.0)
    assert len(untouched) == 2
    live = (TaskState.RUNNING,)
    assert list(untouched.exit_live(9.0, "job ended", live)) == []
    assert dict(untouched) == {
        0: TaskRecord("a", TaskState.EXITED, 9.0, reason="job ended"),
        1: TaskRecord("b", TaskState.EXITED, 9.0, reason="job ended"),
    }
    # Made now: all of them go to the caller's loop.
    assert len(list(untouched.exit_live(10.0, "again", live))) == 2
    used = TaskStates(tasks, TaskState.RUNNING, 5.0)
    used[1].state = TaskState.STOPPING
    assert used.get(1) == TaskRecord("b", TaskState.STOPPING, 5.0)
    assert list(used.exit_live(9.0, "job ended", live)) == [used[1]]
    assert used == {0: TaskRecord("a", TaskState.EXITED, 9.0, reason="job ended"), 1: used[1]}


_record_ops = st.lists(
    st.tuples(
        st.sampled_from(["get", "set", "stop", "contains", "len", "end", "all"]),
        st.integers(-1, 12),
    ),
    max_size=25,
)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 8), st.booleans(), _record_ops)
def test_task_records_behave_as_the_dict_they_stand_for(
    n: int, in_order: bool, ops: list[tuple[str, int]]
) -> None:
    """Reads, changes, added tasks, membership, length and the job's end, on the start
    tasks as a task list in id order (read by index) or as a plain tuple (read by id),
    leave the records a plain dict of records would hold."""
    from xce_resize_plugin.controllers.lazy import TaskList
    from xce_resize_plugin.controllers.placement_runs import Placement
    from xce_resize_plugin.controllers.task_records import TaskRecord, TaskState, TaskStates

    hosts = [f"h{i % 3}" for i in range(n)]
    placement = Placement([(h, 1) for h in hosts])
    start = TaskList(placement) if in_order else tuple(reversed(tuple(TaskList(placement))))
    lazy = TaskStates(start, TaskState.RUNNING, 1.0)
    model = {t.id: TaskRecord(t.host, TaskState.RUNNING, 1.0) for t in start}
    live = (TaskState.STARTING, TaskState.RUNNING, TaskState.STOPPING)
    for step, (op, tid) in enumerate(ops):
        now = 2.0 + step
        if op == "get":
            assert lazy.get(tid) == model.get(tid)
        elif op == "set":
            rec = TaskRecord("new", TaskState.STARTING, now)
            lazy[tid], model[tid] = rec, TaskRecord("new", TaskState.STARTING, now)
        elif op == "stop" and tid in model:
            lazy[tid].state = model[tid].state = TaskState.STOPPING
        elif op == "contains":
            assert (tid in lazy) == (tid in model)
        elif op == "len":
            assert len(lazy) == len(model)
        elif op == "end":
            for rec in lazy.exit_live(now, "end", live):
                if rec.state in live:
                    rec.state, rec.since, rec.reason = TaskState.EXITED, now, "end"
            for rec in model.values():
                if rec.state in live:
                    rec.state, rec.since, rec.reason = TaskState.EXITED, now, "end"
        elif op == "all":
            assert list(lazy.items()) == list(model.items())
    assert len(lazy) == len(model)
    assert dict(lazy) == model


# Task ids: any (unknown, repeated), or distinct ids of the first tasks (what a
# release gives), which a group takes when nothing else holds them.
_some_ids = st.one_of(
    st.lists(st.integers(-1, 9), max_size=6),
    st.lists(st.integers(0, 3), min_size=1, max_size=4, unique=True),
)
_group_ops = st.lists(
    st.one_of(
        st.tuples(st.just("stop"), _some_ids),
        st.tuples(st.just("exit_last"), st.just([])),
        st.tuples(
            st.sampled_from(["exit", "get", "set"]), st.lists(st.integers(-1, 9), max_size=3)
        ),
        # One of the last group's tasks read or replaced on its own; the job's end.
        st.tuples(st.sampled_from(["get_last", "set_last", "end", "all"]), st.just([])),
    ),
    max_size=20,
)


@settings(max_examples=500, deadline=None)
@given(st.integers(1, 8) | st.integers(4, 8), st.booleans(), _group_ops)
def test_tasks_stopped_and_exited_as_a_group_read_as_records_changed_one_by_one(
    n: int, in_order: bool, ops: list[tuple[str, list[int]]]
) -> None:
    """Stops and exits of many start tasks at once, kept as one group
    (``stop_group``, ``exit_group``), leave the records a plain dict holds when each
    task's record is changed as the simulated host changes it; what a group does not
    take (a task with a record of its own, in another group, unknown, given twice, in
    a state that cannot stop, or not exactly a group's tasks) it refuses, changing
    nothing, and the one-by-one change then applies. Single reads and writes of a
    task in a group and the job's end come in between."""
    from xce_resize_plugin.controllers.lazy import TaskList
    from xce_resize_plugin.controllers.placement_runs import Placement
    from xce_resize_plugin.controllers.sim.state import STOPPABLE
    from xce_resize_plugin.controllers.task_records import (
        LIVE_STATES,
        TaskRecord,
        TaskState,
        TaskStates,
    )

    hosts = [f"h{i % 3}" for i in range(n)]
    placement = Placement([(h, 1) for h in hosts])
    start = TaskList(placement) if in_order else tuple(reversed(tuple(TaskList(placement))))
    lazy = TaskStates(start, TaskState.RUNNING, 1.0)
    model = {t.id: TaskRecord(t.host, TaskState.RUNNING, 1.0) for t in start}
    last_stopped: list[int] = []

    def stop_each(records: Any, ids: list[int], now: float) -> None:
        for tid in ids:  # as HostContract.stop_tasks does
            rec = records.get(tid)
            if rec is not None and rec.state in STOPPABLE:
                rec.state, rec.stop_since, rec.grace = TaskState.STOPPING, now, 3.0

    def exit_each(records: Any, ids: list[int], now: float) -> list[bool]:
        stopped = []
        for tid in ids:  # as HostContract.tasks_exited does
            rec = records.get(tid)
            if rec is None or rec.state not in LIVE_STATES:
                continue
            stopped.append(rec.state is TaskState.STOPPING)
            rec.state, rec.since, rec.status, rec.reason = TaskState.EXITED, now, 9, "gone"
            rec.stop_since = rec.grace = None
        return stopped

    for step, (op, ids) in enumerate(ops):
        now = 2.0 + step
        if op.endswith("_last"):
            op, ids = op[: -len("_last")], last_stopped if op == "exit_last" else last_stopped[:1]
        if op == "stop":
            before = copy.deepcopy(lazy)
            if lazy.stop_group(ids, now, 3.0, STOPPABLE):
                assert len(set(ids)) == len(ids)
                assert all(model[t].state in STOPPABLE for t in ids)
                last_stopped = list(ids)
            else:
                assert dict(copy.deepcopy(lazy)) == dict(before)  # lazy stays lazy
                stop_each(lazy, ids, now)
            stop_each(model, ids, now)
        elif op == "exit":
            before = copy.deepcopy(lazy)
            stopped = lazy.exit_group(ids, now, 9, "gone")
            if stopped is None:
                assert dict(copy.deepcopy(lazy)) == dict(before)  # lazy stays lazy
                exit_each(lazy, ids, now)
                exit_each(model, ids, now)
            else:
                # One run of alike tasks: each of them was alive, all stopping or not.
                assert exit_each(model, ids, now) == [stopped] * len(ids)
        elif op == "get":
            for tid in ids:
                assert lazy.get(tid) == model.get(tid)
        elif op == "set":
            for tid in ids:
                lazy[tid] = TaskRecord("new", TaskState.STARTING, now)
                model[tid] = TaskRecord("new", TaskState.STARTING, now)
        elif op == "end":
            for rec in lazy.exit_live(now, "end", LIVE_STATES):
                if rec.state in LIVE_STATES:
                    rec.state, rec.since, rec.reason = TaskState.EXITED, now, "end"
                    rec.stop_since = rec.grace = None
            for rec in model.values():
                if rec.state in LIVE_STATES:
                    rec.state, rec.since, rec.reason = TaskState.EXITED, now, "end"
                    rec.stop_since = rec.grace = None
        elif op == "all":
            assert list(lazy.items()) == list(model.items())
        assert len(lazy) == len(model)
    assert dict(lazy) == model


_ops = st.lists(
    st.one_of(
        st.tuples(
            st.just("start"),
            st.integers(1, 4),
            st.lists(
                st.tuples(st.sampled_from(["a", "b", "c", "zz"]), st.integers(0, 3)),
                min_size=1,
                max_size=3,
                unique_by=lambda p: p[0],
            ),
        ),
        st.tuples(st.just("end"), st.integers(1, 4), st.just([])),
        st.tuples(st.just("close"), st.sampled_from(["a", "b", "c"]), st.just([])),
    ),
    max_size=30,
)


@settings(max_examples=150, deadline=None)
@given(_ops)
def test_allocate_and_release_all_agree_with_reserve_and_free(ops: list[Any]) -> None:
    """One host or several, closed hosts, a user's limit: the bulk start and end
    (one host each has a path of its own) leave the ledger the per-task ones leave."""
    from xce_resize_plugin.controllers.sim import ContractViolation

    hosts = [("a", 3), ("b", 2), ("c", 1)]
    bulk, plain = Cluster(hosts, user_slots={"u2": 3}), Cluster(hosts, user_slots={"u2": 3})
    for c in (bulk, plain):
        for k in range(1, 5):
            c.register_job(str(k), f"u{k % 3}")
    for op, arg, placement in ops:
        if op == "close":
            for c in (bulk, plain):
                c.set_closed(arg, not c.is_closed(arg))
            continue
        job = str(arg)
        if op == "end":
            assert bulk.release_all(job) == plain.free_job(job)
            continue
        refused = []
        try:
            tasks = bulk.allocate(job, tuple(placement))
        except ContractViolation:
            refused.append("bulk")
        names = [h for h, n in placement for _ in range(n)]
        try:
            if plain.held(job) or not all(n >= 1 for _, n in placement):
                raise ContractViolation("refused as allocate refuses")
            plain.reserve(job, [Task(i, h) for i, h in enumerate(names)])
        except ContractViolation:
            refused.append("plain")
        assert refused in ([], ["bulk", "plain"])
        if not refused:
            assert tasks == tuple(Task(i, h) for i, h in enumerate(names))
        assert bulk.free_slots() == plain.free_slots()
        assert list(bulk.open_slots()) == list(plain.open_slots())
        assert bulk.held(job) == plain.held(job)
        assert bulk.job_host_counts(job) == plain.job_host_counts(job)
        assert bulk.users_in_use() == plain.users_in_use()
        assert bulk.check() == plain.check() == []


def test_allocate_on_one_host_refuses_with_the_messages_of_many() -> None:
    import pytest

    from xce_resize_plugin.controllers.sim import ContractViolation

    c = Cluster([("a", 2), ("b", 2)], user_slots={"u": 1})
    c.register_job("1", "u")
    c.register_job("2", "v")
    c.set_closed("b", True)
    for placement, message in (
        ((("zz", 1),), "job 2: unknown host 'zz'"),
        ((("b", 1),), "job 2: b is closed: no new tasks"),
        ((("a", 0),), r"job 2: 0 slot\(s\) on a exceed its 2 slots \(0 in use\)"),
        ((("a", 3),), r"job 2: 3 slot\(s\) on a exceed its 2 slots \(0 in use\)"),
    ):
        with pytest.raises(ContractViolation, match=f"^{message}$"):
            c.allocate("2", placement)
    with pytest.raises(ContractViolation, match=r"^job 1: 2 slot\(s\) exceed user u's limit of 1$"):
        c.allocate("1", (("a", 2),))
    assert c.held("1") == c.held("2") == {} and c.check() == []


class _OneByOne:
    """A task runner without ``stop_many``: the controller stops task by task."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def bind(self, reporter: Any) -> None:
        self._inner.bind(reporter)

    def start(self, job_id: str, task: Task, env: Any) -> None:
        self._inner.start(job_id, task, env)

    def stop(self, job_id: str, task_id: int, grace: float, since: float) -> None:
        self._inner.stop(job_id, task_id, grace, since)


def _task_events_seen(
    tmp: Any,
    bulk: bool,
    faults: Any,
    alloc: dict[str, int],
    times: tuple[float, ...],
    act: Any,
    runtime: float = 1000.0,
    store: str = "memory",
) -> tuple[list[tuple[Any, ...]], dict[Any, Any]]:
    """Run a job on ``alloc`` (hosts h1 and h2 of 4 and 8 slots) with a plugin that
    calls ``act(controller, job)`` at every dispatch cycle, with the simulated runner
    (``bulk``) or the same runner task by task; return the task events the plugin saw
    and the job's task states at the end."""
    from tests.conftest import make_pm
    from xce_resize_plugin import hookimpl
    from xce_resize_plugin.controllers.sim import EmbeddedController, MemoryStore, SimTaskRunner
    from xce_resize_plugin.host import Controller

    seen: list[tuple[Any, ...]] = []
    jobs: list[str] = []

    class Plugin:
        @hookimpl
        def xce_dispatch_cycle(self, controller: Controller) -> None:
            if jobs:
                act(controller, jobs[0])

        @hookimpl
        def xce_task_events(self, controller: Controller, events: list[TaskEvent]) -> None:
            seen.extend((e.task_id, e.kind, e.status, e.reason, e.stopped) for e in events)

    runner = SimTaskRunner(faults)
    ctl = EmbeddedController(
        make_pm(Plugin()),
        tmp,
        {"h1": 4, "h2": 8},
        store=MemoryStore() if store == "memory" else "none",
        task_runner=runner if bulk else _OneByOne(runner),
    )
    jobs.append(ctl.submit("u", sum(alloc.values()), runtime=runtime, alloc=alloc))
    # The records whole (state, since, status, reason, stop_since, grace), as the
    # controller keeps them, at every instant asked: reading them makes them whole, so
    # a copy is read.
    states: dict[Any, Any] = {}
    for t in times:
        ctl.run(until=t)
        records = copy.deepcopy(ctl._jobs[jobs[0]].task_states)
        states[t] = {tid: attrs.asdict(rec) for tid, rec in records.items()}
    ctl.close()
    return seen, states


def _stops_seen(
    tmp: Any,
    bulk: bool,
    stops: list[list[int]],
    delay: float,
    grace: float,
    grouped: bool = True,
    runtime: float = 1000.0,
    store: str = "memory",
) -> tuple[list[tuple[Any, ...]], dict[Any, Any]]:
    """A job of 6 tasks whose stops the plugin asks in ``stops`` (one call per list,
    at 1, 2 and 3 s); without ``grouped``, the job's task records never keep tasks
    stopped together as one group (each task gets its record, as a plain dict)."""
    from xce_resize_plugin.controllers.sim import TaskFaults
    from xce_resize_plugin.controllers.task_records import TaskStates

    if not grouped:
        with patch.object(TaskStates, "stop_group", return_value=False):
            return _stops_seen(tmp, bulk, stops, delay, grace, True, runtime, store)

    todo = list(stops)

    asked: list[float] = []

    def stop(controller: Any, job: str) -> None:
        # From 1 s on (the job started at 0: a record's "since" tells them apart), one
        # stop per instant (an instant has several cycles).
        now = controller.now()
        if todo and now >= 1.0 and (not asked or asked[-1] != now):
            asked.append(now)
            controller.stop_tasks(job, todo.pop(0), grace)

    faults = TaskFaults(stop_delay=delay)
    times = (0.0, 1.0, 2.0, 3.0, 50.0)
    alloc = {"h1": 3, "h2": 3}
    return _task_events_seen(tmp, bulk, faults, alloc, times, stop, runtime, store)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.lists(st.integers(-1, 7), max_size=8), min_size=1, max_size=3),
    st.sampled_from([0.0, 2.0, 20.0]),
    st.sampled_from([0.0, 5.0, 30.0]),
    st.sampled_from([1000.0, 10.0]),
    st.sampled_from(["memory", "none"]),
)
def test_a_stop_of_many_tasks_reports_what_stops_one_by_one_report(
    tmp_path_factory: Any,
    stops: list[list[int]],
    delay: float,
    grace: float,
    runtime: float,
    store: str,
) -> None:
    """The simulated runner reports the tasks a release stops together (one
    ``tasks_exited``), and the job's records keep them as one group: the plugin sees
    the same task events in the same order, and the tasks end in the same states, as
    when each is stopped on its own and has a record of its own; unknown ids, ids
    given twice, tasks already stopping or exited, and the job ending while they stop
    (``runtime`` 10) included; with a store (which reads every record at each save)
    and without one (as trace simulations run)."""
    args = (stops, delay, grace)
    bulk = _stops_seen(tmp_path_factory.mktemp("bulk"), True, *args, True, runtime, store)
    single = _stops_seen(tmp_path_factory.mktemp("one"), False, *args, False, runtime, store)
    assert bulk == single
    mixed = _stops_seen(tmp_path_factory.mktemp("mixed"), False, *args, True, runtime, store)
    assert mixed == single


def _starts_seen(
    tmp: Any, bulk: bool, launches: list[list[int]], fail: set[int]
) -> tuple[list[tuple[Any, ...]], dict[Any, Any]]:
    """A job of 2 tasks to which the plugin adds tasks 2..9 (reserved at once) and
    launches them as ``launches`` says (one call per list, one cycle apart; an id may
    come again or twice); the tasks ``2 + i`` for ``i`` in ``fail`` fail to start."""
    from xce_resize_plugin.controllers.sim import TaskFaults

    todo = list(launches)
    new = [Task(i, "h2") for i in range(2, 10)]
    reserved: list[bool] = []

    def launch(controller: Any, job: str) -> None:
        if not reserved:
            controller.reserve_slots(job, new)
            reserved.append(True)
        if todo:
            controller.launch_tasks(job, [new[i % 8] for i in todo.pop(0)], {"X": "1"})

    faults = TaskFaults(fail_starts={("101", 2 + i) for i in fail})
    return _task_events_seen(tmp, bulk, faults, {"h1": 2}, (0.0, 1.0, 2.0, 3.0), launch)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.lists(st.integers(0, 7), max_size=8), min_size=1, max_size=3),
    st.sets(st.integers(0, 7), max_size=2),
)
def test_a_start_of_many_tasks_reports_what_starts_one_by_one_report(
    tmp_path_factory: Any, launches: list[list[int]], fail: set[int]
) -> None:
    """The simulated runner reports the tasks a launch starts together (one
    ``tasks_started``, one run of events): the plugin sees the same task events in the
    same order, and the tasks end in the same states, as when each is started on its
    own; tasks launched again (answered from their record) and failing starts
    included."""
    bulk = _starts_seen(tmp_path_factory.mktemp("bulk"), True, launches, fail)
    single = _starts_seen(tmp_path_factory.mktemp("single"), False, launches, fail)
    assert bulk == single
    # What each task launched says, in the order launched: its start (or its failure),
    # and when launched again, what became of it.
    want = []
    for ids in launches:
        for i in ids:
            tid = 2 + i % 8
            failed = i % 8 in fail
            kind, reason = ("start_failed", "injected start failure") if failed else ("started", "")
            want.append((tid, kind, None, reason, False))
    assert bulk[0] == want


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.integers(0, 3), min_size=1, max_size=70),
    st.lists(
        st.tuples(st.integers(0, 69), st.integers(0, 69), st.booleans(), st.booleans()),
        max_size=30,
    ),
)
def test_snapshots_of_any_two_instants_compare_as_their_counts(
    initial: list[int], moves: list[tuple[int, int, bool, bool]]
) -> None:
    """A slot moved from one host to another leaves the total as it was: snapshots
    taken around such moves (sharing the counts, with the changes logged) are equal
    exactly when their counts are, whichever two are compared, and keep their counts
    however many changes come after (the log is reset once it outgrows the hosts)."""
    names = [f"h{i:03d}" for i in range(len(initial))]
    slots = FreeSlots(names, initial)
    model = dict(zip(names, initial, strict=True))
    shots = [(slots.snapshot(), _open(model))]
    for a, b, bulk, shoot in moves:
        src, dst = names[a % len(names)], names[b % len(names)]
        if src == dst or not model[src]:
            continue
        model[src] -= 1
        model[dst] += 1
        pairs = [(src, model[src]), (dst, model[dst])]
        if bulk:  # the bulk path: many hosts at once, most set to what they hold
            pairs += [(h, model[h]) for h in names if h not in (src, dst)][:30]
        slots.set_many(pairs)
        if shoot:
            shots.append((slots.snapshot(), _open(model)))
    for (x, x_model), (y, y_model) in combinations(shots, 2):
        assert (x == y) == (x_model == y_model)
    for snap, expected in shots:
        assert dict(snap) == expected and len(snap) == len(expected)


def test_a_snapshot_kept_alive_does_not_make_the_log_outgrow_the_hosts() -> None:
    """The log that snapshots share never holds more positions than there are hosts:
    past that, the live snapshots are made copies (and keep their counts)."""
    names = [f"h{i:03d}" for i in range(10)]
    slots = FreeSlots(names, [2] * 10)
    kept = slots.snapshot()
    for k in range(60):
        slots.set(names[k % 10], k % 3)
        assert slots._log is None or slots._logged_n <= len(names)
    assert dict(kept) == dict.fromkeys(names, 2)
    assert slots._log is None  # nothing shares the counts any more


def _resize_life(job: JobInfo, steps: list[tuple[str, int]]) -> list[Any]:
    """What the plugin decides, does and journals over releases and grows of ``job``
    (each release of the newest ``k`` tasks, of ``k`` by count, or of a task in the
    middle; each grow of ``k`` tasks on new hosts), the host answering at once."""
    policy = HookPolicy(get_plugin_manager(entry_points=False))
    settings_ = engine.Settings()
    seen: list[Any] = []
    state: ResizeState | None = None
    at = 0.0

    def apply(facts: list[Any]) -> list[Any]:
        nonlocal state
        state, effects = engine.transition(state, facts)
        assert state is not None
        seen.extend([facts, effects, converters.encode_state(state)])
        return effects

    for kind, k in steps:
        at += 1.0
        tasks = state.tasks if state is not None else job.tasks
        n = len(tasks)
        if kind == "grow":
            if n + k > job.max_tasks:
                continue
            apply(
                engine.decide_request(state, job, OWNER, GrowRequest(k, k), at, policy, settings_)
            )
            assert state is not None
            view = grow_host_view({f"new{at:.0f}-{i}": 1 for i in range(k)}, {})
            apply(engine.decide_placement(state, job, view, None, policy, at))
        else:
            k = min(k, n - 1)
            if k < 1:
                continue
            if kind == "newest":
                # The newest k (a slice: the host's list itself is not read).
                req = ReleaseRequest(task_ids=tuple(t.id for t in tasks[n - k :]))
            elif kind == "count":
                req = ReleaseRequest(count=k)
            else:
                req = ReleaseRequest(task_ids=(list(tasks)[n // 2].id,))
            apply(engine.decide_request(state, job, OWNER, req, at, policy, settings_))
        assert state is not None
        effects = apply(engine.decide_dispatch(state, at))
        change = state.change
        assert change is not None
        kind_of = "started" if kind == "grow" else "exited"
        events = [
            TaskEvent(job.id, t.id, kind_of, 0 if kind_of == "exited" else None, "", kind != "grow")
            for t in change.tasks
        ]
        seen.append(effects)
        apply(engine.decide_task_events(state, events, at, settings_))
        assert state is not None and state.change is None
    return seen


@settings(max_examples=60, deadline=None)
@given(
    st.integers(2, 300),
    st.lists(
        st.tuples(
            st.sampled_from(["newest", "newest", "count", "middle", "grow"]), st.integers(1, 80)
        ),
        max_size=6,
    ),
)
def test_a_job_given_as_the_hosts_list_is_resized_as_its_tuple(
    size: int, steps: list[tuple[str, int]]
) -> None:
    """A job whose tasks are the host's lazy list in id order: the plugin decides the
    same facts and effects and journals the same bytes as for the tuple, at every step;
    a job only ever released by its newest tasks keeps the host's list unmade."""
    names = [f"h{i:03d}" for i in range(size)]
    cluster = Cluster([(h, 1) for h in names])
    cluster.register_job("7", "alice")
    placed = cluster.free_counts().place(size, size, None)
    assert placed is not None
    listed = cluster.allocate("7", placed)
    assert isinstance(listed, TaskList)
    lazy = make_job({}, tasks=listed, max_tasks=400, start_time=0.0)
    plain = make_job({}, tasks=tuple(TaskList(placed)), max_tasks=400, start_time=0.0)
    seen = _resize_life(lazy, steps)
    if all(kind == "newest" for kind, _ in steps):
        assert listed._tasks is None  # (compared below, it is made)
    assert seen == _resize_life(plain, steps)
