"""Operating the live controller (docs/operations.md), on a real controller process:
``GET /metrics`` moves with what happens (a grow, a refused grow, a vetoed shrink) and
answers only administrators and the scrape token; ``--log-format json`` writes one JSON
object per line, and the lines about a request carry its id (the client's
``X-Request-ID``, echoed), its user and its job; no token ever reaches the log; without
prometheus-client the controller serves everything but ``/metrics``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from xce_resize_plugin.testing.live import ALICE, BOB, ROOT, SLEEPER, LiveCluster, wait_until

SCRAPE = "scrape-token-0123456789"
JSON_LOG = ["--log-format", "json", "--access-log"]


def scrape(live: LiveCluster, token: str = ROOT) -> dict[tuple[str, tuple[Any, ...]], float]:
    """Every sample of ``GET /metrics``: (name, sorted labels) -> value."""
    answer = httpx.get(live.url("/metrics"), headers={"Authorization": f"Bearer {token}"})
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"].startswith("text/plain; version=")
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(answer.text)
        for s in family.samples
    }


def value(samples: dict[tuple[str, tuple[Any, ...]], float], name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def vetoed_shrink(live: LiveCluster, job_id: str) -> None:
    """Release task 1 with a notification command that refuses (exit 3)."""
    answer = live.release(job_id, task_ids=[1], notify_cmd="exit 3")
    assert answer.status_code == 202, answer.text

    def vetoed() -> bool:
        job = live.job(job_id)
        return job["resize"]["phase"] == "IDLE" and len(job["notifications"]) == 1

    wait_until(vetoed, 10, "the vetoed shrink")


def test_metrics_move_with_a_grow_a_refusal_and_a_veto(resize_live_factory: Any) -> None:
    live: LiveCluster = resize_live_factory(controller=f'metrics_token = "{SCRAPE}"')
    live.start()
    before = scrape(live, SCRAPE)
    assert value(before, "xce_resize_requests_total", kind="grow", code="OK") == 0
    assert value(before, "xce_slots_capacity", host_state="up") == 4
    job_id = live.submit(min_tasks=1, max_tasks=2, resizable=True, alloc={"h1": 1})
    live.running(job_id, 1)
    assert live.grow(job_id, 1).status_code == 202
    live.idle(job_id, 1)
    refused = live.grow(job_id, 5)
    assert refused.status_code >= 400
    code = refused.json()["code"]
    vetoed_shrink(live, job_id)

    after = scrape(live)
    assert value(after, "xce_resize_requests_total", kind="grow", code="OK") == 1
    assert value(after, "xce_resize_requests_total", kind="grow", code=code) == 1
    assert value(after, "xce_resize_requests_total", kind="release", code="OK") == 1
    grow_route = {"route": "/v1/jobs/{id}/resize/grow", "method": "POST"}
    assert value(after, "xce_http_requests_total", status="202", **grow_route) == 1
    assert value(after, "xce_http_requests_total", status=str(refused.status_code), **grow_route)
    assert value(after, "xce_http_request_duration_seconds_count", **grow_route) == 2
    assert value(after, "xce_resize_changes_total", kind="grow", outcome="committed") == 1
    assert value(after, "xce_resize_changes_total", kind="shrink", outcome="failed") == 1
    assert value(after, "xce_resize_phase_duration_seconds_count", phase="GROW_PENDING") == 1
    assert value(after, "xce_resize_phase_duration_seconds_count", phase="SHRINK_NOTIFYING") == 1
    assert value(after, "xce_resize_notifications_total", result="exit") == 1
    assert value(after, "xce_resize_notification_duration_seconds_count") == 1
    # Each durable write is one fsync; the grow alone took several transitions.
    fsyncs = value(after, "xce_journal_fsyncs_total")
    assert fsyncs >= 3 and value(after, "xce_journal_commit_duration_seconds_count") == fsyncs
    assert value(after, "xce_journal_committed_entries_total") >= fsyncs
    # Read from the controller when scraped: the job holds 2 of the 4 slots.
    assert value(after, "xce_slots_used", host_state="up") == 2
    assert value(after, "xce_slots_free", host_state="up") == 2
    assert value(after, "xce_hosts", host_state="down") == 0
    assert value(after, "xce_user_slots_used", user="alice") == 2
    assert value(after, "xce_resize_pending_grows") == 0
    assert value(after, "xce_resize_changes_in_flight", phase="GROW_STARTING") == 0


def test_a_pending_grow_is_a_gauge(resize_live_factory: Any) -> None:
    live: LiveCluster = resize_live_factory({"h1": 1})
    live.start()
    job_id = live.submit(min_tasks=1, max_tasks=2, resizable=True, alloc={"h1": 1})
    live.running(job_id, 1)
    assert live.grow(job_id, 1).status_code == 202  # the cluster is full: it pends
    assert value(scrape(live), "xce_resize_pending_grows") == 1
    assert live.call("DELETE", f"/v1/jobs/{job_id}/resize/pending").status_code == 200
    after = scrape(live)
    assert value(after, "xce_resize_pending_grows") == 0
    assert value(after, "xce_resize_phase_duration_seconds_count", phase="GROW_PENDING") == 1
    assert value(after, "xce_resize_requests_total", kind="cancel", code="OK") == 1


def test_metrics_answer_administrators_and_the_scrape_token_only(
    resize_live_factory: Any,
) -> None:
    live: LiveCluster = resize_live_factory(controller=f'metrics_token = "{SCRAPE}"')
    live.start(args=["--access-log"])  # text lines, one per request
    job = live.ok("POST", "/v1/jobs", ALICE, {"command": SLEEPER, "tasks": 1})
    for token, status in (
        (None, 401),
        ("not-a-token-at-all", 401),
        (ALICE, 403),
        (BOB, 403),
        (job["token"], 403),
        (ROOT, 200),
        (SCRAPE, 200),
    ):
        headers = {} if token is None else {"Authorization": f"Bearer {token}"}
        answer = httpx.get(live.url("/metrics"), headers=headers)
        assert answer.status_code == status, (token, answer.text)
        if status == 401:
            assert answer.headers["www-authenticate"] == 'Bearer realm="xce"'
        if status != 200:
            assert answer.headers["content-type"].startswith("application/problem+json")
    # The scrape token opens /metrics and nothing else.
    assert live.call("GET", "/v1/jobs", SCRAPE).status_code == 401
    assert live.call("GET", f"/v1/jobs/{job['id']}", SCRAPE).status_code == 401
    assert "/metrics" in live.ok("GET", "/openapi.json", ROOT)["paths"]
    text = live.logs()
    assert " controller INFO xce_resize_plugin.access: GET /metrics 403 " in text
    assert_no_token_in(text, job["token"])


def assert_no_token_in(text: str, *more: str) -> None:
    for token in (ALICE, BOB, ROOT, SCRAPE, *more):
        assert token not in text, token


def json_lines(live: LiveCluster) -> list[dict[str, Any]]:
    """Every line of the controller's log, each of which must be one JSON object."""
    text = (live.tmp / f"controller-{live.runs}.log").read_text()
    lines = [json.loads(line) for line in text.splitlines()]
    for line in lines:
        assert {"time", "level", "logger", "message"} <= set(line), line
    return lines


