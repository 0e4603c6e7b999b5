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
from xce_resize_plugin.core import converters
from xce_resize_plugin.core.models import (
    FACT_TYPES,
    ChangeKind,
    Fact,
    GrowPlaced,
    GrowRequest,
    JobTracked,
    NotifyDone,
    ReleaseAccepted,
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
    wrote them) decode to the same tasks."""
    hosts = [f"n{i % 7}" for i in range(converters.RUN_MIN)]
    long = tuple(Task(5 + i, h) for i, h in enumerate(hosts))
    fact = JobTracked("9", 0.0, "u", 1, 999, long, 0.0)
    written = orjson.loads(converters.encode_fact(fact))
    assert written["tasks"] == {"first": 5, "hosts": hosts}
    assert converters.decode_fact(converters.encode_fact(fact)) == fact
    assert converters.decode_fact(_tracked([[t.id, t.host] for t in long])) == fact
    for tasks in (long[:-1], (*long[:-1], Task(999, "n0"))):
        short = JobTracked("9", 0.0, "u", 1, 999, tasks, 0.0)
        pairs = orjson.loads(converters.encode_fact(short))["tasks"]
        assert pairs == [[t.id, t.host] for t in tasks]


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
