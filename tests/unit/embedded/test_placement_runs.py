"""Placements held as runs of hosts decide and charge exactly what their pairs do.

A job placed on many hosts is taken, charged, counted and freed a run of alike hosts at
a time (docs/performance.md, "Allocations as runs of hosts"); every step has a
host-by-host path it must agree with: the free-slot view's ``take``, the cluster's
``allocate``/``release_all``/``free``, the simulation's ledger check, and the job's
task list.
"""

from __future__ import annotations

import pickle
from itertools import pairwise

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from xce_resize_plugin.controllers.lazy import TaskList, Unfolded
from xce_resize_plugin.controllers.placement_runs import Placement
from xce_resize_plugin.controllers.sim import Cluster
from xce_resize_plugin.controllers.slots import FreeSlots
from xce_resize_plugin.core.models import JobInfo, JobState, Task, TasksInIdOrder
from xce_resize_plugin.simulation.checks import LedgerCheck


def _blocks(low: int) -> st.SearchStrategy[list[int]]:
    """Per-host values in stretches of alike hosts (some longer than a word of the
    free-slot bitmap, so runs cover whole words)."""
    blocks = st.lists(st.tuples(st.integers(low, 3), st.integers(1, 200)), min_size=1, max_size=5)
    return blocks.map(lambda bs: [v for v, n in bs for _ in range(n)])


ops = st.lists(
    st.tuples(
        st.sampled_from(["start", "start", "start", "end", "free", "shrink", "down", "up"]),
        st.integers(0, 10**6),
        st.integers(1, 700),
        st.one_of(st.none(), st.integers(1, 3)),
    ),
    max_size=30,
)


@settings(max_examples=150, deadline=None)
@given(_blocks(1), ops)
def test_runs_and_pairs_keep_the_same_ledger(slots: list[int], steps: list) -> None:  # type: ignore[type-arg]
    """Two clusters take the same placements, one as runs, one as pairs: after every
    start, end, partial release (of any tasks, or of the newest: then the rest stays
    runs) and host failure they hold, count and offer the same; a view of a job's
    hosts taken before a release shows it after."""
    hosts = [(f"h{i:03d}", n) for i, n in enumerate(slots)]
    by_runs, by_pairs = Cluster(hosts), Cluster(hosts)
    jobs: list[str] = []
    for k, (op, pick, size, ptile) in enumerate(steps):
        if op == "start":
            placed = by_runs.free_counts().place(1, size, ptile)
            assert placed == by_pairs.free_counts().place(1, size, ptile)
            if placed is None:
                continue
            job = f"j{k}"
            for cluster in (by_runs, by_pairs):
                cluster.register_job(job, "u")
            tasks = by_runs.allocate(job, placed)
            assert tasks == by_pairs.allocate(job, placed.pairs())
            assert len(tasks) == placed.total and tasks[0] == Task(0, placed[0][0])
            jobs.append(job)
        elif op == "end" and jobs:
            job = jobs.pop(pick % len(jobs))
            assert by_runs.release_all(job) == by_pairs.release_all(job)
        elif op == "free" and jobs:
            job = jobs[pick % len(jobs)]
            ids = list(range(1, 1 + size % by_runs.held_count(job)))
            assert by_runs.free(job, ids) == by_pairs.free(job, ids)
        elif op == "shrink" and jobs:
            job = jobs[pick % len(jobs)]
            n = by_runs.held_count(job)
            if n < 2:
                continue
            newest = list(range(n - 1 - size % (n - 1), n))
            newest.reverse()  # in any order
            view = by_runs.job_hosts(job)
            assert by_runs.free(job, newest) == by_pairs.free(job, newest)
            assert dict(view) == by_pairs.job_host_counts(job)
        elif op in ("down", "up"):
            host = hosts[pick % len(hosts)][0]
            for cluster in (by_runs, by_pairs):
                cluster.set_down(host, op == "down")
        assert by_runs.free_slots() == by_pairs.free_slots()
        assert [by_runs.used(h) for h, _ in hosts] == [by_pairs.used(h) for h, _ in hosts]
        for job in jobs:
            assert by_runs.held(job) == by_pairs.held(job)
            assert by_runs.job_host_counts(job) == by_pairs.job_host_counts(job)
            _same_not_held(by_runs, by_pairs, job, pick, hosts[size % len(hosts)][0])
        assert by_runs.check() == [] == by_pairs.check()