def test_json_log_lines_name_the_request_its_user_and_its_job(resize_live_factory: Any) -> None:
    live: LiveCluster = resize_live_factory(controller=f'metrics_token = "{SCRAPE}"')
    live.start(args=JSON_LOG)
    job = live.ok(
        "POST",
        "/v1/jobs",
        ALICE,
        {"command": SLEEPER, "min_tasks": 1, "max_tasks": 2, "resizable": True, "alloc": {"h1": 1}},
    )
    job_id = job["id"]
    live.running(job_id, 1)
    url = live.url(f"/v1/jobs/{job_id}/resize/grow")
    grow = httpx.post(
        url,
        json={"tasks": 1},
        headers={"Authorization": f"Bearer {job['token']}", "X-Request-ID": "trace-42"},
    )
    assert grow.status_code == 202 and grow.headers["x-request-id"] == "trace-42"
    forged = httpx.get(
        live.url(f"/v1/jobs/{job_id}"),
        headers={"Authorization": f"Bearer {ALICE}", "X-Request-ID": "forged\tid"},
    )
    new_id = forged.headers["x-request-id"]
    assert new_id != "forged\tid" and len(new_id) == 16
    httpx.get(live.url("/metrics"), headers={"Authorization": f"Bearer {SCRAPE}"})
    httpx.get(live.url("/v1/jobs"), headers={"Authorization": "Bearer wrong-token-000"})
    live.idle(job_id, 1)

    lines = json_lines(live)
    (line,) = [x for x in lines if x.get("request_id") == "trace-42"]
    assert line["logger"] == "xce_resize_plugin.access"
    assert line["message"].startswith(f"POST /v1/jobs/{job_id}/resize/grow 202 ")
    assert (line["user"], line["job"]) == ("alice", job_id)
    (line,) = [x for x in lines if x.get("request_id") == new_id]
    assert (line["user"], line["job"]) == ("alice", job_id)
    (submitted,) = [x for x in lines if x["message"].startswith("POST /v1/jobs 201")]
    assert (submitted["user"], submitted["job"]) == ("alice", job_id)
    (scraped,) = [x for x in lines if x["message"].startswith("GET /metrics 200")]
    assert scraped["user"] == "metrics-token" and "job" not in scraped
    assert_no_token_in(live.logs(), job["token"])


def test_without_prometheus_client_all_but_metrics_is_served(
    resize_live_factory: Any, tmp_path: Path
) -> None:
    """The ``live`` extra brings prometheus-client; a controller whose Python lacks it
    says so in its log and serves everything else."""
    blocker = tmp_path / "no-prometheus" / "prometheus_client"
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text('raise ImportError("prometheus_client blocked")\n')
    live: LiveCluster = resize_live_factory()
    live.start(env={"PYTHONPATH": str(blocker.parent)})
    assert (
        httpx.get(live.url("/metrics"), headers={"Authorization": f"Bearer {ROOT}"}).status_code
        == 404
    )
    job_id = live.submit(min_tasks=1, max_tasks=2, resizable=True, alloc={"h1": 1})
    live.running(job_id, 1)
    assert live.grow(job_id, 1).status_code == 202
    live.idle(job_id, 1)
    text = live.logs()
    assert "no metrics (GET /metrics is not served): prometheus_client blocked" in text
    assert "xce_resize_plugin.access" not in text  # no access lines without --access-log
