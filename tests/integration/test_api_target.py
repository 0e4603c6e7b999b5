"""The target routes and ``if_version`` over real HTTP (uvicorn on loopback, the embedded
controller in simulated time behind it, the real plugin): the happy paths, who may set
a target, and every kind of bad input refused with nothing changed
(docs/in-job-api.md, "A target size")."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from . import test_api
from .live_api import Cluster
from .test_api import assert_problem, call, path

# The resize API's own fixtures: one server for the module, a new cluster per test.
server, cluster, http = test_api.server, test_api.cluster, test_api.http


def status(http: httpx.Client, job: str) -> dict[str, Any]:
    doc: dict[str, Any] = call(http, "GET", path(job)).json()
    return doc


def test_a_target_grows_then_releases_the_preferred_tasks(
    cluster: Cluster, http: httpx.Client
) -> None:
    r = call(http, "PUT", path(cluster.job1, "/target"), json={"tasks": 5})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["target"] == {"tasks": 5, "release_prefer": []}
    assert body["pending"]["max"] == 3 and body["demand"] == body["pending"]
    cluster.settle()
    body = status(http, cluster.job1)
    assert len(body["tasks"]) == 5 and body["pending"] is None and body["version"] == 1
    assert body["target"]["tasks"] == 5
    r = call(
        http,
        "PUT",
        path(cluster.job1, "/target"),
        json={"tasks": 2, "release_prefer": [4, 3, 1]},
        token="tok-job1",  # the job's own token
    )
    assert r.status_code == 200, r.text
    assert {t["id"] for t in r.json()["in_flight"]["tasks"]} == {1, 3, 4}
    cluster.settle()
    body = status(http, cluster.job1)
    assert [t["id"] for t in body["tasks"]] == [0, 2]
    assert body["target"] == {"tasks": 2, "release_prefer": [4, 3, 1]}
    r = call(http, "DELETE", path(cluster.job1, "/target"), token="tok-admin")
    assert r.status_code == 200 and r.json()["target"] is None
    assert len(r.json()["tasks"]) == 2


def test_if_version_refuses_a_change_on_another_version(
    cluster: Cluster, http: httpx.Client
) -> None:
    before = cluster.snapshot()
    r = call(http, "POST", path(cluster.job1, "/grow"), json={"tasks": 1, "if_version": 3})
    assert_problem(r, 409, "XCE_RESIZE_VERSION_CHANGED")
    r = call(http, "POST", path(cluster.job1, "/release"), json={"count": 1, "if_version": 1})
    assert_problem(r, 409, "XCE_RESIZE_VERSION_CHANGED")
    assert cluster.snapshot() == before
    r = call(http, "POST", path(cluster.job1, "/grow"), json={"tasks": 1, "if_version": 0})
    assert r.status_code == 202, r.text


@pytest.mark.parametrize(
    ("job", "body", "token", "status_code", "code"),
    [
        ("job1", {"tasks": 9}, "tok-alice", 400, "LSBE_RESIZE_BAD_SLOTS_4SLOTS"),
        ("job1", {"tasks": 0}, "tok-alice", 400, "LSBE_RESIZE_BAD_SLOTS_4SLOTS"),
        (
            "job1",
            {"tasks": 1, "release_prefer": [0]},
            "tok-alice",
            400,
            "LSBE_RESIZE_RELEASE_FRISTHOST_4SLOTS",
        ),
        (
            "job1",
            {"tasks": 1, "release_prefer": [7]},
            "tok-alice",
            400,
            "XCE_RESIZE_INVALID_REQUEST",
        ),
        ("job1", {"tasks": "3"}, "tok-alice", 400, "XCE_RESIZE_INVALID_REQUEST"),
        ("job1", {"tasks": None}, "tok-alice", 400, "XCE_RESIZE_INVALID_REQUEST"),
        ("job1", {"release_prefer": [1]}, "tok-alice", 400, "XCE_RESIZE_INVALID_REQUEST"),
        ("job1", {"tasks": 2, "extra": 1}, "tok-alice", 400, "XCE_RESIZE_INVALID_REQUEST"),
        ("job1", [2], "tok-alice", 400, "XCE_RESIZE_INVALID_REQUEST"),
        ("job1", {"tasks": 2}, "tok-job2", 404, "LSBE_NO_JOB"),
        ("job1", {"tasks": 2}, "tok-bob", 404, "LSBE_NO_JOB"),
        ("job1", {"tasks": 2}, None, 401, "XCE_RESIZE_NOT_AUTHENTICATED"),
        ("job3", {"tasks": 2}, "tok-bob", 409, "LSBE_JOB_RESIZABLE"),
    ],
)
def test_bad_targets_are_refused_and_change_nothing(
    cluster: Cluster,
    http: httpx.Client,
    job: str,
    body: Any,
    token: str | None,
    status_code: int,
    code: str,
) -> None:
    job_id = getattr(cluster, job)
    before = cluster.snapshot()
    r = call(http, "PUT", path(job_id, "/target"), json=body, token=token)
    assert_problem(r, status_code, code)
    assert cluster.snapshot() == before
    if status_code == 400:
        assert status(http, job_id)["target"] is None


def test_a_finished_job_takes_no_target(cluster: Cluster, http: httpx.Client) -> None:
    with cluster.ctl.lock:
        cluster.ctl.unwrapped.finish(cluster.job1)
    cluster.settle()
    before = cluster.snapshot()
    r = call(http, "PUT", path(cluster.job1, "/target"), json={"tasks": 2})
    assert_problem(r, 409, "LSBE_JOB_FINISH")
    r = call(http, "DELETE", path(cluster.job1, "/target"))
    assert_problem(r, 409, "LSBE_JOB_FINISH")
    assert cluster.snapshot() == before


def test_clearing_takes_no_body(cluster: Cluster, http: httpx.Client) -> None:
    r = call(
        http,
        "DELETE",
        path(cluster.job1, "/target"),
        content=b'{"tasks": 1}',
        headers={"content-type": "application/json"},
    )
    assert_problem(r, 400, "XCE_RESIZE_INVALID_REQUEST")