def _same_not_held(a: Cluster, b: Cluster, job: str, pick: int, other: str) -> None:
    """``not_held`` of a job's first tasks in id order, of them with one task moved to
    ``other`` and of them with one missing, the same on both clusters."""
    tasks = [Task(i, h) for i, h in sorted(b.held(job).items())]
    listed = a.as_held(job, tasks)
    assert listed is None or (isinstance(listed, TaskList) and listed == tuple(tasks))
    assert b.as_held(job, tasks) is None  # held task by task: nothing to list as runs
    if len(tasks) > 1:
        assert a.as_held(job, tasks[:-1]) is None  # not all it holds
    first = tasks[: 1 + pick % len(tasks)]
    assert a.not_held(job, first) is None is b.not_held(job, first)
    k = pick % len(first)
    moved = [*first[:k], Task(first[k].id, other), *first[k + 1 :]]
    expected = None if other == first[k].host else moved[k]
    assert a.not_held(job, moved) == expected == b.not_held(job, moved)
    gap = first[:k] + first[k + 1 :] + [Task(tasks[-1].id + 1, first[k].host)]  # not held
    assert a.not_held(job, gap) == gap[-1] == b.not_held(job, gap)


@settings(max_examples=150, deadline=None)
@given(
    _blocks(0),
    st.lists(st.tuples(st.integers(1, 600), st.one_of(st.none(), st.integers(1, 2))), max_size=6),
    st.booleans(),
)
def test_taking_runs_and_pairs_leaves_the_same_counts(
    initial: list[int], wants: list[tuple[int, int | None]], in_draft: bool
) -> None:
    """``take`` of a placement as runs (the slice path) and as pairs (host by host),
    in the view itself or in a draft, leave the same counts, classes and bitmap; a
    draft's takes never reach its parent. Snapshots taken on the way (which share the
    counts and log what changes after them) keep their instant's counts, and compare
    equal exactly when those are equal."""
    names = [f"h{i:03d}" for i in range(len(initial))]
    parent_runs, by_pairs = FreeSlots(names, initial), FreeSlots(names, initial)
    by_runs = parent_runs.draft() if in_draft else parent_runs
    shots = [(by_runs.snapshot(), by_pairs.snapshot(), _open_of(by_pairs))]
    for want, ptile in wants:
        placed = by_runs.place(1, want, ptile)
        assert placed == by_pairs.place(1, want, ptile)
        if placed is None:
            continue
        assert placed.runs is not None and placed.total == sum(n for _, n in placed)
        assert placed.host_count() == len(placed.pairs()) == len(set(placed.hosts()))
        by_runs.take(placed)
        by_pairs.take(placed.pairs())
        assert by_runs.problems() == by_pairs.problems() == []
        assert by_runs.as_dict() == by_pairs.as_dict()
        assert list(by_runs.open_hosts()) == list(by_pairs.open_hosts())
        assert by_runs.capacity(2) == by_pairs.capacity(2)
        shots.append((by_runs.snapshot(), by_pairs.snapshot(), _open_of(by_pairs)))
    if in_draft:
        assert parent_runs.as_dict() == dict(zip(names, initial, strict=True))
    for (a_runs, a_pairs, a_model), (b_runs, b_pairs, b_model) in pairwise(shots):
        assert (a_runs == b_runs) == (a_pairs == b_pairs) == (a_model == b_model)
    for snap_runs, snap_pairs, model in shots:
        assert dict(snap_runs) == dict(snap_pairs) == model
        assert snap_runs == snap_pairs == model


