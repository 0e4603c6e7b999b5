"""A job's events as the runtime serves them, kept between polls, against the whole
projection of its journal facts (docs/in-job-api.md, "Job events"): the embedded
controller in simulated time, the real plugin and a real LMDB journal.

A poll projects only the job's facts after the last one it projected; another job's
facts cost it nothing; an answer holds at most a page of events, and a reader that
follows ``seq`` gets every event once, in order, across pages, after a restart too."""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from xce_resize_plugin.controllers.sim import EmbeddedController
from xce_resize_plugin.controllers.task_records import LIVE_STATES
from xce_resize_plugin.core import converters
from xce_resize_plugin.core import events as job_events
from xce_resize_plugin.core.facts import Fact
from xce_resize_plugin.core.models import CancelRequest, GrowRequest, ReleaseRequest
from xce_resize_plugin.errors import ResizeError
from xce_resize_plugin.host import Principal
from xce_resize_plugin.injob import ResizeClient
from xce_resize_plugin.injob.aio import AsyncResizeClient
from xce_resize_plugin.manager import get_plugin_manager
from xce_resize_plugin.plugin import runtime_of
from xce_resize_plugin.rest.client import Client
from xce_resize_plugin.runtime import phases

from . import test_api
from .live_api import Cluster, LiveServer, Switch
from .test_api import call, path

CONFIG = {"journal_sync": False, "stop_grace": 0}
ALICE = Principal("alice")

# The same module-wide server, per-test cluster and HTTP client as test_api.py.
server = test_api.server
http = test_api.http
cluster = test_api.cluster


def _controller(state_dir: Path, hosts: dict[str, int] | None = None) -> EmbeddedController:
    pm = get_plugin_manager(CONFIG, entry_points=False)
    # Without hosts: a restart, the hosts come from the store.
    return EmbeddedController(pm, state_dir, hosts=hosts, config=CONFIG, strict=True)


def whole(ctl: EmbeddedController, job_id: str) -> list[job_events.JobEvent]:
    """The job's events as the whole projection of its facts gives them (what every
    poll answered before the projection was kept)."""
    journal = runtime_of(ctl).journal
    facts: list[Fact] = [converters.decode_fact(d) for _, d in journal.job_facts(job_id)]
    return job_events.project(facts)


def poll(ctl: EmbeddedController, job_id: str, after: int | None) -> list[job_events.JobEvent]:
    found = runtime_of(ctl).events(job_id, after)
    assert found is not None
    return found


def read_all(ctl: EmbeddedController, job_id: str, after: int = 0) -> list[job_events.JobEvent]:
    """Every event after ``after``, a page at a time, as a reader follows ``seq``."""
    out: list[job_events.JobEvent] = []
    while page := poll(ctl, job_id, after):
        assert len(page) <= phases.EVENT_PAGE
        out += page
        after = page[-1].seq
    return out


