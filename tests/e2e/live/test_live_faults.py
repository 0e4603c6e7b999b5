"""Live controller faults with real processes: a controller fenced while it starts, and
durable writes that fail (a full disk, simulated with a file size limit on the
controller's process) — docs/live-controller.md, "Failover" and "When the state cannot
be written"."""

from __future__ import annotations

import resource
import shutil
import socket
import subprocess
from pathlib import Path
from typing import Any

import httpx

from tests.e2e.live.startup import resized_job
from xce_resize_plugin.testing.live import BOB, LiveCluster, controller_command, wait_until

#: The exit status of a fenced controller (docs/live-controller.md).
EXIT_FENCED = 3


def _stop(live: LiveCluster) -> None:
    """SIGTERM the controller and wait for its clean stop (the agents keep running)."""
    proc = live.procs[-1]
    proc.terminate()
    assert proc.wait(20) == 0, live.logs()


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def test_a_controller_fenced_by_the_agents_at_start_up_exits(
    resize_live_factory: Any, tmp_path: Path
) -> None:
    """A controller started on a state directory restored from a backup takes an epoch
    the agents have already seen surpassed: they refuse it, and it exits with the fenced
    status at once, releasing its port, instead of serving 503 for ever."""
    live: LiveCluster = resize_live_factory({"h1": 2, "h2": 2})
    live.start()
    job_id = live.submit(tasks="1,2", alloc={"h1": 1}, resizable=True)
    live.running(job_id, 1)
    _stop(live)
    backup = tmp_path / "backup"
    for name in ("controller", "resize"):
        shutil.copytree(live.state / name, backup / name)
    # Two failovers later the agents have seen the epoch a controller on the backup
    # would take, and a newer one.
    for _ in range(2):
        live.start()
        live.running(job_id, 1)
        _stop(live)
    for name in ("controller", "resize"):
        shutil.rmtree(live.state / name)
        shutil.copytree(backup / name, live.state / name)
    log = open(tmp_path / "controller-restored.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen(
        controller_command(live.config),
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    log.close()
    live.procs.append(proc)  # cleaned up with the others, by pid
    try:
        status = proc.wait(30)
    except subprocess.TimeoutExpired:
        status = None
    text = (tmp_path / "controller-restored.log").read_text(errors="replace")
    assert status == EXIT_FENCED, text
    assert "refused this controller's epoch" in text, text
    assert _port_free(live.port)
    # The agents and the job's task were not disturbed by the refused controller.
    live.start()
    live.running(job_id, 1)
    live.check_consistent(job_id)


def _health(live: LiveCluster) -> httpx.Response:
    return httpx.get(live.url("/v1/health"), timeout=5)


def _limit_file_size(pid: int, size: int) -> None:
    """Writes of ``pid`` past ``size`` bytes of any file fail (EFBIG; Python ignores
    SIGXFSZ), as on a full disk; ``resource.RLIM_INFINITY`` lifts the limit."""
    _, hard = resource.prlimit(pid, resource.RLIMIT_FSIZE)
    resource.prlimit(pid, resource.RLIMIT_FSIZE, (size, hard))


def test_failed_writes_change_nothing_answer_503_and_recover_without_restart(
    resize_live_factory: Any, tmp_path: Path
) -> None:
    """Every durable write of the controller fails (a file size limit below its LMDB
    files' data pages: what a full or failing disk does). A job's tasks end meanwhile:
    nothing may start on the slots they free while that cannot be written, the API
    answers 503 with Retry-After, health says failing; once writes work again the
    controller catches up by itself, and nothing acknowledged is lost, also after a
    restart."""
    live: LiveCluster = resize_live_factory({"h1": 2, "h2": 2})
    controller = live.start()
    gate = tmp_path / "gate"
    gated = [
        "/bin/sh",
        "-c",
        f'echo "start $XCE_TASK_ID"; until [ -e {gate} ]; do sleep 0.05; done',
    ]
    first = live.submit(tasks="2,3", alloc={"h1": 2}, resizable=True, command=gated)
    live.running(first, 2)
    assert live.grow(first, 1).status_code == 202
    live.idle(first, 1)  # acknowledged and durable: it must survive all that follows
    second = live.submit(tasks=2)  # one slot is free: it waits
    assert live.job(second)["state"] == "PEND"
    assert _health(live).status_code == 200

    _limit_file_size(controller.pid, 8192)  # LMDB's meta pages only: no data page fits
    gate.touch()  # the first job's tasks exit: their ends cannot be recorded

    def failing() -> dict[str, Any] | None:
        response = _health(live)
        return response.json() if response.status_code == 503 else None

    health = wait_until(failing, 15, "health to say failing")
    assert health["status"] == "failing" and health["reason"], health
    # The controller's view is what is on disk: the first job still runs there, the
    # second was not started on slots whose release is not recorded (no phantom tasks).
    job = live.job(second)
    assert job["state"] == "PEND" and job["tasks"] == [] and job["held"] == [], job
    assert not live.task_processes(second)
    assert live.job(first)["state"] == "RUN"
    used = {h: v["used"] for h, v in live.cluster()["hosts"].items()}
    assert used == {"h1": 2, "h2": 1}, used
    # Changes are refused with 503 (not 4xx) and Retry-After, and change nothing.
    refused = [
        live.call("POST", "/v1/jobs", body={"command": ["/bin/true"], "env": {"X": "x" * 20000}}),
        live.grow(second, 1),
        live.call("DELETE", f"/v1/jobs/{second}"),
    ]
    for response in refused:
        assert response.status_code == 503, response.text
        assert response.headers["content-type"] == "application/problem+json"
        assert response.json()["code"] == "XCE_STATE_NOT_WRITABLE", response.text
        assert int(response.headers["retry-after"]) > 0
    assert [j["id"] for j in live.ok("GET", "/v1/jobs", "root-token-0003")["jobs"]] == [
        first,
        second,
    ]

    _limit_file_size(controller.pid, resource.RLIM_INFINITY)  # space is back
    wait_until(lambda: _health(live).status_code == 200, 20, "health ok again")
    assert controller.poll() is None  # the same process: no restart
    wait_until(lambda: live.job(first)["state"] == "DONE", 15, "the first job DONE")
    live.running(second, 2)
    live.check_consistent(second)
    third = live.submit(tasks=1)
    live.running(third, 1)

    _stop(live)  # nothing acknowledged is lost across a restart either
    live.start()
    done = live.job(first)
    assert done["state"] == "DONE" and done["version"] == 1, done
    assert len(done["allocation"]) == 3
    live.running(second, 2)
    live.running(third, 1)
    live.check_consistent(second)


def test_a_resize_request_the_journal_cannot_record_is_503_and_changes_nothing(
    resize_live_factory: Any,
) -> None:
    """The first write that fails is the plugin's journal's, in a grow request: it is
    answered 503 with Retry-After (not acknowledged, so not applied), the controller goes
    back to what is on disk instead of stopping, and the same request succeeds once the
    journal can be written again."""
    live: LiveCluster = resize_live_factory({"h1": 2, "h2": 2})
    controller = live.start()
    job_id = live.submit(tasks="1,3", alloc={"h1": 1}, resizable=True)
    live.running(job_id, 1)

    _limit_file_size(controller.pid, 8192)
    response = live.grow(job_id, 1)
    assert response.status_code == 503, response.text
    assert response.json()["code"] == "XCE_RESIZE_JOURNAL", response.text
    assert int(response.headers["retry-after"]) > 0
    health = _health(live)
    assert health.status_code == 503 and health.json()["status"] == "failing", health.text
    job = live.job(job_id)
    assert len(job["held"]) == 1 and len(job["tasks"]) == 1, job
    refused = live.grow(job_id, 1)
    assert refused.status_code == 503, refused.text
    assert refused.json()["code"] == "XCE_STATE_NOT_WRITABLE", refused.text

    _limit_file_size(controller.pid, resource.RLIM_INFINITY)
    wait_until(lambda: _health(live).status_code == 200, 20, "health ok again")
    assert controller.poll() is None
    assert live.phase(job_id) == "IDLE"
    job = live.job(job_id)
    assert job["version"] == 0 and len(job["held"]) == 1, job
    assert live.grow(job_id, 1).status_code == 202
    live.idle(job_id, 1)
    live.check_consistent(job_id)


def test_a_damaged_record_read_for_one_job_fails_that_request_not_the_controller(
    resize_live_factory: Any,
) -> None:
    """A fact of a job damaged on disk (found when read, with the check at start off):
    reading the job's events fails that read, naming the damage. It was taken for a
    failing disk: the controller dropped its state, answered every user 503 and
    reported itself failing, again at each poll of the job's events."""
    import lmdb

    live, job = resized_job(resize_live_factory, controller="verify_journal = false")
    _stop(live)
    env = lmdb.open(str(live.state / "resize"), max_dbs=8)
    try:
        facts = env.open_db(b"facts")
        with env.begin(write=True) as txn:
            key, value = next(iter(txn.cursor(db=facts)))
            damaged = bytearray(value)
            damaged[-3] ^= 0x01  # one bit of the payload: its CRC no longer holds
            txn.put(key, bytes(damaged), db=facts)
    finally:
        env.close()
    live.start()
    for _ in range(3):
        answer = live.call("GET", f"/v1/jobs/{job}/events?after=0&timeout=0")
        assert answer.status_code == 503 and "damaged" in answer.text, answer.text
        other = live.call("POST", "/v1/jobs", BOB, {"command": ["/bin/true"]})
        assert other.status_code == 201, other.text
    health = httpx.get(f"{live.url()}/v1/health", timeout=5).json()
    assert health["status"] == "ok", health
    assert "the state cannot be written" not in live.logs()
