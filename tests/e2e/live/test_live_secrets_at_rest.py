"""Secrets at rest in the live controller's state directory, with real processes
(docs/live-controller.md, "Tokens" and "State directory"): the directory and the LMDB
files are private whatever the umask, no job token is ever written to disk, and a job's
token still reaches the tasks a grow starts after a failover."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.live.startup import refused_start, stop_cleanly
from xce_resize_plugin.testing.live import (
    ALICE,
    BOB,
    SLEEPER,
    LiveCluster,
    processes_marked,
)

#: The modes of the state directory and of what the controller keeps in it (the job
#: and agent directories below it are only reachable through it).
PRIVATE = {
    ".": "0o700",
    "controller": "0o700",
    "controller/data.mdb": "0o600",
    "controller/lock.mdb": "0o600",
    "resize": "0o700",
    "resize/data.mdb": "0o600",
    "resize/lock.mdb": "0o600",
    "job-token.key": "0o600",
    "workers/secret": "0o600",
}


def _modes(state: Path) -> dict[str, str]:
    """Modes of the state directory and its files, job and agent directories aside."""
    out = {}
    for path in [state, *state.rglob("*")]:
        rel = str(path.relative_to(state))
        if rel.startswith("jobs") or (rel.startswith("workers") and rel != "workers/secret"):
            continue
        out[rel] = oct(stat.S_IMODE(path.stat().st_mode))
    return out


@pytest.mark.parametrize("umask", [0o022, 0o000])
def test_state_is_private_whatever_the_umask(resize_live_factory: Any, umask: int) -> None:
    """Issue #13 §6: the state directory was created 0755 and controller/data.mdb 0644."""
    live: LiveCluster = resize_live_factory({"h1": 1})
    previous = os.umask(umask)  # the controller inherits it, as from a login shell
    try:
        live.start()
    finally:
        os.umask(previous)
    live.running(live.submit(tasks=1), 1)
    assert _modes(live.state) == PRIVATE


def test_looser_modes_of_an_existing_state_are_tightened(resize_live_factory: Any) -> None:
    """A state directory from an earlier version (or a careless chmod) is made private
    at start, and the controller's log says what it changed."""
    live: LiveCluster = resize_live_factory({"h1": 1})
    live.start()
    stop_cleanly(live)
    os.chmod(live.state, 0o755)
    os.chmod(live.state / "controller" / "data.mdb", 0o644)
    os.chmod(live.state / "resize", 0o755)
    os.chmod(live.state / "job-token.key", 0o644)
    live.start()
    assert _modes(live.state) == PRIVATE
    logs = live.logs()
    for path in (live.state, live.state / "controller" / "data.mdb", live.state / "resize"):
        assert f"{path}: mode was " in logs, logs
    assert f"{live.state / 'job-token.key'}: mode was 644" in logs, logs


def _task_env(live: LiveCluster, job_id: str, task_id: int) -> dict[str, str]:
    (pid,) = live.task_processes(job_id)[task_id]
    return dict(processes_marked(str(live.state))[pid]["env"])


def test_job_token_is_never_stored_and_survives_failover(resize_live_factory: Any) -> None:
    """Issue #13 §6: controller/data.mdb held every job token in clear. Now no file of
    the state holds a token, and after a restart the tasks a grow starts still get the
    job's token, which still authenticates the job (and only it)."""
    live: LiveCluster = resize_live_factory({"h1": 2, "h2": 2})
    live.start()
    body = {"command": SLEEPER, "tasks": "1,3", "alloc": {"h1": 1}, "resizable": True}
    answer = live.ok("POST", "/v1/jobs", ALICE, body)
    job_id, token = answer["id"], answer["token"]
    other = live.ok("POST", "/v1/jobs", BOB, {"command": SLEEPER, "tasks": 1})
    live.running(job_id, 1)
    assert _task_env(live, job_id, 0)["XCE_JOB_TOKEN"] == token
    live.crash()
    secret = token.rpartition(".")[2].encode()
    for path in live.state.rglob("*"):
        if path.is_file():
            assert secret not in path.read_bytes(), path
    live.start()
    assert live.call("GET", f"/v1/jobs/{job_id}", token).status_code == 200
    assert live.grow(job_id, 1, token=token).status_code == 202  # the job grows itself
    live.idle(job_id, 1)
    live.running(job_id, 2)
    assert _task_env(live, job_id, 1)["XCE_JOB_TOKEN"] == token
    live.check_consistent(job_id)
    # The mac is bound to the job: the same mac under another job id, or a changed
    # one, authenticates nobody.
    assert (
        live.call("GET", f"/v1/jobs/{other['id']}", f"{other['id']}.{secret.decode()}").status_code
        == 401
    )
    forged = token[:-1] + ("A" if token[-1] != "A" else "B")
    assert live.call("GET", f"/v1/jobs/{job_id}", forged).status_code == 401


def test_a_replaced_or_missing_token_key_is_refused(resize_live_factory: Any) -> None:
    """Tokens already handed out derive from the state directory's key: another key, or
    none, would hand the tasks a grow starts tokens that do not work."""
    live: LiveCluster = resize_live_factory({"h1": 2})
    live.start()
    live.running(live.submit(tasks=1), 1)
    stop_cleanly(live)
    key = live.state / "job-token.key"
    original = key.read_bytes()
    key.write_text("another-key-entirely-000000000000\n")
    assert refused_start(live).startswith(f"xce-resize controller: {key}: not the key")
    key.unlink()
    assert refused_start(live).startswith(f"xce-resize controller: {key}: missing")
    assert not key.exists()  # not made up afresh
    key.write_bytes(original)
    live.start()