def _open_of(free: FreeSlots) -> dict[str, int]:
    """The hosts with free slots, as a snapshot lists them."""
    return {h: n for h, n in free.as_dict().items() if n}


def test_a_placement_of_alike_hosts_is_one_run() -> None:
    """Hosts with the same free slots in a row are one run, across the bitmap's words;
    a placement equals the tuple of its pairs either way round."""
    names = [f"h{i:03d}" for i in range(300)]
    free = FreeSlots(names, [1] * 300)
    placed = free.place(200, 200, None)
    assert placed is not None
    assert placed.runs == ((0, 200, 1),)
    assert placed == tuple((h, 1) for h in names[:200]) == placed
    assert hash(placed) == hash(placed.pairs())
    free.take(placed)
    again = free.place(50, 50, None)
    assert again is not None and again.runs == ((200, 50, 1),)
    assert Placement([("a", 2), ("b", 1)]).total == 3


def test_a_task_list_is_its_tuple() -> None:
    """A job's lazily made tasks: length and task 0 without making the others, equal
    to and hashed as the tuple, and carried as such by the plugin's job view."""
    free = FreeSlots(["a", "b", "c"], [2, 2, 2])
    placed = free.place(5, 5, None)
    assert placed is not None
    tasks = TaskList(placed)
    assert len(tasks) == 5 and tasks[0] == Task(0, "a")
    want = (Task(0, "a"), Task(1, "a"), Task(2, "b"), Task(3, "b"), Task(4, "c"))
    assert tasks == want and want == tasks and hash(tasks) == hash(want)
    assert list(tasks) == list(want) and tasks[-1] == Task(4, "c")
    info = JobInfo("1", "u", JobState.RUN, 5, 5, tasks)
    assert info.first_host == "a" and tuple(info.tasks) == want


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.integers(0, 3), min_size=1, max_size=150),
    st.integers(1, 200),
    st.integers(0, 250),
    st.booleans(),
)
def test_a_task_list_reads_any_task_and_its_tail_without_being_made(
    slots: list[int], want: int, first: int, made: bool
) -> None:
    """Any one task (from either end), a tail slice, the tasks from the end and
    ``task_host`` read from the runs are those of the tuple, whether or not the tuple
    was made first; a tail slice is a task list again, in id order."""
    names = [f"h{i:03d}" for i in range(len(slots))]
    placed = FreeSlots(names, slots).place(1, want, None)
    if placed is None:
        return
    tasks = TaskList(placed)
    plain = tuple(Task(i, h) for i, h in enumerate(placed.task_hosts()))
    by_pairs = Placement(placed.pairs())
    if made:
        tasks.as_tuple()
    n = len(plain)
    assert len(tasks) == n and isinstance(tasks, TasksInIdOrder)
    for k in {0, n - 1, n // 2, first % n}:
        assert tasks[k] == plain[k] and tasks[k - n] == plain[k - n]
        assert placed.task_host(k) == by_pairs.task_host(k) == plain[k].host
    assert list(reversed(tasks)) == list(reversed(plain))
    assert list(placed.task_hosts_reversed()) == [t.host for t in reversed(plain)]
    tail = tasks[first:]
    assert tail == plain[first:] and list(reversed(tail)) == list(reversed(plain[first:]))
    if 0 < first < n and not made:
        assert isinstance(tail, TaskList) and tail[0] == plain[first]
    with pytest.raises(IndexError):
        tasks[n]
    with pytest.raises(IndexError):
        placed.task_host(n)


def test_an_unfolded_map_is_made_once_and_stays_the_same_object() -> None:
    made: list[int] = []

    def make() -> dict[str, int]:
        made.append(1)
        return {"a": 1, "b": 2}

    hosts: Unfolded[str, int] = Unfolded(make, 2)
    assert len(hosts) == 2 and hosts.folded and made == []
    hosts["a"] -= 1
    assert hosts == {"a": 0, "b": 2} and not hosts.folded and made == [1]
    del hosts["a"]
    assert dict(hosts) == {"b": 2} and len(hosts) == 1 and made == [1]
    hosts.clear()
    assert len(hosts) == 0 and dict(hosts) == {}


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(1, 2), min_size=1, max_size=200), st.lists(st.integers(1, 150)))
def test_the_ledger_check_counts_runs_as_it_counts_tasks(
    slots: list[int], sizes: list[int]
) -> None:
    """The simulation's ledger check: a start given as a task list of runs and the same
    tasks as a tuple count the same per host, and an overbooking found either way is a
    problem naming the host; so does a shrink's commit of a job's first tasks."""
    hosts = {f"h{i:03d}": n for i, n in enumerate(slots)}
    free = FreeSlots(list(hosts), list(hosts.values()))
    by_runs, by_tasks = LedgerCheck(hosts), LedgerCheck(hosts)
    held = dict.fromkeys(hosts, 0)
    started = []
    for k, size in enumerate(sizes):
        placed = free.place(1, size, None)
        if placed is None:
            break
        for host, n in placed:
            held[host] += n
        by_runs.job_started(f"j{k}", 0.0, TaskList(placed))
        by_tasks.job_started(f"j{k}", 0.0, tuple(TaskList(placed)))
        assert [by_runs.used(h) for h in hosts] == [by_tasks.used(h) for h in hosts]
        started.append(placed)
    # Nothing is taken from ``free``: the starts after the first may overbook hosts,
    # found either way.
    assert by_runs.problems == by_tasks.problems
    assert [by_runs.used(h) for h in hosts] == list(held.values())
    assert bool(by_runs.problems) == any(held[h] > hosts[h] for h in hosts)
    for k, placed in enumerate(started):
        kept, _ = placed.split(max(1, placed.total * 2 // 3))
        by_runs.allocation_committed(f"j{k}", 1.0, TaskList(kept), 2)
        by_tasks.allocation_committed(f"j{k}", 1.0, tuple(TaskList(kept)), 2)
        assert [by_runs.used(h) for h in hosts] == [by_tasks.used(h) for h in hosts]
        assert by_runs.total == by_tasks.total


def test_a_snapshot_of_free_slots_stays_as_it_was() -> None:
    """The blocked head's free slots: the hosts with free slots as of the snapshot,
    unchanged by later takes; two snapshots are equal when their counts are."""
    names = [f"h{i:03d}" for i in range(130)]
    free = FreeSlots(names, [i % 3 for i in range(130)])
    before = free.snapshot()
    assert dict(before) == dict(free.open_hosts()) and len(before) == len(dict(before))
    assert before.get("h000", 0) == 0 and before["h001"] == 1 and "h000" not in before
    assert before == free.snapshot() == dict(free.open_hosts())
    placed = free.place(100, 100, None)
    assert placed is not None
    free.take(placed)
    assert before != free.snapshot() and dict(free.snapshot()) == dict(free.open_hosts())
    assert before["h001"] == 1 and free.free("h001") == 0


def test_placements_and_task_lists_pickle_as_what_they_stand_for() -> None:
    """Sent to another process (a sweep's worker, a pickle), a placement is its pairs
    and a task list its tuple, without the cluster's host names they refer to."""
    names = [f"h{i:05d}" for i in range(5000)]
    placed = FreeSlots(names, [1] * 5000).place(3, 3, None)
    assert placed is not None
    tasks = TaskList(placed)
    for obj, want in ((placed, placed.pairs()), (tasks, tasks.as_tuple())):
        data = pickle.dumps(obj)
        assert pickle.loads(data) == want and len(data) < 500
    assert type(pickle.loads(pickle.dumps(tasks))) is tuple


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.integers(1, 3), min_size=1, max_size=40),
    st.integers(1, 60),
    st.integers(1, 30),
    st.sampled_from([None, 1, 2]),
    st.dictionaries(st.sampled_from(["h000", "h001", "h005", "zz"]), st.integers(0, 2)),
)
def test_reclaim_reads_a_lazy_task_list_as_its_tuple(
    slots: list[int], minimum: int, need: int, ptile: int | None, free: dict[str, int]
) -> None:
    """The reclaim decision on a job's own lazy task list (read from its end) is the
    decision on the same tasks as a tuple: the selection, the slots it frees, and
    what the rules accept or refuse."""
    from xce_resize_plugin.core.reclaim import (
        ReclaimCandidate,
        ReclaimHead,
        check_selection,
        default_selection,
        freed_by,
    )
    from xce_resize_plugin.errors import PolicyRejected

    names = [f"h{i:03d}" for i in range(len(slots))]
    placed = FreeSlots(names, slots).place(1, sum(slots), None)
    assert placed is not None
    tasks = TaskList(placed)
    job = JobInfo("1", "u", JobState.RUN, min(minimum, len(tasks)), 999, tasks)
    excess = len(tasks) - job.min_tasks
    lazy = ReclaimCandidate(job, tasks[1:], excess)
    plain = ReclaimCandidate(job, tuple(tasks)[1:], excess)
    head = ReclaimHead(JobInfo("9", "u", JobState.PEND, need, need), need, ptile, free)
    chosen = default_selection(head, [lazy])
    assert chosen == default_selection(head, [plain])
    assert freed_by(chosen, [lazy]) == freed_by(chosen, [plain])
    check_selection(chosen, [lazy])
    for bad in ([0], [len(tasks)], [1, 1]):
        with pytest.raises(PolicyRejected):
            check_selection({"1": bad}, [lazy])


