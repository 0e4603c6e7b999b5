"""Drain before stop and job events over real HTTP (uvicorn on loopback, the embedded
controller in simulated time, the real plugin): the release's ``grace``, the
``drained`` route, the events long poll, and every bad input answered 4xx with
nothing changed (docs/rest-api.md, docs/in-job-api.md)."""

from __future__ import annotations

import time
import urllib.parse
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from xce_resize_plugin import errors
from xce_resize_plugin.controllers.sim import EmbeddedController, ScriptedNotificationRunner
from xce_resize_plugin.core import audit
from xce_resize_plugin.core.models import DrainedRequest, GrowRequest, ReleaseRequest
from xce_resize_plugin.host import HostHooks, Principal
from xce_resize_plugin.manager import get_plugin_manager
from xce_resize_plugin.recording import format as recording_format

from . import test_api
from .live_api import HOSTS, Cluster, LiveServer, Switch
from .test_api import assert_problem, call, path

# The same module-wide server and per-test HTTP client as test_api.py.
server = test_api.server
http = test_api.http


@pytest.fixture
def cluster(tmp_path: Path, server: tuple[LiveServer, Switch]) -> Iterator[Cluster]:
    c = Cluster(tmp_path, {"max_stop_grace": 120})
    server[1].target = c.app
    yield c
    c.stop()


def events_path(job: str) -> str:
    return f"/v1/jobs/{urllib.parse.quote(job, safe='')}/events"


def events(http: httpx.Client, job: str, token: str = "tok-job1", **params: Any) -> Any:
    r = call(http, "GET", events_path(job), token, params={"timeout": 0, **params})
    assert r.status_code == 200, r.text
    return r.json()


def _release(http: httpx.Client, job: str, grace: float) -> httpx.Response:
    return call(http, "POST", path(job, "/release"), json={"task_ids": [1], "grace": grace})


def _grown(cluster: Cluster, http: httpx.Client) -> None:
    """job1 grows to 3 tasks on hA (task ids 0, 1, 2)."""
    assert call(http, "POST", path(cluster.job1, "/grow"), json={"tasks": 1}).status_code == 202
    cluster.settle()


def test_a_release_drains_until_the_job_says_drained(cluster: Cluster, http: httpx.Client) -> None:
    r = _release(http, cluster.job1, 60)
    assert r.status_code == 202 and r.json()["phase"] == "SHRINK_DRAINING"
    cluster.settle()
    got = events(http, cluster.job1)
    assert [e["type"] for e in got] == ["release_coming"]
    assert got[0]["task_ids"] == [1] and got[0]["deadline"] == got[0]["time"] + 60
    # Still draining after a cycle: the task runs on and is charged.
    status = call(http, "GET", path(cluster.job1)).json()
    assert status["phase"] == "SHRINK_DRAINING" and len(status["tasks"]) == 2
    r = call(http, "POST", path(cluster.job1, "/drained"), "tok-job1", json={"task_ids": [1]})
    assert r.status_code == 200 and r.json()["phase"] == "SHRINK_STOPPING"
    cluster.settle()
    later = events(http, cluster.job1, after=got[-1]["seq"])
    assert [e["type"] for e in later] == ["tasks_exited", "size_changed"]
    assert later[-1]["tasks_before"] == 2 and later[-1]["tasks_after"] == 1
    assert [e["seq"] for e in later] == [2, 3]


def test_hook_xce_resize_events(cluster: Cluster, http: httpx.Client) -> None:
    """The hook answers the job's events from the journal's facts, after a cursor."""
    _grown(cluster, http)
    hooks = HostHooks(cluster.ctl.plugin_manager)
    found = hooks.resize_events(cluster.ctl, cluster.job1, 0)  # type: ignore[arg-type]
    assert found is not None
    assert [e.type for e in found] == ["grow_placed", "grow_committed", "size_changed"]
    assert found[1].data["task_ids"] == [2]
    again = hooks.resize_events(cluster.ctl, cluster.job1, 2)  # type: ignore[arg-type]
    assert again is not None and [e.seq for e in again] == [3]
    assert hooks.resize_events(cluster.ctl, "nosuchjob", 0) is None  # type: ignore[arg-type]


