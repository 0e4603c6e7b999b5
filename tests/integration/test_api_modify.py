"""``PATCH /v1/jobs/{id}`` (``xce-resize modify --autoresize | --no-autoresize``) over
real HTTP: who may, what it changes, and every bad request refused with nothing
changed (docs/rest-api.md, "Modify a job")."""

from __future__ import annotations

import urllib.parse
from typing import Any

import httpx
import pytest

from xce_resize_plugin.core import converters
from xce_resize_plugin.core.facts import AutoresizeSet, GrowRequested
from xce_resize_plugin.journal import Journal

from . import test_api as _api
from .live_api import Cluster
from .test_api import ADMIN, assert_problem, call

# The REST tests' fixtures: a real uvicorn server, the cluster behind it, a client.
server = _api.server
cluster = _api.cluster
http = _api.http


def job_path(job: str) -> str:
    return f"/v1/jobs/{urllib.parse.quote(job, safe='')}"


def _facts(c: Cluster, job: str) -> list[Any]:
    with c.ctl.lock, Journal.open(c.state_dir / "resize", readonly=True) as journal:
        return [converters.decode_fact(p) for _, p in journal.job_facts(job)]


@pytest.mark.parametrize("token", ["tok-alice", ADMIN, "tok-job1"])
def test_modify_turns_autoresize_on_and_off(
    cluster: Cluster, http: httpx.Client, token: str
) -> None:
    # job1 runs 2 of 1..8 tasks on hA; nothing else may take hA's other 2 slots.
    r = call(http, "PATCH", job_path(cluster.job1), token, json={"autoresize": True})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["autoresize"] is True and body["demand"] == body["pending"]
    assert (body["demand"]["min"], body["demand"]["max"]) == (1, 6)
    cluster.settle()  # the demand is placed on the free slots
    status = call(http, "GET", job_path(cluster.job1) + "/resize").json()
    assert len(status["tasks"]) == 8 and status["demand"] is None and status["autoresize"]
    r = call(http, "PATCH", job_path(cluster.job1), token, json={"autoresize": False})
    assert r.status_code == 200 and r.json()["autoresize"] is False
    history = call(http, "GET", job_path(cluster.job1) + "/resize/history").json()
    assert history["autoresize"] is False and history["demand"] is None
    switches = [
        (f.enabled, f.reason, f.principal)
        for f in _facts(cluster, cluster.job1)
        if isinstance(f, AutoresizeSet)
    ]
    assert [s[:2] for s in switches] == [(True, "modify"), (False, "modify")]


def test_modify_twice_changes_nothing_the_second_time(cluster: Cluster, http: httpx.Client) -> None:
    # Off while it is off: nothing to do, nothing written.
    seq = cluster.journal_seq()
    r = call(http, "PATCH", job_path(cluster.job1), json={"autoresize": False})
    assert r.status_code == 200 and r.json()["autoresize"] is False
    assert cluster.journal_seq() == seq
    r = call(http, "PATCH", job_path(cluster.job1), json={"autoresize": True})
    assert r.status_code == 200
    seq = cluster.journal_seq()
    r = call(http, "PATCH", job_path(cluster.job1), json={"autoresize": True})
    assert r.status_code == 200 and cluster.journal_seq() == seq
    auto = [f for f in _facts(cluster, cluster.job1) if isinstance(f, GrowRequested) and f.auto]
    assert len(auto) == 1
    assert sum(isinstance(f, AutoresizeSet) for f in _facts(cluster, cluster.job1)) == 1


@pytest.mark.parametrize(
    ("job", "token", "body", "status", "code"),
    [
        # someone else's job is not seen at all (as for every route)
        ("job1", "tok-bob", {"autoresize": True}, 404, "LSBE_NO_JOB"),
        # another job's token reaches its own job only
        ("job1", "tok-job2", {"autoresize": True}, 404, "LSBE_NO_JOB"),
        ("job1", None, {"autoresize": True}, 401, "XCE_RESIZE_NOT_AUTHENTICATED"),
        ("nosuchjob", "tok-alice", {"autoresize": True}, 404, "LSBE_NO_JOB"),
        ("job3", "tok-bob", {"autoresize": True}, 409, "LSBE_JOB_RESIZABLE"),
        ("job1", "tok-alice", {}, 400, "XCE_RESIZE_INVALID_REQUEST"),
        ("job1", "tok-alice", {"autoresize": "yes"}, 400, "XCE_RESIZE_INVALID_REQUEST"),
        ("job1", "tok-alice", {"autoresize": 1}, 400, "XCE_RESIZE_INVALID_REQUEST"),
        ("job1", "tok-alice", {"autoresize": True, "tasks": 2}, 400, "XCE_RESIZE_INVALID_REQUEST"),
        ("job1", "tok-alice", [True], 400, "XCE_RESIZE_INVALID_REQUEST"),
        ("job1", "tok-alice", None, 400, "XCE_RESIZE_INVALID_REQUEST"),
    ],
)
def test_modify_refusals_change_nothing(
    cluster: Cluster,
    http: httpx.Client,
    job: str,
    token: str | None,
    body: Any,
    status: int,
    code: str,
) -> None:
    job_id = {"job1": cluster.job1, "job3": cluster.job3}.get(job, job)
    before = cluster.snapshot()
    kw = {} if body is None else {"json": body}
    r = call(http, "PATCH", job_path(job_id), token, **kw)
    doc = assert_problem(r, status, code)
    if code == "XCE_RESIZE_INVALID_REQUEST" and isinstance(body, dict) and body:
        assert "$." in doc["detail"]  # names the field
    assert cluster.snapshot() == before


def test_modify_of_a_finished_job(cluster: Cluster, http: httpx.Client) -> None:
    with cluster.ctl.lock:
        cluster.ctl.unwrapped.kill(cluster.job2)
    cluster.settle()
    before = cluster.snapshot()
    r = call(http, "PATCH", job_path(cluster.job2), json={"autoresize": True})
    assert_problem(r, 409, "LSBE_JOB_FINISH")
    assert cluster.snapshot() == before
