"""Journal encoding round trips; API decoding is strict and names the bad field."""

from __future__ import annotations

import json
from collections.abc import Sequence

import attrs
import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from xce_resize_plugin import errors
from xce_resize_plugin.core import converters, task_codec
from xce_resize_plugin.core.facts import (
    FACT_TYPES,
    Fact,
    GrowPlaced,
    JobTracked,
    NotifyDone,
    ReleaseAccepted,
)
from xce_resize_plugin.core.models import (
    ChangeKind,
    GrowRequest,
    ResizeRecord,
    ResizeState,
    Target,
    Task,
)
from xce_resize_plugin.journal import StoredState

times = st.floats(0, 1e9, allow_nan=False)
tasks = st.lists(
    st.builds(Task, st.integers(0, 10_000), st.sampled_from(["hA", "hB", "node-007"])),
    max_size=6,
).map(tuple)


def _fact(cls: type) -> st.SearchStrategy[object]:
    fields = attrs.fields(attrs.resolve_types(cls))
    # Every float field is a controller time: never NaN (NaN never equals itself).
    floats = {f.name: times for f in fields if f.type is float}
    # Counters, ids and exit statuses: the journal's JSON holds 64-bit integers.
    int64 = st.integers(-(2**63), 2**63 - 1)
    ints = {f.name: int64 for f in fields if f.type is int}
    ints.update({f.name: st.none() | int64 for f in fields if f.type == int | None})
    id_lists = st.lists(int64, max_size=4).map(tuple)
    ints.update({f.name: id_lists for f in fields if f.type == tuple[int, ...]})
    task_fields: dict[str, st.SearchStrategy[object]] = {
        f.name: tasks for f in fields if f.type in (tuple[Task, ...], Sequence[Task])
    }
    # A nested target holds 64-bit integers as well (left to inference, they need not).
    targets = st.none() | st.builds(Target, int64, st.lists(int64, max_size=4).map(tuple))
    task_fields.update({f.name: targets for f in fields if f.type == Target | None})
    # A readiness wait (seconds, or none) and task id lists (TaskReady, ReadyTimedOut).
    floats.update({f.name: st.none() | times for f in fields if f.type == float | None})
    ids = st.lists(int64, max_size=6).map(tuple)
    ints.update({f.name: ids for f in fields if f.type == tuple[int, ...]})
    return st.builds(cls, **floats, **ints, **task_fields)


@given(st.one_of(*(_fact(t) for t in FACT_TYPES)))
def test_every_fact_round_trips(fact: object) -> None:
    data = converters.encode_fact(fact)  # type: ignore[arg-type]
    # the same bytes as the tagged union's own encoding
    assert data == orjson.dumps(converters.JOURNAL.unstructure(fact, Fact))
    assert converters.decode_fact(data) == fact
    assert json.loads(data)["type"] == type(fact).__name__


def _stored(state: ResizeState) -> StoredState:
    """What the journal would hold after the job's first transition."""
    rows = {t.name: t.rows for t in converters.history_tails(None, state)}
    return StoredState(
        converters.encode_state(state), rows.get("records", ()), rows.get("charges", ())
    )


@given(tasks, tasks, times)
def test_state_round_trips(before: tuple[Task, ...], delta: tuple[Task, ...], t: float) -> None:
    rec = ResizeRecord(t, ChangeKind.GROW, before, delta, before + delta, 3)
    state = ResizeState("1", "u", 1, 9, before, 0.0, records=(rec,), charges=((0.0, 1), (t, 2)))
    assert converters.decode_state(_stored(state)) == state
    assert b"records" not in converters.encode_state(state)  # the history is apart


charges = st.lists(st.tuples(times, st.integers(0, 64)), max_size=8).map(tuple)


@given(st.lists(charges, min_size=1, max_size=6))
def test_history_tails_rebuild_every_version(versions: list[tuple[tuple[float, int], ...]]) -> None:
    """Applying each transition's tail to the stored rows, as the journal does, always
    leaves exactly the rows of the newest history, whatever the change between two."""
    rows: list[bytes] = []
    state: ResizeState | None = None
    for version in versions:
        new = ResizeState("1", "u", 1, 9, (), 0.0, charges=version)
        for tail in converters.history_tails(state, new):
            assert tail.name == "charges" and tail.stop == len(rows)
            rows[tail.start :] = tail.rows
        state = new
        assert rows == [converters.encode_charge(c) for c in version]


