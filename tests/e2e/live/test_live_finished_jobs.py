"""Finished jobs are dropped ``[controller] finished_job_keep`` seconds after their end
(docs/live-controller.md, "Jobs and tasks"): gone from the views, the store and the
side records; their logs stay; a restarted controller neither brings them back nor
gives their ids again; running jobs are untouched."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from xce_resize_plugin.controllers.live.live_store import LiveStore
from xce_resize_plugin.testing.live import ALICE, BOB, ROOT, SLEEPER, LiveCluster, wait_until


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
    live: LiveCluster = resize_live_factory({"h1": 4}, controller="finished_job_keep = 1")
    live.start()
    running = live.submit()
    live.running(running, 1)
    answer = live.ok("POST", "/v1/jobs", ALICE, {"command": SLEEPER})
    done = str(answer["id"])
    live.running(done, 1)
    put = live.call("PUT", f"/v1/jobs/{done}/kv/addr", answer["token"], {"value": "h1:1"})
    assert put.status_code == 200, put.text
    grown = live.submit(tasks="1,2", initial=1, resizable=True)
    live.running(grown, 1)
    assert live.grow(grown, 1).status_code == 202
    assert live.idle(grown, 1)["hosts"] == {"h1": 2}
    history = live.ok("GET", f"/v1/jobs/{grown}/resize/history", ALICE)
    for job_id in (done, grown):
        assert live.call("DELETE", f"/v1/jobs/{job_id}", ALICE).status_code == 202

    wait_until(lambda: _gone(live, done) and _gone(live, grown), what="jobs dropped")
    missing = live.call("GET", f"/v1/jobs/{done}", ROOT).json()
    assert missing["code"] == "LSBE_NO_JOB"
    assert _listed(live) == {running}
    assert live.job(running)["state"] == "RUN"
    # The resize history is the plugin's journal's, and still answered, to whom the
    # view policy shows the job as the journal recorded it (docs/live-controller.md,
    # "Jobs and tasks"); a job that never was resizable has none.
    for token in (ALICE, ROOT):
        after = live.ok("GET", f"/v1/jobs/{grown}/resize/history", token)
        assert after["records"] == history["records"] and len(after["records"]) == 1
    for token, job_id in ((BOB, grown), (ROOT, done)):
        hidden = live.call("GET", f"/v1/jobs/{job_id}/resize/history", token)
        assert hidden.status_code == 404 and hidden.json()["code"] == "LSBE_NO_JOB"
    assert live.call("GET", f"/v1/jobs/{grown}/resize", ALICE).status_code == 404
    # The dropped job's own token no longer authenticates, also for its history.
    gone_token = live.call("GET", f"/v1/jobs/{done}/resize/history", answer["token"])
    assert gone_token.status_code == 401
    # Its logs stay: they are the user's output.
    assert (live.state / "jobs" / done / "task-0.out").read_text().startswith("start 0")

    live.crash()
    jobs, side = _stored(live)
    assert jobs == {running}
    assert [k for k in side if done in k.split(":") or grown in k.split(":")] == []
    assert f"job:{running}" in side and f"task:{running}:0" in side

    live.start()  # the same state directory: nothing brings the job back
    assert _gone(live, done)
    # ... and its history is still the journal's, to the same callers.
    after = live.ok("GET", f"/v1/jobs/{grown}/resize/history", ALICE)
    assert after["records"] == history["records"]
    hidden = live.call("GET", f"/v1/jobs/{grown}/resize/history", BOB)
    assert hidden.status_code == 404
    assert _listed(live) == {running}
    assert live.job(running)["state"] == "RUN"
    new = live.submit()
    assert int(new) > int(done)
    live.running(new, 1)
    assert _listed(live) == {running, new}


def test_a_requeued_job_leaves_no_launch_of_its_first_run_once_dropped(
    resize_live_factory: Any,
) -> None:
    """A job requeued after a host failure starts again from task 0: the launches of
    its first run's other tasks are deleted with the requeue, not left in the store
    once the job is dropped (its record knows only its last run's task ids)."""
    policy = Path(__file__).parents[3] / "hooks" / "requeue_on_host_failure.py"
    live: LiveCluster = resize_live_factory(
        {"h1": 3, "h2": 1}, controller="finished_job_keep = 1", policy_files=[str(policy)]
    )
    live.start()
    job_id = live.submit(tasks="1,3", initial=1, resizable=True, alloc={"h2": 1})
    live.running(job_id, 1)
    assert live.grow(job_id, 2).status_code == 202
    assert live.idle(job_id, 1)["hosts"] == {"h1": 2, "h2": 1}
    down = live.ok("POST", "/v1/hosts/h2/down", ROOT)
    assert down["jobs"] == {job_id: "requeue"}  # task 0 was there
    again = wait_until(
        lambda: (j := live.job(job_id))["state"] == "RUN" and j["version"] == 0 and j,
        20,
        "the requeued job runs again",
    )
    assert again["hosts"] == {"h1": 1}
    live.running(job_id, 1)
    assert live.call("DELETE", f"/v1/jobs/{job_id}", ALICE).status_code == 202
    wait_until(lambda: _gone(live, job_id), what=f"job {job_id} dropped")

    live.crash()
    jobs, side = _stored(live)
    assert job_id not in jobs
    assert [k for k in side if job_id in k.split(":")] == []


def test_a_user_keeps_at_most_finished_job_max_finished_jobs(resize_live_factory: Any) -> None:
    """``[controller] finished_job_max``: a user whose jobs end faster than they age out
    (a loop of submit and kill, or of `true`) keeps only the latest ended, so no user
    can fill the controller's memory and store with finished jobs; others keep theirs."""
    live: LiveCluster = resize_live_factory({"h1": 4}, controller="finished_job_max = 2")
    live.start()
    running = live.submit(BOB)
    live.running(running, 1)
    bobs_done = live.submit(BOB, command=["/bin/true"])
    wait_until(lambda: live.job(bobs_done)["state"] == "DONE", what="bob's job done")
    ended: list[str] = []
    for _ in range(4):
        job_id = live.submit(ALICE, command=["/bin/true"])
        wait_until(lambda j=job_id: live.job(j)["state"] == "DONE", what=f"job {job_id} done")
        ended.append(job_id)
    wait_until(
        lambda: _listed(live) == {running, bobs_done, *ended[2:]}, what="alice's oldest dropped"
    )
    assert all(_gone(live, job_id) for job_id in ended[:2])
    live.crash()
    jobs, _ = _stored(live)
    assert jobs == {running, bobs_done, *ended[2:]}
