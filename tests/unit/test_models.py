"""The helpers of core.models: frozen views of records, the allocation environment."""

from __future__ import annotations

import attrs
import pytest
from attrs import frozen
from hypothesis import given
from hypothesis import strategies as st

from xce_resize_plugin.core.models import Task, allocation_env, make_tasks, project


@frozen
class _View:
    id: str
    size: int
    note: str = "none"


class _Record:
    def __init__(self) -> None:
        self.id = "101"
        self.size = 4
        self.note = "kept"
        self.extra = "not in the view"


def test_project_copies_same_named_fields_unless_given() -> None:
    assert project(_View, _Record()) == _View("101", 4, "kept")
    assert project(_View, _Record(), size=8) == _View("101", 8, "kept")


def test_project_refuses_a_source_without_a_field() -> None:
    source = _Record()
    del source.note
    with pytest.raises(AttributeError, match="note"):
        project(_View, source)


def test_allocation_env() -> None:
    tasks = (Task(0, "a"), Task(1, "a"), Task(2, "b"))
    assert allocation_env(tasks, 3, resizable=True) == {
        "XCE_HOSTS": "a 2 b 1",
        "LSB_MCPU_HOSTS": "a 2 b 1",
        "LSB_HOSTS": "a a b",
        "XCE_ALLOC_VERSION": "3",
        "LSB_RESIZABLE": "Y",
    }
    assert allocation_env(tasks[:1], 0, resizable=False)["LSB_RESIZABLE"] == "N"


def test_may_act_on_keeps_a_job_token_to_its_own_job() -> None:
    from xce_resize_plugin.core.models import Principal

    token = Principal("alice", job_id="101")
    assert token.may_act_on("101", "alice")
    assert not token.may_act_on("103", "alice")  # another job of the same owner
    assert Principal("alice").may_act_on("103", "alice")
    assert not Principal("bob").may_act_on("103", "alice")
    assert Principal("root", admin=True).may_act_on("103", "alice")


@given(
    st.lists(st.integers(0, 10**6), max_size=40),
    st.lists(st.text(min_size=1, max_size=4), max_size=40),
    st.booleans(),
)
def test_tasks_made_in_bulk_are_the_tasks_made_one_by_one(
    ids: list[int], hosts: list[str], as_iterators: bool
) -> None:
    """``make_tasks`` gives what ``Task(id, host)`` gives for each pair (the shorter
    input ends it): equal, hashed alike, ordered alike, and as frozen."""
    plain = tuple(map(Task, ids, hosts))
    bulk = make_tasks(iter(ids) if as_iterators else ids, iter(hosts) if as_iterators else hosts)
    assert bulk == plain and [hash(t) for t in bulk] == [hash(t) for t in plain]
    assert sorted(bulk) == sorted(plain)
    assert all(
        type(t) is Task and attrs.asdict(t) == attrs.asdict(p)
        for t, p in zip(bulk, plain, strict=True)
    )
    for task in bulk[:1]:
        with pytest.raises(attrs.exceptions.FrozenInstanceError):
            task.id = 1  # type: ignore[misc]


def test_jobinfo_fields_keep_their_positions() -> None:
    """A host may build ``JobInfo`` passing its fields by position: a field added later
    goes last, and none moves (this list only ever grows at its end)."""
    import attrs

    from xce_resize_plugin.core.models import JobInfo

    published = [
        "id",
        "user",
        "state",
        "min_tasks",
        "max_tasks",
        "tasks",
        "resizable",
        "ptile",
        "grow_hosts",
        "notify_cmd",
        "start_time",
        "end_time",
        "env",
        "autoresize",
        "requeued",
        "release_exited",
        "grace",
        "requeues",
    ]
    names = [f.name for f in attrs.fields(JobInfo)]
    assert names[: len(published)] == published