def test_a_state_with_its_history_inside_is_refused() -> None:
    data = json.dumps({"job_id": "1", "records": []}).encode()
    with pytest.raises(errors.JournalError, match="history is stored apart"):
        converters.decode_state(StoredState(data))


def test_a_number_the_journal_cannot_hold_is_refused() -> None:
    with pytest.raises(errors.JournalError, match="cannot be written to the journal"):
        converters.encode_fact(NotifyDone("1", 0.0, 2**64, True, 0))


def test_fact_encoding_is_compact_json() -> None:
    data = converters.encode_fact(GrowPlaced("5", 1.5, (Task(4, "hB"),)))
    assert json.loads(data) == {
        "type": "GrowPlaced",
        "job_id": "5",
        "at": 1.5,
        "tasks": [[4, "hB"]],
    }


def test_unknown_keys_in_stored_facts_are_rejected() -> None:
    data = json.dumps(
        {
            "type": "NotifyDone",
            "job_id": "1",
            "at": 0,
            "attempt": 1,
            "ok": True,
            "status": 0,
            "surprise": 1,
        }
    ).encode()
    with pytest.raises(errors.JournalError, match="surprise"):
        converters.decode_fact(data)
    assert converters.decode_fact(converters.encode_fact(NotifyDone("1", 0, 1, True, 0))).ok


def test_grow_body() -> None:
    assert converters.grow_from_json({"tasks": 4}) == GrowRequest(4, 4)
    assert converters.grow_from_json({"tasks": 4, "min_tasks": 2, "no_notify": True}) == (
        GrowRequest(2, 4, no_notify=True)
    )


@pytest.mark.parametrize(
    ("body", "expect"),
    [
        ({}, r"missing 'tasks'"),
        ({"tasks": "4"}, r"expected int, got str"),
        ({"tasks": 2.5}, r"expected int, got float"),
        ({"tasks": True}, r"expected int, got bool"),
        ({"tasks": 2, "color": "red"}, r"color"),
        ({"tasks": 2, "no_notify": "yes"}, r"expected bool"),
        ([1, 2], r"expected a JSON object"),
    ],
)
def test_bad_grow_bodies_are_named(body: object, expect: str) -> None:
    with pytest.raises(errors.InvalidRequest, match=expect):
        converters.grow_from_json(body)  # type: ignore[arg-type]


def test_release_body() -> None:
    assert converters.release_from_json({"spec": "all ~hB"}).spec == "all ~hB"
    assert converters.release_from_json({"task_ids": [3, 4]}).task_ids == (3, 4)
    assert converters.release_from_json({"hosts": {"hB": None, "hC": 2}}).hosts == {
        "hB": None,
        "hC": 2,
    }
    with pytest.raises(errors.InvalidRequest, match=r"\$\.count"):
        converters.release_from_json({"count": "2"})
    with pytest.raises(errors.InvalidRequest, match="bogus"):
        converters.release_from_json({"count": 2, "bogus": 1})


@pytest.mark.parametrize("ids", ["", {}, "34", {"3": 1}, (3,), None])
def test_task_id_lists_must_be_json_arrays(ids: object) -> None:
    """cattrs takes any iterable for a tuple of ids: ``"release_prefer": ""`` set a
    target preferring no task, and ``"task_ids": {}`` released nothing, both accepted."""
    with pytest.raises(errors.InvalidRequest, match=r"release_prefer"):
        converters.target_from_json({"tasks": 2, "release_prefer": ids})
    if ids is not None:  # (no task ids: another form of release, or none)
        with pytest.raises(errors.InvalidRequest, match=r"task_ids"):
            converters.release_from_json({"task_ids": ids})
    assert converters.target_from_json({"tasks": 2, "release_prefer": [5]}).release_prefer == (5,)


def test_release_accepted_round_trip() -> None:
    fact = ReleaseAccepted("1", 2.0, (Task(3, "hB"),), None, "alice", cancelled_pending=True)
    assert converters.decode_fact(converters.encode_fact(fact)) == fact


@pytest.mark.parametrize("key", ["max_add", "min_add"])
def test_grow_body_refuses_the_models_internal_names(key: str) -> None:
    with pytest.raises(errors.InvalidRequest, match=key):
        converters.grow_from_json({"tasks": 2, key: 5})


def test_record_json_keeps_the_documented_key_order() -> None:
    """Scenario ``--json`` output and REST history print records in this order."""
    from xce_resize_plugin.core.converters import record_json
    from xce_resize_plugin.core.models import ChangeKind, ResizeRecord, Task

    before = (Task(0, "a"),)
    delta = (Task(1, "b"), Task(2, "b"))
    record = ResizeRecord(1.5, ChangeKind.GROW, before, delta, before + delta, 3)
    data = record_json(record)
    assert list(data) == ["time", "type", "before", "delta", "after", "delta_tasks", "version"]
    assert data["delta"] == {"b": 2} and data["delta_tasks"] == [1, 2]