@settings(max_examples=150, deadline=None)
@given(_blocks(0), st.integers(1, 600), st.one_of(st.none(), st.integers(1, 3)), st.data())
def test_a_placement_splits_into_its_first_tasks_and_the_rest(
    initial: list[int], want: int, ptile: int | None, data: st.DataObject
) -> None:
    """``split(m)``: the first ``m`` tasks' hosts as a placement of runs, and runs of
    the others, together the placement's tasks in order."""
    names = [f"h{i:03d}" for i in range(len(initial))]
    placed = FreeSlots(names, initial).place(1, want, ptile)
    if placed is None:
        return
    m = data.draw(st.integers(0, placed.total))
    head, tail = placed.split(m)
    every = list(placed.task_hosts())
    assert every == [h for h, n in placed.pairs() for _ in range(n)]
    assert head.total == m and list(head.task_hosts()) == every[:m]
    rest = Placement.of_runs(names, tail)
    assert rest.total == placed.total - m and list(rest.task_hosts()) == every[m:]


def _a_job_on_runs() -> tuple[list[str], Cluster, TaskList]:
    """A cluster of 300 one-slot hosts and job ``j`` started on its first 200."""
    names = [f"h{i:03d}" for i in range(300)]
    cluster = Cluster([(h, 1) for h in names])
    cluster.register_job("j", "u")
    placed = cluster.free_counts().place(1, 200, None)
    assert placed is not None
    started = cluster.allocate("j", placed)
    assert isinstance(started, TaskList)
    return names, cluster, started


