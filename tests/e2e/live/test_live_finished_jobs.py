"""Finished jobs are dropped ``[controller] finished_job_keep`` seconds after their end
(docs/live-controller.md, "Jobs and tasks"): gone from the views, the store and the
side records; their logs stay; a restarted controller neither brings them back nor
gives their ids again; running jobs are untouched."""

from __future__ import annotations

from typing import Any

from xce_resize_plugin.controllers.live.live_store import LiveStore
from xce_resize_plugin.testing.live import ALICE, ROOT, SLEEPER, LiveCluster, wait_until


def _listed(live: LiveCluster) -> set[str]:
    return {job["id"] for job in live.ok("GET", "/v1/jobs", ROOT)["jobs"]}


def _gone(live: LiveCluster, job_id: str) -> bool:
    return bool(live.call("GET", f"/v1/jobs/{job_id}", ROOT).status_code == 404)


def _stored(live: LiveCluster) -> tuple[set[str], list[str]]:
    """The job ids with a record in the (stopped) controller's store, and its side
    records' keys."""
    store = LiveStore(live.state / "controller", start=False)  # reads, takes no epoch
    try:
        snapshot = store.load()
        assert snapshot is not None
        return {job.id for job, _ in snapshot.jobs}, sorted(store.side)
    finally:
        store.close()


def test_a_finished_job_is_dropped_for_good_and_a_running_one_stays(
    resize_live_factory: Any,
) -> None:
    live: LiveCluster = resize_live_factory({"h1": 2}, controller="finished_job_keep = 1")
    live.start()
    running = live.submit()
    live.running(running, 1)
    answer = live.ok("POST", "/v1/jobs", ALICE, {"command": SLEEPER})
    done = str(answer["id"])
    live.running(done, 1)
    put = live.call("PUT", f"/v1/jobs/{done}/kv/addr", answer["token"], {"value": "h1:1"})
    assert put.status_code == 200, put.text
    assert live.call("DELETE", f"/v1/jobs/{done}", ALICE).status_code == 202

    wait_until(lambda: _gone(live, done), what=f"job {done} dropped")
    missing = live.call("GET", f"/v1/jobs/{done}", ROOT).json()
    assert missing["code"] == "LSBE_NO_JOB"
    assert _listed(live) == {running}
    assert live.job(running)["state"] == "RUN"
    # The resize history is the plugin's journal's; the route answers for a job the
    # controller knows (docs/live-controller.md, "Jobs and tasks").
    history = live.call("GET", f"/v1/jobs/{done}/resize/history", ROOT)
    assert history.status_code == 404 and history.json()["code"] == "LSBE_NO_JOB"
    # Its logs stay: they are the user's output.
    assert (live.state / "jobs" / done / "task-0.out").read_text().startswith("start 0")

    live.crash()
    jobs, side = _stored(live)
    assert jobs == {running}
    assert [k for k in side if done in k.split(":")] == []
    assert f"job:{running}" in side and f"task:{running}:0" in side

    live.start()  # the same state directory: nothing brings the job back
    assert _gone(live, done)
    assert _listed(live) == {running}
    assert live.job(running)["state"] == "RUN"
    new = live.submit()
    assert int(new) > int(done)
    live.running(new, 1)
    assert _listed(live) == {running, new}