def _tracked(tasks: object) -> bytes:
    return json.dumps(
        {
            "type": "JobTracked",
            "job_id": "9",
            "at": 0.0,
            "user": "u",
            "min_tasks": 1,
            "max_tasks": 999,
            "tasks": tasks,
            "started_at": 0.0,
        }
    ).encode()


def test_a_long_allocation_of_consecutive_ids_is_written_as_its_first_id_and_hosts() -> None:
    """Schema 4: 256 tasks or more with consecutive ids are ``{"first", "hosts"}``; fewer,
    or with a gap, stay pairs; both forms (and pairs of any length, as schemas 2 and 3
    wrote them, and names only, as schema 4 wrote them) decode to the same tasks."""
    hosts = [f"h{i % 7}x" for i in range(task_codec.RUN_MIN)]  # no number at the end
    long = tuple(Task(5 + i, h) for i, h in enumerate(hosts))
    fact = JobTracked("9", 0.0, "u", 1, 999, long, 0.0)
    written = orjson.loads(converters.encode_fact(fact))
    assert written["tasks"] == {"first": 5, "hosts": hosts}
    assert converters.decode_fact(converters.encode_fact(fact)) == fact
    assert converters.decode_fact(_tracked([[t.id, t.host] for t in long])) == fact
    numbered = tuple(Task(5 + i, f"n{i % 7}") for i in range(task_codec.RUN_MIN))
    schema4 = _tracked({"first": 5, "hosts": [t.host for t in numbered]})
    assert converters.decode_fact(schema4) == attrs.evolve(fact, tasks=numbered)
    short = JobTracked("9", 0.0, "u", 1, 999, long[:-1], 0.0)
    pairs = orjson.loads(converters.encode_fact(short))["tasks"]
    assert pairs == [[t.id, t.host] for t in long[:-1]]


def test_a_long_allocation_of_a_few_stretches_of_ids_is_written_as_them() -> None:
    """Schema 5: a long allocation whose ids are a few stretches of consecutive ids (a
    job grown and shrunk) is ``{"ids": [[first, count], ...], "hosts"}``; one cut into
    more than one stretch per 16 tasks stays pairs. Both decode to the same tasks, in
    the same order (not sorted)."""
    hosts = [f"h{i % 7}x" for i in range(task_codec.RUN_MIN)]
    ids = [*range(100, 228), *range(5, 69), *range(300, 364)]
    tasks = tuple(Task(i, h) for i, h in zip(ids, hosts, strict=True))
    fact = JobTracked("9", 0.0, "u", 1, 999, tasks, 0.0)
    written = orjson.loads(converters.encode_fact(fact))["tasks"]
    assert written == {"ids": [[100, 128], [5, 64], [300, 64]], "hosts": hosts}
    assert converters.decode_fact(converters.encode_fact(fact)) == fact
    one_off = (*long_ids(hosts[:-1]), Task(999, "n0"))
    assert orjson.loads(converters.encode_fact(attrs.evolve(fact, tasks=one_off)))["tasks"] == {
        "ids": [[5, task_codec.RUN_MIN - 1], [999, 1]],
        "hosts": [*hosts[:-1], "n0"],
    }
    cut = tuple(Task(2 * i, h) for i, h in enumerate(hosts))  # a gap after every task
    pairs = orjson.loads(converters.encode_fact(attrs.evolve(fact, tasks=cut)))["tasks"]
    assert pairs == [[t.id, t.host] for t in cut]
    assert (
        converters.decode_fact(converters.encode_fact(attrs.evolve(fact, tasks=cut))).tasks == cut
    )


def long_ids(hosts: list[str]) -> tuple[Task, ...]:
    return tuple(Task(5 + i, h) for i, h in enumerate(hosts))


@pytest.mark.parametrize(
    "tasks",
    [
        {"first": 0},
        {"first": 0, "hosts": ["a"], "extra": 1},
        {"first": "0", "hosts": ["a"]},
        {"first": True, "hosts": ["a"]},
        {"first": 0, "hosts": "ab"},
        {"first": 0, "hosts": ["a", 7]},
    ],
)
def test_a_malformed_run_of_tasks_is_refused(tasks: object) -> None:
    with pytest.raises(errors.JournalError, match="undecodable fact"):
        converters.decode_fact(_tracked(tasks))