def test_a_job_shrunk_by_its_newest_tasks_is_listed_and_ended_as_runs() -> None:
    """A job started on runs and shrunk by its newest tasks: the cluster lists what it
    holds as a task list of runs (what a commit then keeps), and its end frees runs."""
    names, cluster, _ = _a_job_on_runs()
    assert cluster.free("j", list(range(150, 200))) == 50
    kept = [Task(i, names[i]) for i in range(150)]
    listed = cluster.as_held("j", kept)
    assert isinstance(listed, TaskList) and listed == tuple(kept)
    assert listed.placement.runs == ((0, 150, 1),)
    assert cluster.as_held("j", listed) is listed
    assert cluster.as_held("j", [*kept[:-1], Task(149, names[151])]) is None
    assert cluster.release_all("j") == 150 and cluster.free_total == 300
    assert cluster.check() == []


@settings(max_examples=150, deadline=None)
@given(_blocks(0), st.integers(1, 400), st.one_of(st.none(), st.integers(1, 3)), st.data())
def test_any_slice_of_a_task_list_is_that_of_its_tuple(
    initial: list[int], want: int, ptile: int | None, data: st.DataObject
) -> None:
    """Slices (of the list, and of its tail slices) read as the tuple's; a slice of
    consecutive tasks of a placement of runs is a task list again (the plugin keeps a
    job's first tasks after a release of its newest ones), made without the tasks.
    Its hosts and ``(id, host)`` pairs are those of its tasks."""
    names = [f"h{i:03d}" for i in range(len(initial))]
    placed = FreeSlots(names, initial).place(1, want, ptile)
    if placed is None:
        return
    start = data.draw(st.integers(0, placed.total - 1))
    tasks = TaskList(placed, start)
    plain = tuple(Task(i, h) for i, h in enumerate(placed.task_hosts()))[start:]
    n = len(plain)
    a = data.draw(st.integers(-n - 2, n + 2))
    b = data.draw(st.integers(-n - 2, n + 2))
    step = data.draw(st.sampled_from([None, 1, 2, -1]))
    part = tasks[a:b:step]
    first, stop, _ = slice(a, b).indices(n)
    if step in (None, 1) and first < stop and (first, stop) != (0, n):
        assert isinstance(part, TaskList) and part._tasks is None
        assert list(part.id_host_pairs()) == [(t.id, t.host) for t in plain[a:b]]
        assert list(part.task_hosts()) == [t.host for t in plain[a:b]]
    assert tuple(part) == plain[a:b:step]
    assert list(tasks.id_host_pairs()) == [(t.id, t.host) for t in plain]
    tasks.as_tuple()
    assert list(tasks.id_host_pairs()) == [(t.id, t.host) for t in plain]
    assert list(tasks.task_hosts()) == [t.host for t in plain]