def test_the_events_long_poll_answers_the_next_event(cluster: Cluster, http: httpx.Client) -> None:
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(
            call, http, "GET", events_path(cluster.job1), "tok-job1", params={"timeout": 20}
        )
        time.sleep(0.3)
        assert not waiting.done()  # nothing happened yet: the poll holds
        _grown(cluster, http)
        r = waiting.result(timeout=25)
    assert r.status_code == 200
    assert r.json()[0]["type"] == "grow_placed" and r.json()[0]["seq"] == 1


@pytest.mark.parametrize(
    ("after", "code"),
    [("5", "XCE_RESIZE_EVENT_CURSOR"), ("-1", "XCE_RESIZE_EVENT_CURSOR"), ("x", None)],
)
def test_an_unknown_event_cursor_is_refused(
    cluster: Cluster, http: httpx.Client, after: str, code: str | None
) -> None:
    _grown(cluster, http)
    before = cluster.snapshot()
    r = call(http, "GET", events_path(cluster.job1), "tok-job1", params={"after": after})
    assert_problem(r, 400, code or "XCE_RESIZE_INVALID_REQUEST")
    if code == "XCE_RESIZE_EVENT_CURSOR":
        assert "unknown event cursor" in r.json()["detail"].lower()
    assert cluster.snapshot() == before


def test_a_grace_above_the_maximum_changes_nothing(cluster: Cluster, http: httpx.Client) -> None:
    _grown(cluster, http)
    before = cluster.snapshot()
    doc = assert_problem(_release(http, cluster.job1, 121), 400, "XCE_RESIZE_GRACE_TOO_LONG")
    assert "max_stop_grace 120" in doc["detail"]
    for bad in ("10", True, -1, None):
        r = call(http, "POST", path(cluster.job1, "/release"), json={"count": 1, "grace": bad})
        if bad is None:
            # null is the job's default (0): a valid release; undo nothing, stop here.
            assert r.status_code == 202
            break
        assert_problem(r, 400, "XCE_RESIZE_INVALID_REQUEST")
        assert cluster.snapshot() == before


def test_drained_for_tasks_not_draining_changes_nothing(
    cluster: Cluster, http: httpx.Client
) -> None:
    _grown(cluster, http)
    drained = path(cluster.job1, "/drained")
    before = cluster.snapshot()
    # No release at all.
    assert_problem(
        call(http, "POST", drained, "tok-job1", json={"task_ids": [1]}),
        409,
        "XCE_RESIZE_NOT_DRAINING",
    )
    assert _release(http, cluster.job1, 60).status_code == 202
    cluster.settle()
    before = cluster.snapshot()
    for ids in ([0], [2], [1, 9]):
        r = call(http, "POST", drained, "tok-job1", json={"task_ids": ids})
        assert_problem(r, 409, "XCE_RESIZE_NOT_DRAINING")
    for body in ({"task_ids": []}, {"task_ids": ["1"]}, {"tasks": [1]}, {"task_ids": [True]}):
        assert_problem(
            call(http, "POST", drained, "tok-job1", json=body), 400, "XCE_RESIZE_INVALID_REQUEST"
        )
    assert cluster.snapshot() == before


def test_another_jobs_token_reaches_neither_route(cluster: Cluster, http: httpx.Client) -> None:
    assert _release(http, cluster.job1, 60).status_code == 202
    cluster.settle()
    before = cluster.snapshot()
    r = call(http, "POST", path(cluster.job1, "/drained"), "tok-job2", json={"task_ids": [1]})
    assert_problem(r, 404, "LSBE_NO_JOB")
    r = call(http, "GET", events_path(cluster.job1), "tok-job2", params={"timeout": 0})
    assert_problem(r, 404, "LSBE_NO_JOB")
    r = call(http, "GET", events_path(cluster.job1), None)
    assert r.status_code == 401
    assert cluster.snapshot() == before
    # The owner and an administrator see the events.
    assert events(http, cluster.job1, "tok-alice") == events(http, cluster.job1, "tok-admin")