def test_consecutively_numbered_hosts_are_written_as_runs() -> None:
    """Schema 5: in the ``hosts`` of a long allocation, a stretch of 4 or more hosts
    named by consecutive numbers of as many digits is one ``[prefix, number, count,
    digits]``; shorter stretches and other names stay names.
    A job of 40,000 one-slot hosts is written in a few bytes."""
    hosts = [f"n{i:05d}" for i in range(2274, 42274)]
    big = tuple(Task(i, h) for i, h in enumerate(hosts))
    fact = JobTracked("9", 0.0, "u", 1, 99_999, big, 0.0)
    data = converters.encode_fact(fact)
    assert orjson.loads(data)["tasks"] == {"first": 0, "hosts": [["n", 2274, 40000, 5]]}
    assert len(data) < 200
    assert converters.decode_fact(data) == fact

    mixed = [
        *[f"a{i}" for i in range(8, 15)],  # a8, a9 | a10..a14: 1 digit, then 2
        "b1",
        "b2",
        "b3",  # three: names
        "n01",
        "n01",  # a host twice (two slots)
        *[f"rack7-n{i:03d}" for i in range(94, 99)],
        "x",
        *[f"m{i:03d}" for i in range(98, 104)],  # m099, m100: still 3 digits
        *[f"n{i % 7}" for i in range(250)],
    ]
    tasks = tuple(Task(i, h) for i, h in enumerate(mixed))
    written = orjson.loads(converters.encode_fact(JobTracked("9", 0.0, "u", 1, 999, tasks, 0.0)))
    items = written["tasks"]["hosts"]
    assert items[:9] == [
        "a8",
        "a9",
        ["a", 10, 5, 2],
        "b1",
        "b2",
        "b3",
        "n01",
        "n01",
        ["rack7-n", 94, 5, 3],
    ]
    assert items[9:12] == ["x", ["m", 98, 6, 3], ["n", 0, 7, 1]]
    assert (
        converters.decode_fact(converters.encode_fact(attrs.evolve(fact, tasks=tasks))).tasks
        == tasks
    )


_names = st.one_of(
    st.builds(
        lambda p, n, w: f"{p}{n:0{w}d}",
        st.sampled_from(["n", "r1-n", ""]),
        st.integers(0, 120),
        st.integers(1, 4),
    ),
    st.sampled_from(["login", "n", "n-1", "٣", "n٣", "a\n1", "p" * 255 + "1", "p" * 256 + "1"]),
)


@given(
    st.lists(
        st.tuples(_names, st.integers(1, 12), st.booleans()),
        min_size=1,
        max_size=40,
    )
)
def test_host_runs_give_back_every_name_in_order(pieces: list[tuple[str, int, bool]]) -> None:
    """Whatever the names (numbered or not, padded or not, repeated, non-ASCII digits),
    the runs stand for exactly the hosts, in order, and every run is at least 4 long."""
    hosts: list[str] = []
    for name, count, counting in pieces:
        m = task_codec._NUMBERED.fullmatch(name)
        if counting and m is not None:
            hosts += [f"{m[1]}{int(m[2]) + k:0{len(m[2])}d}" for k in range(count)]
        else:
            hosts += [name] * count
    items = task_codec.host_runs(hosts, task_codec.HostNumbers())
    assert task_codec.hosts_of(items) == hosts
    assert all(type(i) is str or i[2] >= task_codec.HOST_RUN_MIN for i in items)
    if len(hosts) >= task_codec.RUN_MIN:
        tasks = tuple(Task(i, h) for i, h in enumerate(hosts))
        fact = JobTracked("9", 0.0, "u", 1, 10**6, tasks, 0.0)
        assert converters.decode_fact(converters.encode_fact(fact)) == fact


@pytest.mark.parametrize(
    "item",
    [
        ["n", -1, 5, 2],
        ["n", 0, 0, 2],
        ["n", 0, 5, 0],
        ["n", 0, 5, 19],
        ["n" * 256, 0, 5, 2],
        ["n", 10**18, 5, 18],
        ["n", 0, 5],
        ["n", 0, 5, 2, 1],
        [1, 0, 5, 2],
        ["n", True, 5, 2],
        ["n", 0, 5.0, 2],
        ["n", 0, (1 << 24) + 1, 2],
        {"n": 1},
        7,
    ],
)
def test_a_malformed_run_of_hosts_is_refused(item: object) -> None:
    """A run the writer never makes, or one standing for more hosts than a reader will
    build, fails the fact's decoding (a damaged or hostile record changes nothing)."""
    with pytest.raises(errors.JournalError, match="undecodable fact"):
        converters.decode_fact(_tracked({"first": 0, "hosts": ["a", item]}))