def test_the_plugins_first_tasks_of_a_job_commit_as_the_jobs_own_runs() -> None:
    """The plugin's state after a release of the newest tasks is the job's task list
    cut to its first tasks: the cluster takes it as what the job holds, comparing runs,
    and any other cut is compared task by task."""
    _, cluster, started = _a_job_on_runs()
    first = started[:150]
    assert isinstance(first, TaskList) and first.placement is not started.placement
    assert cluster.free("j", list(range(150, 200))) == 50
    listed = cluster.as_held("j", first)
    assert isinstance(listed, TaskList) and listed == tuple(started)[:150]
    assert cluster.as_held("j", started[:149]) is None
    assert cluster.as_held("j", started[1:151]) is None


_OPS = st.lists(
    st.tuples(
        st.sampled_from(["take", "give", "set", "set_many", "disable", "enable", "snapshot"]),
        st.integers(0, 39),
        st.integers(0, 3),
        st.integers(0, 3),
    ),
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 3), min_size=40, max_size=40), _OPS)
def test_snapshots_compare_equal_exactly_when_their_counts_are(
    initial: list[int], ops: list[tuple[str, int, int, int]]
) -> None:
    """Two snapshots of one count (which share its list and log what changes after
    them) are equal exactly when the counts at their two instants are, whatever
    changed in between or after (takes, gives, sets, hosts taken out and put back, a
    change back to what it was, a log grown past the hosts and started again)."""
    names = [f"h{i:02d}" for i in range(40)]
    free = FreeSlots(names, initial)
    shots = [(free.snapshot(), _open_of(free))]
    for op, i, length, n in ops:
        hosts = names[i : i + length + 1]
        if op == "take":
            free.take([(h, k) for h in hosts if (k := min(n, free.free(h)))])
        elif op == "give":
            free.give([(h, n) for h in hosts])
        elif op == "set":
            free.set(names[i], n)
        elif op == "set_many":
            free.set_many([(h, n) for h in hosts])
        elif op == "disable":
            free.disable(names[i])
        elif op == "enable":
            free.enable(names[i], n)
        else:
            shots.append((free.snapshot(), _open_of(free)))
        assert free.problems() == []
    shots.append((free.snapshot(), _open_of(free)))
    for a, (view_a, counts_a) in enumerate(shots):
        for view_b, counts_b in shots[a:]:
            assert (view_a == view_b) == (counts_a == counts_b)
    for view, counts in shots:
        assert dict(view) == counts