# --- simulated time: the deadline is a timeline entry --------------------------------


def _sim(tmp_path: Path, **config: Any) -> EmbeddedController:
    cfg = {"journal_sync": False, "stop_grace": 0, **config}
    ctl = EmbeddedController(
        get_plugin_manager(cfg, entry_points=False), tmp_path, hosts=HOSTS, config=cfg
    )
    return ctl


def test_in_simulated_time_the_stop_comes_at_the_deadline(tmp_path: Path) -> None:
    ctl = _sim(tmp_path)
    job = ctl.submit("alice", "1,8", resizable=True, alloc={"hA": 3}, grace=45.0)
    ctl.settle()
    ctl.request_resize(Principal("alice"), job, ReleaseRequest(task_ids=(2,)))
    ctl.run(until=44.0)
    assert ctl.job(job).slots == 3  # draining: still charged
    ctl.run(until=100.0)
    view = ctl.job(job)
    assert [t.id for t in view.tasks] == [0, 1] and view.versions[-1].time == 45.0
    ctl.stop()
    # journal verify replays the new facts to the stored state.
    assert audit.replay_problems(tmp_path / "resize") == []


def test_recordings_keep_drain_times_and_acknowledgements() -> None:
    """A recording's request lines carry a release's grace and a drained request, and
    read back the same; a release without grace keeps the line it always had."""
    for request in (
        ReleaseRequest(task_ids=(2,), grace=30.0),
        DrainedRequest((2, 3)),
        ReleaseRequest(count=1),
    ):
        line = recording_format.request_json(request)
        assert recording_format.request_from_json(line) == request
    assert "grace" not in recording_format.request_json(ReleaseRequest(count=1))


def test_a_job_grace_above_the_maximum_is_refused_at_submission(tmp_path: Path) -> None:
    ctl = _sim(tmp_path, max_stop_grace=10)
    with pytest.raises(errors.GraceTooLong):
        ctl.submit("alice", "1,8", resizable=True, alloc={"hA": 2}, grace=11.0)
    assert ctl.jobs() == []
    ctl.stop()


def test_the_notification_names_the_task_ids_of_every_change(tmp_path: Path) -> None:
    """XCE_RESIZE_TASK_IDS beside LSB_RESIZE_HOSTS: a grow, a release, and the
    notification for information after a host failure (the lost tasks)."""
    cfg = {"journal_sync": False, "stop_grace": 0}
    notifier = ScriptedNotificationRunner()
    ctl = EmbeddedController(
        get_plugin_manager(cfg, entry_points=False),
        tmp_path,
        hosts=HOSTS,
        config=cfg,
        notification_runner=notifier,
    )
    job = ctl.submit("alice", "1,8", resizable=True, alloc={"hA": 2, "hB": 2}, notify_cmd="n")
    ctl.settle()
    alice = Principal("alice")
    ctl.request_resize(alice, job, GrowRequest(2, 2, notify_cmd="n"))
    ctl.settle()
    ctl.request_resize(alice, job, ReleaseRequest(task_ids=(1,)))
    ctl.settle()
    ctl.host_down("hB")
    ctl.settle()
    seen = [
        (r.env["LSB_RESIZE_EVENT"], r.env["LSB_RESIZE_HOSTS"], r.env["XCE_RESIZE_TASK_IDS"])
        for r in notifier.requests
    ]
    assert seen[0][0] == "grow" and seen[0][2] == "4,5"
    assert seen[1] == ("shrink", "hA 1", "1")
    assert seen[2] == ("shrink", "hB 2", "2,3")  # for information: already gone
    ctl.stop()