def test_runs_together_may_not_stand_for_more_hosts_than_a_reader_builds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(task_codec, "HOSTS_MAX", 100)
    for hosts in ([["n", 0, 60, 2], ["n", 0, 41, 2]], [["n", 0, 60, 2], ["n", 0, 40, 2], "x"]):
        with pytest.raises(errors.JournalError, match="undecodable fact"):
            converters.decode_fact(_tracked({"first": 0, "hosts": hosts}))
    assert (
        len(converters.decode_fact(_tracked({"first": 0, "hosts": [["n", 0, 100, 2]]})).tasks)
        == 100
    )


@pytest.mark.parametrize(
    "tasks",
    [
        {"ids": [[0, 2]], "hosts": ["a"]},  # more ids than hosts
        {"ids": [[0, 1]], "hosts": ["a", "b"]},
        {"ids": [[0, 0]], "hosts": []},
        {"ids": [[0, 1, 2]], "hosts": ["a"]},
        {"ids": [["0", 1]], "hosts": ["a"]},
        {"ids": [[0, True]], "hosts": ["a"]},
        {"ids": [0, 1], "hosts": ["a"]},
        {"ids": {"0": 1}, "hosts": ["a"]},
        {"ids": [[0, (1 << 24) + 1]], "hosts": ["a"]},
        {"ids": [[0, 1]], "hosts": ["a"], "first": 0},
        {"ids": [[0, 1]]},
    ],
)
def test_malformed_stretches_of_ids_are_refused(tasks: object) -> None:
    with pytest.raises(errors.JournalError, match="undecodable fact"):
        converters.decode_fact(_tracked(tasks))


def test_equal_long_allocations_decode_to_one_tuple() -> None:
    """A long allocation decoded again from equal JSON is the tuple decoded before
    (replaying a job decodes each allocation up to three times); different JSON is a
    different, correct tuple; short allocations (pairs) are decoded each time."""
    hosts = [f"n{i:04d}" for i in range(300)]
    fact = JobTracked("9", 0.0, "u", 1, 999, tuple(Task(i, h) for i, h in enumerate(hosts)), 0.0)
    data = converters.encode_fact(fact)
    first, again = converters.decode_fact(data), converters.decode_fact(data)
    assert first == fact and again.tasks is first.tasks
    moved = attrs.evolve(fact, tasks=tuple(Task(i + 1, h) for i, h in enumerate(hosts)))
    other = converters.decode_fact(converters.encode_fact(moved))
    assert other == moved and other.tasks is not first.tasks
    short = attrs.evolve(fact, tasks=fact.tasks[:3])
    a, b = (converters.decode_fact(converters.encode_fact(short)) for _ in range(2))
    assert a == b == short and a.tasks is not b.tasks


def test_the_decoded_allocations_kept_stay_within_their_budget() -> None:
    decode = task_codec.DecodedTasks(budget=600)
    runs = [{"first": k, "hosts": [["n", 0, 256, 3]]} for k in range(4)]
    made = [decode(r, None) for r in runs]
    assert [t[0].id for t in made] == [0, 1, 2, 3] and all(len(t) == 256 for t in made)
    assert decode._keep.tasks <= 600 and len(decode._keep.items) == 2  # the two newest
    assert decode(runs[3], None) is made[3] and decode(runs[0], None) == made[0]
    assert decode({"first": 0, "hosts": [["n", 0, 700, 3]]}, None) is not None  # over: not kept
    assert decode._keep.tasks <= 600


def test_the_host_names_kept_stay_within_their_bounds() -> None:
    """Past its bound on names, the encoder parses new names each time (same runs);
    past its bound on kinds (prefix and digits), a new kind's names stay names."""
    numbers = task_codec.HostNumbers(names=3, kinds=1)
    hosts = [f"n{i:02d}" for i in range(10)]
    assert task_codec.host_runs(hosts, numbers) == [["n", 0, 10, 2]]
    assert len(numbers) == 3
    assert task_codec.host_runs(hosts, numbers) == [["n", 0, 10, 2]]
    other = [f"m{i}" for i in range(5)]
    assert task_codec.host_runs(other, numbers) == other
    assert task_codec.hosts_of(task_codec.host_runs(hosts + other, numbers)) == hosts + other