def test_a_count_changed_and_changed_back_compares_equal() -> None:
    """A host's count changed between two snapshots and changed back, then changed
    twice after the second: the two are equal, and the one after the changes is not."""
    names = [f"h{i:02d}" for i in range(40)]
    free = FreeSlots(names, [2] * 40)
    first = free.snapshot()
    free.set("h03", 0)
    free.set("h03", 2)
    second = free.snapshot()
    free.set("h03", 1)
    free.set("h03", 0)
    third = free.snapshot()
    assert first == second and first != third and second != third
    assert dict(first) == dict(second) == {h: 2 for h in names}


@pytest.mark.parametrize("hosts", [2, 30])  # logged host by host, or as one bulk change
def test_one_change_that_keeps_the_total_compares_unequal(hosts: int) -> None:
    """One change that leaves the total as it was (hosts of 2 free slots become 3 and
    1 in turn) is enough for two snapshots to differ; changed back, they are equal."""
    names = [f"h{i:02d}" for i in range(40)]
    free = FreeSlots(names, [2] * 40)
    before = free.snapshot()
    free.set_many([(h, 3 if k % 2 else 1) for k, h in enumerate(names[:hosts])])
    after = free.snapshot()
    assert before != after and after != before
    free.set_many([(h, 2) for h in names[:hosts]])
    assert before == free.snapshot() and after != free.snapshot()


def _names(parts: list[tuple[str, int, int, int]]) -> tuple[str, ...]:
    """Host names in stretches: ``(prefix, first number, count, digits)``; digits 0
    gives names without a number. Some stretches follow one another in number."""
    out: list[str] = []
    for prefix, first, count, digits in parts:
        for k in range(count):
            out.append(f"{prefix}x{k}" if digits == 0 else f"{prefix}{first + k:0{digits}d}")
    return tuple(dict.fromkeys(out))  # a cluster's names are distinct


name_parts = st.lists(
    st.tuples(
        st.sampled_from(["n", "node", "n-", ""]),
        st.integers(0, 120),
        st.integers(1, 90),
        st.sampled_from([0, 1, 3, 4]),
    ),
    min_size=1,
    max_size=8,
)


@settings(max_examples=200, deadline=None)
@given(
    name_parts,
    st.lists(st.tuples(st.integers(0, 10**6), st.integers(1, 60), st.integers(1, 3)), max_size=12),
    st.integers(0, 400),
)
def test_a_task_list_is_written_to_the_journal_as_its_tuple(
    parts: list[tuple[str, int, int, int]], raw_runs: list[tuple[int, int, int]], start: int
) -> None:
    """The journal reads a lazy task list's hosts from its runs of the cluster's names
    (each name's number read once per cluster), and writes the same bytes as for the
    plain tuple of its tasks, whose hosts it reads one by one; its runs stand for
    exactly its hosts, a slice's first host cut inside a run included."""
    from xce_resize_plugin.core.task_codec import HostNumbers, encode_tasks

    names = _names(parts)
    runs = [(f % len(names), n, take) for f, n, take in raw_runs]
    runs = [(f, min(n, len(names) - f), take) for f, n, take in runs]
    placement = Placement.of_runs(names, runs)
    tasks = TaskList(placement, min(start, placement.total))
    positions = tasks.host_positions()
    assert positions is not None
    names_of_runs, position_runs = positions
    expanded = [
        h for f, n, take in position_runs for h in names_of_runs[f : f + n] for _ in range(take)
    ]
    assert expanded == list(tasks.task_hosts())
    plain = tuple(tasks)
    shared = HostNumbers()
    for numbers_lazy, numbers_plain in ((HostNumbers(), HostNumbers()), (shared, shared)):
        assert encode_tasks(tasks, numbers_lazy) == encode_tasks(plain, numbers_plain)
    # Once made, the list is read task by task, with the same result.
    assert encode_tasks(TaskList(placement, tasks.start), HostNumbers()) == encode_tasks(
        tasks, HostNumbers()
    )


