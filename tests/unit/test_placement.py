"""Grow placement: the free-slot index, the default order and the greedy placer."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping

import attrs
import pytest
from attrs import frozen
from hypothesis import given, settings
from hypothesis import strategies as st

from xce_resize_plugin.core.models import GrowHosts, JobInfo, JobState, Task
from xce_resize_plugin.core.placement import (
    FreeSlotIndex,
    GrowHostView,
    Placement,
    SparseFree,
    apply,
    default_grow_order,
    has_free,
    place,
)

PE, NEW, ANY = GrowHosts.PREFER_EXISTING, GrowHosts.NEW_ONLY, GrowHosts.ANY


def make_job(
    job_tasks: Mapping[str, int], *, grow_hosts: GrowHosts = PE, ptile: int | None = None
) -> JobInfo:
    tasks: list[Task] = []
    for host, n in job_tasks.items():
        tasks.extend(Task(len(tasks), host) for _ in range(n))
    return JobInfo(
        id="1",
        user="alice",
        state=JobState.RUN,
        min_tasks=1,
        max_tasks=1000,
        tasks=tuple(tasks),
        resizable=True,
        ptile=ptile,
        grow_hosts=grow_hosts,
    )


def grow(
    free: Mapping[str, int],
    job_tasks: Mapping[str, int],
    *,
    min_add: int,
    max_add: int,
    grow_hosts: GrowHosts = PE,
    ptile: int | None = None,
    headroom: int | None = None,
    order: Iterable[str] | None = None,
) -> tuple[Placement | None, FreeSlotIndex]:
    """Place with the default order (or ``order``) on a fresh index; the index is returned."""
    index = FreeSlotIndex(free)
    view = GrowHostView(index, job_tasks)
    if order is None:
        order = default_grow_order(make_job(job_tasks, grow_hosts=grow_hosts, ptile=ptile), view)
    result = place(
        order,
        view,
        min_add=min_add,
        max_add=max_add,
        ptile=ptile,
        grow_hosts=grow_hosts,
        headroom=headroom,
    )
    return result, index


def state(index: FreeSlotIndex) -> tuple[dict[str, int], list[str]]:
    return {h: index.free(h) for h in index.hosts()}, list(index.by_free_desc())


def expected_order(free: Mapping[str, int]) -> list[str]:
    return [h for _, h in sorted((-f, h) for h, f in free.items() if f > 0)]


class Exploding:
    """A policy order that fails the test if read past ``allowed`` hosts."""

    def __init__(self, hosts: Iterable[str], allowed: int) -> None:
        self.hosts = list(hosts)
        self.allowed = allowed
        self.read = 0

    def __iter__(self) -> Iterator[str]:
        for host in self.hosts:
            if self.read == self.allowed:
                raise AssertionError(f"order read past {self.allowed} hosts")
            self.read += 1
            yield host


# --- FreeSlotIndex ------------------------------------------------------------------


def test_index_basics() -> None:
    index = FreeSlotIndex({"c": 2, "a": 0, "b": 5, "d": 2})
    assert list(index.hosts()) == ["c", "a", "b", "d"]
    assert index.free("b") == 5
    assert index.free("a") == 0
    assert index.free("nowhere") == 0
    assert list(index.by_free_desc()) == ["b", "c", "d"]
    index.take("b", 4)
    assert index.free("b") == 1
    assert list(index.by_free_desc()) == ["c", "d", "b"]
    index.take("c", 2)
    assert list(index.by_free_desc()) == ["d", "b"]
    assert list(index.hosts()) == ["c", "a", "b", "d"]  # full hosts stay known


def test_index_take_errors() -> None:
    index = FreeSlotIndex({"a": 2})
    with pytest.raises(ValueError, match="3 slots"):
        index.take("a", 3)
    with pytest.raises(ValueError):
        index.take("ghost", 1)
    with pytest.raises(ValueError):
        index.take("a", -1)
    index.take("ghost", 0)  # a no-op, even for an unknown host
    assert index.free("a") == 2


def test_index_rejects_negative_free() -> None:
    with pytest.raises(ValueError, match="'b'"):
        FreeSlotIndex({"a": 1, "b": -1})


def test_index_empty() -> None:
    index = FreeSlotIndex({})
    assert list(index.by_free_desc()) == []
    assert list(index.hosts()) == []


def test_by_free_desc_is_a_snapshot() -> None:
    index = FreeSlotIndex({"a": 3, "b": 3, "c": 2, "d": 1})
    walk = index.by_free_desc()
    assert next(walk) == "a"
    index.take("b", 3)  # gone now, but it was there when the walk began
    index.take("a", 1)  # moves into c's bucket: must not be yielded twice
    assert list(walk) == ["b", "c", "d"]
    late = index.by_free_desc()
    index.take("d", 1)  # a take before the first read
    assert list(late) == ["a", "c", "d"]
    assert list(index.by_free_desc()) == ["a", "c"]


# --- GrowHostView and default_grow_order --------------------------------------------

FREE = {"h1": 2, "h2": 8, "h3": 4, "h4": 8, "h5": 0, "h6": 1}
JOB = {"h3": 2, "h1": 1, "h5": 4}  # allocation order: h3 first


def test_view() -> None:
    view = GrowHostView(FreeSlotIndex(FREE), {**JOB, "h6": 0})
    assert list(view) == list(FREE)
    assert len(view) == 6
    assert "h2" in view
    assert "nowhere" not in view
    assert view.free("h2") == 8
    assert view.job_tasks("h3") == 2
    assert view.job_tasks("h2") == 0
    assert list(view.job_hosts()) == ["h3", "h1", "h5"]  # zero-task hosts dropped
    assert list(view.by_free_desc()) == ["h2", "h4", "h3", "h1", "h6"]
    with pytest.raises(ValueError):
        GrowHostView(FreeSlotIndex(FREE), {"h1": -1})


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        # own hosts in allocation order (h5 is full), then the others by free, then name
        (PE, ["h3", "h1", "h2", "h4", "h6"]),
        (NEW, ["h2", "h4", "h6"]),
        (ANY, ["h2", "h4", "h3", "h1", "h6"]),
    ],
)
def test_default_order(mode: GrowHosts, expected: list[str]) -> None:
    view = GrowHostView(FreeSlotIndex(FREE), JOB)
    assert list(default_grow_order(make_job(JOB, grow_hosts=mode), view)) == expected


# --- place: the three modes ----------------------------------------------------------


def test_prefer_existing_fills_own_hosts_first() -> None:
    result, _ = grow(FREE, JOB, min_add=1, max_add=10, grow_hosts=PE)
    assert result == Placement((("h3", 4), ("h1", 2), ("h2", 4)))
    assert result is not None and result.total == 10


def test_new_only_avoids_own_hosts() -> None:
    result, _ = grow(FREE, JOB, min_add=1, max_add=10, grow_hosts=NEW)
    assert result == Placement((("h2", 8), ("h4", 2)))


def test_any_goes_by_free_slots() -> None:
    result, _ = grow(FREE, JOB, min_add=1, max_add=18, grow_hosts=ANY)
    assert result == Placement((("h2", 8), ("h4", 8), ("h3", 2)))


def test_ptile_counts_existing_tasks() -> None:
    # ptile 4, the job has 3 tasks on hostA which has 4 free: only 1 more fits there.
    free = {"hostA": 4, "hostB": 4}
    result, _ = grow(free, {"hostA": 3}, min_add=1, max_add=5, ptile=4, grow_hosts=PE)
    assert result == Placement((("hostA", 1), ("hostB", 4)))


def test_ptile_one_spreads() -> None:
    result, _ = grow({"a": 8, "b": 8, "c": 8}, {"a": 1}, min_add=2, max_add=5, ptile=1)
    assert result == Placement((("b", 1), ("c", 1)))


def test_partial_grant_at_least_min() -> None:
    result, _ = grow({"a": 2, "b": 1}, {}, min_add=2, max_add=8, grow_hosts=ANY)
    assert result == Placement((("a", 2), ("b", 1)))


def test_below_min_reserves_nothing() -> None:
    free = {"a": 2, "b": 1}
    index = FreeSlotIndex(free)
    before = state(index)
    view = GrowHostView(index, {})
    order = default_grow_order(make_job({}, grow_hosts=ANY), view)
    result = place(order, view, min_add=4, max_add=8, ptile=None, grow_hosts=ANY, headroom=None)
    assert result is None
    assert state(index) == before


def test_headroom_caps_total() -> None:
    result, _ = grow({"a": 8}, {}, min_add=1, max_add=6, grow_hosts=ANY, headroom=3)
    assert result == Placement((("a", 3),))


def test_headroom_below_min_does_not_read_order() -> None:
    order = Exploding(["a"], allowed=0)
    result, _ = grow({"a": 8}, {}, min_add=4, max_add=6, headroom=3, order=order)
    assert result is None


def test_exact_request() -> None:
    result, _ = grow({"a": 3, "b": 3}, {}, min_add=4, max_add=4, grow_hosts=ANY)
    assert result == Placement((("a", 3), ("b", 1)))
    result, _ = grow({"a": 3}, {}, min_add=4, max_add=4, grow_hosts=ANY)
    assert result is None


def test_policy_order_unknown_and_duplicate_hosts() -> None:
    order = ["ghost", "b", "b", "a", "ghost", "b", "c"]
    result, _ = grow({"a": 2, "b": 1, "c": 5}, {}, min_add=1, max_add=4, order=order)
    assert result == Placement((("b", 1), ("a", 2), ("c", 1)))


def test_policy_listing_own_host_under_new_only_is_skipped() -> None:
    order = ["mine", "other"]
    free = {"mine": 8, "other": 2}
    result, _ = grow(free, {"mine": 1}, min_add=1, max_add=4, grow_hosts=NEW, order=order)
    assert result == Placement((("other", 2),))
    result, _ = grow(free, {"mine": 1}, min_add=3, max_add=4, grow_hosts=NEW, order=order)
    assert result is None


def test_hosts_not_in_order_are_not_used() -> None:
    result, _ = grow({"a": 8, "b": 8}, {}, min_add=1, max_add=4, order=["b"])
    assert result == Placement((("b", 4),))


def test_order_read_only_as_far_as_needed() -> None:
    order = Exploding([f"h{i}" for i in range(100)], allowed=2)
    free = {f"h{i}": 2 for i in range(100)}
    result, _ = grow(free, {}, min_add=1, max_add=4, order=order)
    assert result is not None and result.total == 4
    assert order.read == 2


def test_default_order_is_lazy() -> None:
    """A 2-task grow on 10,000 hosts reads two hosts from the order."""
    free = {f"n{i:05d}": 1 + i % 7 for i in range(10_000)}
    index = FreeSlotIndex(free)
    view = GrowHostView(index, {})
    read: list[str] = []

    def spy(hosts: Iterable[str]) -> Iterator[str]:
        for host in hosts:
            read.append(host)
            yield host

    order = spy(default_grow_order(make_job({}, grow_hosts=ANY, ptile=1), view))
    result = place(order, view, min_add=2, max_add=2, ptile=1, grow_hosts=ANY, headroom=None)
    assert result == Placement((("n00006", 1), ("n00013", 1)))
    assert read == ["n00006", "n00013"]


def test_endless_policy_order_terminates() -> None:
    def forever() -> Iterator[str]:
        while True:
            yield "a"
            yield "b"

    result, _ = grow({"a": 1, "b": 1, "c": 0}, {}, min_add=1, max_add=5, order=forever())
    assert result == Placement((("a", 1), ("b", 1)))


def test_place_does_not_modify_index_and_apply_takes() -> None:
    free = {"a": 4, "b": 4}
    result, index = grow(free, {}, min_add=1, max_add=6, grow_hosts=ANY)
    assert state(index)[0] == free
    assert result == Placement((("a", 4), ("b", 2)))
    apply(index, result)
    assert state(index) == ({"a": 0, "b": 2}, ["b"])


def test_apply_is_all_or_nothing() -> None:
    index = FreeSlotIndex({"a": 4, "b": 1})
    with pytest.raises(ValueError, match="'b'"):
        apply(index, Placement((("a", 2), ("b", 1), ("b", 1))))
    with pytest.raises(ValueError):
        apply(index, Placement((("a", 0),)))
    assert state(index) == ({"a": 4, "b": 1}, ["a", "b"])


@pytest.mark.parametrize(
    ("min_add", "max_add", "ptile", "headroom"),
    [(0, 1, None, None), (3, 2, None, None), (1, 2, 0, None), (1, 2, None, -1)],
)
def test_place_rejects_bad_arguments(
    min_add: int, max_add: int, ptile: int | None, headroom: int | None
) -> None:
    view = GrowHostView(FreeSlotIndex({"a": 1}), {})
    with pytest.raises(ValueError):
        place(
            ["a"],
            view,
            min_add=min_add,
            max_add=max_add,
            ptile=ptile,
            grow_hosts=ANY,
            headroom=headroom,
        )


def test_full_cluster_does_not_read_order() -> None:
    result, _ = grow({"a": 0}, {}, min_add=1, max_add=1, order=Exploding(["a"], 0))
    assert result is None


# --- properties ----------------------------------------------------------------------

HOSTS = [f"h{i}" for i in range(12)]
frees = st.dictionaries(st.sampled_from(HOSTS), st.integers(0, 12), max_size=12)


@frozen
class Scenario:
    free: dict[str, int]
    job_tasks: dict[str, int]
    min_add: int
    max_add: int
    grow_hosts: GrowHosts
    ptile: int | None
    headroom: int | None
    order: list[str] | None  # None: the default order

    def run(self) -> tuple[Placement | None, FreeSlotIndex]:
        return grow(
            self.free,
            self.job_tasks,
            min_add=self.min_add,
            max_add=self.max_add,
            grow_hosts=self.grow_hosts,
            ptile=self.ptile,
            headroom=self.headroom,
            order=self.order,
        )


@st.composite
def scenarios(draw: st.DrawFn) -> Scenario:
    ptile = draw(st.none() | st.integers(1, 8))
    job_hosts = draw(st.lists(st.sampled_from(HOSTS), unique=True, max_size=5))
    min_add = draw(st.integers(1, 20))
    return Scenario(
        free=draw(frees),
        job_tasks={h: draw(st.integers(1, ptile or 8)) for h in job_hosts},
        min_add=min_add,
        max_add=draw(st.integers(min_add, 30)),
        grow_hosts=draw(st.sampled_from(list(GrowHosts))),
        ptile=ptile,
        headroom=draw(st.none() | st.integers(0, 30)),
        # an arbitrary policy order, with unknown hosts and duplicates in it
        order=draw(st.none() | st.lists(st.sampled_from([*HOSTS, "ghost"]), max_size=30)),
    )


@settings(max_examples=300, deadline=None)
@given(scenarios())
def test_placement_respects_constraints(s: Scenario) -> None:
    free, job_tasks, ptile, mode = s.free, s.job_tasks, s.ptile, s.grow_hosts
    result, index = s.run()
    assert state(index)[0] == free  # place never takes
    # Greedy is complete along the order: it places everything that fits there.
    order = s.order
    if order is None:
        view = GrowHostView(FreeSlotIndex(free), job_tasks)
        order = list(default_grow_order(make_job(job_tasks, grow_hosts=mode), view))
    fits = 0
    for host in dict.fromkeys(order):
        if mode is NEW and job_tasks.get(host):
            continue
        room = free.get(host, 0)
        if ptile is not None:
            room = min(room, ptile - job_tasks.get(host, 0))
        fits += max(room, 0)
    wanted = s.max_add if s.headroom is None else min(s.max_add, s.headroom)
    if result is None:
        assert min(fits, wanted) < s.min_add
        return
    assert result.total == min(fits, wanted)
    assert s.min_add <= result.total <= s.max_add
    if s.headroom is not None:
        assert result.total <= s.headroom
    placed = dict(result.hosts)
    assert len(placed) == len(result.hosts)  # each host once
    for host, n in result.hosts:
        assert 1 <= n <= free[host]
        if ptile is not None:
            assert job_tasks.get(host, 0) + n <= ptile
        if mode is NEW:
            assert host not in job_tasks
    apply(index, result)
    for host in free:
        assert index.free(host) == free[host] - placed.get(host, 0)


class _Sparse(SparseFree):
    """A SparseFree over a dict (its own open_items and host_order: the base's
    defaults are tested through the plain dict path)."""

    def __init__(self, free: dict[str, int]) -> None:
        self._d = free

    def __getitem__(self, host: str) -> int:
        return self._d[host]

    def __iter__(self) -> Iterator[str]:
        return iter(self._d)

    def __len__(self) -> int:
        return len(self._d)

    def open_items(self) -> Iterable[tuple[str, int]]:
        return [(h, n) for h, n in self._d.items() if n > 0]

    def host_order(self) -> tuple[str, ...]:
        return tuple(self._d)


@settings(max_examples=300, deadline=None)
@given(scenarios())
def test_a_sparse_free_view_places_as_the_plain_one(s: Scenario) -> None:
    """An index built from a host's SparseFree (its hosts with free slots only) answers,
    orders and places as one built from the plain mapping, and knows the full hosts."""
    sparse = _Sparse(dict(s.free))
    plain_index, sparse_index = FreeSlotIndex(dict(s.free)), FreeSlotIndex(sparse)
    assert state(sparse_index) == state(plain_index)
    assert has_free(sparse) == has_free(s.free) == any(s.free.values())
    for host in [*HOSTS, "ghost"]:
        assert (host in GrowHostView(sparse_index, {})) == (host in s.free)
    result, index = s.run()
    with_sparse, index2 = Scenario(sparse, *attrs.astuple(s, recurse=False)[1:]).run()  # type: ignore[arg-type]
    assert with_sparse == result
    if result is not None:
        apply(index, result)
        apply(index2, result)
    assert state(index2) == state(index)


@settings(max_examples=400, deadline=None)
@given(
    frees,
    st.lists(st.lists(st.tuples(st.sampled_from([*HOSTS, "ghost"]), st.integers(-1, 6)))),
    st.integers(0, 4),
    st.booleans(),
)
def test_takes_at_once_are_the_takes_one_by_one(
    free: dict[str, int],
    batches: list[list[tuple[str, int]]],
    read: int,
    sort_first: bool,
) -> None:
    """``take_many`` leaves the index as the same takes one by one do: the free slots,
    the order, a walk begun before the takes (a snapshot, partly read), and the error
    (and what was taken before it) of a take that cannot be made."""

    def run(at_once: bool) -> list[object]:
        index = FreeSlotIndex(free)
        out: list[object] = []
        if sort_first:
            list(index.by_free_desc())  # some buckets sorted, others not
        walk = index.by_free_desc()
        out.append([next(walk, None) for _ in range(read)])
        for batch in batches:
            try:
                if at_once:
                    index.take_many(batch)
                else:
                    for host, n in batch:
                        index.take(host, n)
            except ValueError as exc:
                out.append(str(exc))
            out.append((state(index), repr(index)))  # (repr: the hosts with free slots)
            # No empty bucket is kept, and the counts list the buckets.
            assert all(index._buckets.values()) and index._counts == sorted(index._buckets)
        out.append(list(walk))
        return out

    assert run(True) == run(False)


@settings(max_examples=100, deadline=None)
@given(scenarios())
def test_placement_is_deterministic(s: Scenario) -> None:
    first, _ = s.run()
    second, _ = s.run()
    assert first == second


@settings(max_examples=200, deadline=None)
@given(frees, st.lists(st.tuples(st.sampled_from(HOSTS), st.integers(0, 12)), max_size=30))
def test_index_order_after_takes(free: dict[str, int], takes: list[tuple[str, int]]) -> None:
    index = FreeSlotIndex(free)
    model = dict(free)
    list(index.by_free_desc())  # sort some buckets, so takes hit sorted and unsorted ones
    for host, n in takes:
        n = min(n, model.get(host, 0))
        index.take(host, n)
        if host in model:
            model[host] -= n
        assert list(index.by_free_desc()) == expected_order(model)
    assert {h: index.free(h) for h in free} == model
    assert list(index.hosts()) == list(free)


@settings(max_examples=200, deadline=None)
@given(
    frees,
    st.lists(
        st.one_of(
            st.just(("read", "", 0)),
            st.tuples(st.just("take"), st.sampled_from(HOSTS), st.integers(1, 12)),
        ),
        max_size=40,
    ),
)
def test_by_free_desc_snapshot_under_takes(
    free: dict[str, int], steps: list[tuple[str, str, int]]
) -> None:
    """Interleaving reads and takes, a walk yields exactly the order at its creation."""
    index = FreeSlotIndex(free)
    walk = index.by_free_desc()
    snapshot = expected_order(free)
    got: list[str] = []
    for action, host, n in steps:
        if action == "read":
            got.extend(h for h in [next(walk, None)] if h is not None)
        else:
            index.take(host, min(n, index.free(host)))
    got.extend(walk)
    assert got == snapshot
