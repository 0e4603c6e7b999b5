"""``POST /v1/jobs/{id}/tasks/{task_id}/ready`` and a grow's ``wait_ready`` over real
HTTP: the grow is committed only once its new tasks are ready, readiness said twice
writes nothing, and every bad request is refused with nothing changed
(docs/rest-api.md, "Task readiness")."""

from __future__ import annotations

import urllib.parse
from typing import Any

import httpx
import jsonschema
import pytest

from xce_resize_plugin.rest import routes as api

from . import test_api as _api
from .live_api import Cluster
from .test_api import assert_problem, call, path

# The REST tests' fixtures: a real uvicorn server, the cluster behind it, a client.
server = _api.server
cluster = _api.cluster
http = _api.http


def ready_path(job: str, task: object) -> str:
    return f"/v1/jobs/{urllib.parse.quote(job, safe='')}/tasks/{task}/ready"


def _grow_waiting(c: Cluster, http: httpx.Client) -> list[int]:
    """job1 (2 tasks on hA) grows by 2 with wait_ready; its new tasks have started."""
    body = {"tasks": 2, "wait_ready": True, "ready_timeout": 30}
    r = call(http, "POST", path(c.job1, "/grow"), json=body)
    assert r.status_code == 202, r.text
    c.settle()
    status = call(http, "GET", path(c.job1)).json()
    assert status["phase"] == "GROW_STARTING" and status["version"] == 0
    return [t["id"] for t in status["in_flight"]["tasks"]]


def test_a_waiting_grow_commits_when_its_last_task_is_ready(
    cluster: Cluster, http: httpx.Client
) -> None:
    new = _grow_waiting(cluster, http)
    assert new == [2, 3]
    r = call(http, "POST", ready_path(cluster.job1, 2), "tok-job1")
    assert r.status_code == 200, r.text
    assert r.json() == {
        "job_id": cluster.job1,
        "task_id": 2,
        "ready": True,
        "phase": "GROW_STARTING",
        "version": 0,
    }
    cluster.settle()
    assert call(http, "GET", path(cluster.job1)).json()["version"] == 0  # still waiting
    seq = cluster.journal_seq()
    again = call(http, "POST", ready_path(cluster.job1, 2), "tok-job1")
    assert again.status_code == 200 and cluster.journal_seq() == seq  # nothing written
    r = call(http, "POST", ready_path(cluster.job1, 3), "tok-job1")
    assert r.status_code == 200 and r.json()["phase"] == "IDLE" and r.json()["version"] == 1
    assert len(cluster.ctl.job(cluster.job1).tasks) == 4  # the host's view agrees
    records = call(http, "GET", path(cluster.job1, "/history")).json()["records"]
    assert [rec["delta_tasks"] for rec in records] == [[2, 3]]


def test_the_owner_may_say_a_task_is_ready_too(cluster: Cluster, http: httpx.Client) -> None:
    r = call(http, "POST", ready_path(cluster.job1, 0))
    assert r.status_code == 200 and r.json()["ready"] is True


@pytest.mark.parametrize(
    ("job", "task", "token", "kw", "status", "code"),
    [
        ("job1", 9, "tok-job1", {}, 400, "XCE_RESIZE_INVALID_REQUEST"),  # not a task of job1
        ("job1", 0, "tok-job2", {}, 404, "LSBE_NO_JOB"),  # another job's token
        ("job1", 0, "tok-bob", {}, 404, "LSBE_NO_JOB"),
        ("job1", 0, None, {}, 401, "XCE_RESIZE_NOT_AUTHENTICATED"),
        ("job1", "x", "tok-job1", {}, 400, "XCE_RESIZE_INVALID_REQUEST"),
        ("job1", -1, "tok-job1", {}, 400, "XCE_RESIZE_INVALID_REQUEST"),
        ("job1", 2**63, "tok-job1", {}, 400, "XCE_RESIZE_INVALID_REQUEST"),
        ("job1", 0, "tok-job1", {"json": {"ready": True}}, 400, "XCE_RESIZE_INVALID_REQUEST"),
        ("job1", 0, "tok-job1", {"params": {"x": "1"}}, 400, "XCE_RESIZE_INVALID_REQUEST"),
        ("nosuchjob", 0, "tok-alice", {}, 404, "LSBE_NO_JOB"),
    ],
)
def test_ready_refusals_change_nothing(
    cluster: Cluster,
    http: httpx.Client,
    job: str,
    task: object,
    token: str | None,
    kw: dict[str, Any],
    status: int,
    code: str,
) -> None:
    _grow_waiting(cluster, http)
    job_id = {"job1": cluster.job1}.get(job, job)
    before = cluster.snapshot()
    r = call(http, "POST", ready_path(job_id, task), token, **kw)
    assert_problem(r, status, code)
    assert cluster.snapshot() == before


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"tasks": 1, "wait_ready": True, "ready_timeout": 601}, "max_ready_timeout"),
        ({"tasks": 1, "wait_ready": True, "ready_timeout": 0}, "more than 0"),
        ({"tasks": 1, "wait_ready": True, "ready_timeout": "5"}, "$.ready_timeout"),
        ({"tasks": 1, "wait_ready": True, "ready_timeout": True}, "$.ready_timeout"),
        ({"tasks": 1, "wait_ready": "yes"}, "$.wait_ready"),
        ({"tasks": 1, "ready_timeout": 5}, "ready_timeout needs wait_ready"),
    ],
)
def test_bad_wait_ready_grows_are_refused(
    cluster: Cluster, http: httpx.Client, body: dict[str, Any], field: str
) -> None:
    before = cluster.snapshot()
    r = call(http, "POST", path(cluster.job1, "/grow"), json=body)
    doc = assert_problem(r, 400, "XCE_RESIZE_INVALID_REQUEST")
    assert field in doc["detail"]
    assert cluster.snapshot() == before


def test_the_route_is_in_the_openapi_document() -> None:
    doc = api.openapi_paths()
    op = doc["paths"]["/v1/jobs/{id}/tasks/{task_id}/ready"]["post"]
    assert {p["name"] for p in op["parameters"]} == {"id", "task_id"}
    grow = doc["components"]["schemas"]["ResizeGrowRequest"]["properties"]
    assert {"wait_ready", "ready_timeout"} <= set(grow)


def test_a_null_ready_timeout_is_the_default_and_the_schema_says_so(
    cluster: Cluster, http: httpx.Client
) -> None:
    """The handler took null as the default while the schema allowed numbers only."""
    body = {"tasks": 1, "wait_ready": True, "ready_timeout": None}
    assert call(http, "POST", path(cluster.job1, "/grow"), json=body).status_code == 202
    schema = api.openapi_paths()["components"]["schemas"]["ResizeGrowRequest"]
    jsonschema.validate(body, {**schema, "components": api.openapi_paths()["components"]})