def test_names_whose_kinds_ran_out_are_read_one_by_one() -> None:
    """Past the kinds a name table holds, which names have a number depends on the
    order they are met: the journal then reads a task list's hosts one by one."""
    from xce_resize_plugin.core.task_codec import HostNumbers, encode_tasks

    names = tuple(f"k{i}-{n:03d}" for i in range(3) for n in range(200))
    placement = Placement.of_runs(names, [(0, 600, 1)])
    tasks = TaskList(placement)
    few = HostNumbers(kinds=2)

    class Names(tuple[str, ...]):
        reads = 0

        def __iter__(self):  # type: ignore[no-untyped-def]
            Names.reads += 1
            return super().__iter__()

    counted = Names(names)
    assert few.codes_of(counted) is None
    # Kinds are never freed: that answer is kept, and the names are not read again.
    assert few.codes_of(counted) is None
    assert Names.reads == 1
    plain = encode_tasks(tuple(tasks), HostNumbers(kinds=2))
    assert encode_tasks(tasks, HostNumbers(kinds=2)) == plain
    # Two kinds: the first two stretches are runs, the third is written name by name.
    hosts = plain["hosts"] if isinstance(plain, dict) else None
    assert hosts is not None and hosts[:2] == [["k0-", 0, 200, 3], ["k1-", 0, 200, 3]]
    assert hosts[2:] == list(names[400:])


@settings(max_examples=150, deadline=None)
@given(
    _blocks(0),
    st.lists(st.tuples(st.integers(1, 600), st.one_of(st.none(), st.integers(1, 3))), max_size=6),
    st.one_of(st.none(), st.integers(1, 4)),
    st.lists(st.integers(0, 10**6), max_size=5),
    st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 3)), max_size=10),
)
def test_capacity_after_a_placement_is_that_of_the_slots_with_it_taken(
    initial: list[int],
    wants: list[tuple[int, int | None]],
    ptile: int | None,
    off: list[int],
    more: list[tuple[int, int]],
) -> None:
    """What a backfill against a head with ``ptile`` asks (the scheduler's
    ``_fits_past_shadow``): the capacity once a placement is taken, read from the
    placement's hosts alone, is the capacity of a draft that took it; and the most
    free slots of any host (``_excess``), read from the classes, is that of the hosts."""
    names = [f"h{i:03d}" for i in range(len(initial))]
    free = FreeSlots(names, initial)
    for i in off:  # hosts taken out count no free slot
        free.disable(names[i % len(names)])
    for want, job_ptile in wants:
        placed = free.place(1, want, job_ptile)
        if placed is None:
            continue
        # The slots it is asked about may hold more than those it was placed on (the
        # head's slots at the shadow time: running jobs' slots given back).
        free = free.draft()
        free.give([(names[i % len(names)], n) for i, n in more])
        trial = free.draft()
        trial.take(placed)
        assert free.capacity_after(placed, ptile) == trial.capacity(ptile)
        assert free.capacity_after(placed.pairs(), ptile) == trial.capacity(ptile)
        free.take(placed)
        assert free.most_free() == max(free.as_dict().values(), default=0)