@pytest.fixture
def small(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pages, tails, marks and the cache so small that every path is taken."""
    monkeypatch.setattr(phases, "EVENT_PAGE", 3)
    monkeypatch.setattr(phases, "_EVENT_TAIL", 2)
    monkeypatch.setattr(phases, "_EVENT_MARKS", 1)
    monkeypatch.setattr(phases, "_EVENT_CACHE", 1)


# --- the kept projection is the whole projection --------------------------------------

_ops = st.lists(
    st.tuples(
        st.sampled_from(
            ("grow", "cancel", "release", "drained", "exit", "settle", "advance", "poll", "read")
        ),
        st.integers(0, 1),  # which job
        st.integers(0, 9),  # a count, a task, a cursor
    ),
    min_size=5,
    max_size=50,
)


def _act(ctl: EmbeddedController, job_id: str, op: str, n: int) -> None:
    """One host or job action; a refused one changes nothing."""
    try:
        if op == "grow":
            ctl.request_resize(ALICE, job_id, GrowRequest(1, 1 + n % 2, cancel_pending=n > 6))
        elif op == "cancel":
            ctl.request_resize(ALICE, job_id, CancelRequest())
        elif op == "release":
            grace = 5.0 if n % 2 else None
            ctl.request_resize(ALICE, job_id, ReleaseRequest(count=1, grace=grace))
        elif op == "exit":
            states = ctl.job(job_id).task_states
            ids = [i for i, rec in sorted(states.items()) if i != 0 and rec in LIVE_STATES]
            if ids:
                ctl.inject_task_exit(job_id, ids[n % len(ids)], status=n)
        elif op == "advance":
            ctl.advance(1.0 + n)
        else:
            ctl.settle()
    except ResizeError:
        pass


def _check_poll(ctl: EmbeddedController, job_id: str, n: int) -> None:
    """A poll from anywhere in the job's events answers the whole projection's page."""
    events = whole(ctl, job_id)
    after = None if n == 9 else len(events) * n // 8
    expected = job_events.after_cursor(events, after)[: phases.EVENT_PAGE]
    assert poll(ctl, job_id, after) == expected


def _run(ops: list[tuple[str, int, int]], state_dir: Path) -> None:
    ctl = _controller(state_dir, {"h1": 4, "h2": 4, "h3": 2})
    jobs = [
        ctl.submit("alice", "1,6", resizable=True, alloc={"h1": 2}),
        ctl.submit("alice", "1,6", resizable=True, release_exited=True, alloc={"h2": 2}),
    ]
    ctl.settle()
    readers = [0, 0]  # the last seq each job's reader has
    for op, which, n in ops:
        job_id = jobs[which]
        if op == "poll":
            _check_poll(ctl, job_id, n)
        elif op == "read":
            page = poll(ctl, job_id, readers[which])
            assert page == whole(ctl, job_id)[readers[which] :][: phases.EVENT_PAGE]
            readers[which] = page[-1].seq if page else readers[which]
        else:
            _act(ctl, job_id, op, n)
    ctl.settle()
    for job_id in jobs:
        ctl.finish(job_id)
    ctl.settle()
    for which, job_id in enumerate(jobs):
        events = whole(ctl, job_id)
        assert read_all(ctl, job_id, readers[which]) == events[readers[which] :]
        assert read_all(ctl, job_id) == events
        if events:
            assert events[-1].type == "job_ended"
    ctl.stop()


@settings(max_examples=50, deadline=None)
@given(ops=_ops)
def test_polls_answer_the_whole_projection(ops: list[tuple[str, int, int]]) -> None:
    """Whatever the two jobs do and wherever the polls fall: each answer is the whole
    projection's events after the cursor, a page at most (default sizes)."""
    with tempfile.TemporaryDirectory() as state_dir:
        _run(ops, Path(state_dir))


@settings(max_examples=50, deadline=None)
@given(ops=_ops, jobs=st.integers(1, 2), budget=st.integers(0, 4))
def test_polls_answer_the_whole_projection_through_small_pages(
    ops: list[tuple[str, int, int]], jobs: int, budget: int
) -> None:
    """The same with pages of 3 events, tails of 2, one mark, a cache of ``jobs`` jobs
    (with one, the two jobs' polls evict each other's projection) and a ``budget`` of
    events kept (the other job's tail dropped): pages from the tail, from a mark, from
    the job's first fact, and projections rebuilt from the journal."""
    with pytest.MonkeyPatch.context() as mp, tempfile.TemporaryDirectory() as state_dir:
        mp.setattr(phases, "EVENT_PAGE", 3)
        mp.setattr(phases, "_EVENT_TAIL", 2)
        mp.setattr(phases, "_EVENT_MARKS", 1)
        mp.setattr(phases, "_EVENT_CACHE", jobs)
        mp.setattr(phases, "_EVENT_BUDGET", budget)
        _run(ops, Path(state_dir))


# --- the cost of a poll ----------------------------------------------------------------


@pytest.fixture
def decodes(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """How many facts were decoded since the last clear (the runtime decodes each fact
    it projects)."""
    seen: list[int] = []
    decode = converters.decode_fact

    def counting(data: bytes) -> Fact:
        seen.append(1)
        return decode(data)

    monkeypatch.setattr(converters, "decode_fact", counting)
    yield seen


def test_a_poll_reads_only_what_is_new_for_its_job(tmp_path: Path, decodes: list[int]) -> None:
    """After many grow/cancel cycles of one job, a poll after another job's facts
    decodes none of this job's history, and a poll after the job's own new facts
    decodes those only (it decoded the whole history before each)."""
    ctl = _controller(tmp_path, {"h1": 2, "h2": 1})
    busy = ctl.submit("alice", "1,4", resizable=True, alloc={"h1": 2})
    other = ctl.submit("alice", "1,4", resizable=True, alloc={"h2": 1})
    ctl.settle()
    for _ in range(200):  # the cluster is full: each grow pends, then is cancelled
        ctl.request_resize(ALICE, busy, GrowRequest(1, 1))
        ctl.request_resize(ALICE, busy, CancelRequest())
    assert poll(ctl, busy, 0) == []
    assert len(decodes) == 401  # the first poll projects the history, once
    decodes.clear()
    ctl.request_resize(ALICE, other, GrowRequest(1, 1))
    ctl.request_resize(ALICE, other, CancelRequest())
    assert poll(ctl, busy, 0) == []
    assert decodes == []  # another job's facts: nothing of this job's read again
    ctl.request_resize(ALICE, busy, GrowRequest(1, 1))
    ctl.request_resize(ALICE, busy, CancelRequest())
    assert poll(ctl, busy, 0) == []
    assert len(decodes) == 2  # its own two new facts, and only those
    decodes.clear()
    assert poll(ctl, busy, None) == [] and decodes == []  # nothing new: nothing decoded
    ctl.stop()


def test_a_reader_far_behind_pages_through_without_reading_it_all_again(
    tmp_path: Path, decodes: list[int], small: None
) -> None:
    """A reader far behind the tail gets pages: each projected again from where its
    last page ended (a mark), not from the job's first fact."""
    ctl = _controller(tmp_path, {"h1": 8})
    job_id = ctl.submit("alice", "1,8", resizable=True, alloc={"h1": 1})
    ctl.settle()
    for _ in range(10):  # 6 events each: grow_placed, grow_committed, size_changed, ...
        ctl.request_resize(ALICE, job_id, GrowRequest(1, 1))
        ctl.settle()
        ctl.request_resize(ALICE, job_id, ReleaseRequest(count=1))
        ctl.settle()
    events = whole(ctl, job_id)
    assert len(events) == 60
    facts = len(list(runtime_of(ctl).journal.job_facts(job_id)))
    decodes.clear()
    assert read_all(ctl, job_id) == events  # 20 pages of 3
    # The head once, then each fact once more for the pages, give or take the facts
    # around a page's end: far from the 20 times the history a page used to cost.
    assert len(decodes) <= 3 * facts
    ctl.stop()


# --- a restart ----------------------------------------------------------------------


def test_after_a_restart_the_events_are_the_same_and_go_on(tmp_path: Path, small: None) -> None:
    """The kept projection is memory: after a crash the new controller projects the
    job's facts again, with the same seq numbers, and a reader goes on from its last."""
    ctl = _controller(tmp_path, {"h1": 8})
    job_id = ctl.submit("alice", "1,8", resizable=True, alloc={"h1": 1})
    ctl.settle()
    for _ in range(3):
        ctl.request_resize(ALICE, job_id, GrowRequest(1, 1))
        ctl.settle()
    before = read_all(ctl, job_id)
    assert [e.seq for e in before] == list(range(1, 10))
    ctl.close()  # a crash: no stop hook
    again = _controller(tmp_path)
    assert read_all(again, job_id) == before
    assert poll(again, job_id, before[-1].seq) == []
    with pytest.raises(ResizeError, match="after=10; this job's events run from 1 to 9"):
        poll(again, job_id, 10)
    again.request_resize(ALICE, job_id, ReleaseRequest(count=1))
    again.settle()
    more = read_all(again, job_id, before[-1].seq)
    assert [e.type for e in more] == ["release_coming", "tasks_exited", "size_changed"]
    assert [e.seq for e in more] == [10, 11, 12] and more == whole(again, job_id)[9:]
    again.stop()


# --- the in-job clients follow pages ----------------------------------------------------


def test_the_in_job_clients_read_every_event_across_pages(
    cluster: Cluster, server: tuple[LiveServer, Switch], http: Any, small: None
) -> None:
    """Over HTTP, both clients (the one the Dask integration uses included) follow the
    last seq of each page and get every event once, in order, up to job_ended."""
    job = cluster.job1
    for _ in range(3):
        r = call(http, "POST", path(job, "/grow"), json={"tasks": 1})
        assert r.status_code == 202, r.text
        cluster.settle()
        r = call(http, "POST", path(job, "/release"), json={"count": 1})
        assert r.status_code == 202, r.text
        cluster.settle()
    cluster.ctl.finish(job)
    cluster.settle()
    expected = [e.to_json() for e in whole(cluster.ctl.unwrapped, job)]
    assert len(expected) == 19 and expected[-1]["type"] == "job_ended"
    url = server[0].url
    plain = ResizeClient(job, Client(url, "tok-job1"))
    assert list(plain.events(timeout=30)) == expected

    async def read() -> list[dict[str, Any]]:
        async with AsyncResizeClient(job, url, "tok-job1") as client:
            return [event async for event in client.events(after=4, timeout=30)]

    assert asyncio.run(read()) == expected[4:]
