"""A root controller and its agents against a job that turns what it controls on them
(docs/live-controller.md, "Worker agents", "Logs"): its scratch directory, and the
filesystem it shares with the state directory. The jobs run as ``nobody``, as a root
controller runs a job of a user; another user's job is the one that must not suffer.
"""

from __future__ import annotations

import os
import pwd
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.live.reachable import reachable_dir
from xce_resize_plugin.controllers.live.proc import Account
from xce_resize_plugin.testing.live import ROOT, LiveCluster, alive, wait_until

HOSTILE_TOKEN = "hostile-token-0001"
VICTIM_TOKEN = "victim-token-00001"

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="running jobs as other users, and mounting, need root"
)


def _accounts() -> tuple[Account, Account]:
    """The hostile job's owner (``nobody``) and another local user, the victim's."""
    hostile = Account.named(pwd.getpwuid(65534).pw_name)
    others = [e for e in pwd.getpwall() if e.pw_uid not in (0, hostile.uid)]
    assert others, "this machine has no account but root and nobody"
    return hostile, Account.named(others[0].pw_name)


@pytest.fixture
def base() -> Iterator[Path]:
    """A directory other users can reach (the state directory must be searchable)."""
    with reachable_dir("xce-hostile-") as path:
        yield path


def _cluster(base: Path) -> tuple[LiveCluster, dict[str, str]]:
    """A root cluster of one host that runs jobs as their owners, and each owner's
    working directory (its own, 0700)."""
    accounts = _accounts()
    tokens = {accounts[0].name: HOSTILE_TOKEN, accounts[1].name: VICTIM_TOKEN}
    live = LiveCluster(base, {"h1": 2}, {"notify_timeout": 10}, single_user=False, tokens=tokens)
    cwds = {}
    for account, token in zip(accounts, (HOSTILE_TOKEN, VICTIM_TOKEN), strict=True):
        work = base / f"work-{account.uid}"
        work.mkdir()
        os.chown(work, account.uid, account.gid)
        os.chmod(work, 0o700)
        cwds[token] = str(work)
    return live, cwds


def _state(live: LiveCluster, job_id: str) -> str:
    """The job's state; "" while the controller cannot read its state back."""
    answer = live.call("GET", f"/v1/jobs/{job_id}", ROOT)
    return str(answer.json()["state"]) if answer.status_code == 200 else ""


def _failing(live: LiveCluster) -> bool:
    """Whether the controller's state cannot be written (docs/live-controller.md)."""
    answer = live.call("GET", "/v1/health")
    return bool(answer.status_code == 503 and answer.json().get("status") == "failing")


def test_a_scratch_directory_nested_past_the_recursion_limit_goes_with_its_job(
    base: Path,
) -> None:
    """The job nests directories 1500 deep in its scratch directory, then ends: the
    controller removes them all (a recursive removal failed with ``RecursionError`` in
    the cycle that ended the job, and left the job's data on disk for good)."""
    live, cwds = _cluster(base)
    deep = (
        'cd "$XCE_JOB_DIR" || exit 1; i=0; '
        "while [ $i -lt 1500 ]; do mkdir d && cd d || exit 1; i=$((i+1)); done; "
        'echo deep > f; ln -s / root; echo "$i"'
    )
    try:
        live.start()
        job_id = live.submit(
            HOSTILE_TOKEN, command=["/bin/sh", "-c", deep], cwd=cwds[HOSTILE_TOKEN]
        )
        wait_until(lambda: _state(live, job_id) != "RUN", 60, "the job's end")
        assert _state(live, job_id) == "DONE", live.job(job_id)
        jdir = live.state / "jobs" / job_id
        assert (jdir / "task-0.out").read_text().strip() == "1500"
        # Moved aside at the end, removed in the background (.scratch_trash).
        wait_until(
            lambda: not (jdir / "scratch").exists() and not any(jdir.glob(".*")),
            15,
            "scratch removed",
        )
        assert "Traceback" not in live.logs(), live.logs()
    finally:
        live.cleanup()


@pytest.fixture
def small_fs(base: Path) -> Iterator[Path]:
    """A 24 MiB filesystem (tmpfs) for the state directory, searchable by all."""
    mount = base / "fs"
    mount.mkdir()
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=24m,mode=0711", "tmpfs", str(mount)], check=True
    )
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=False)


def test_a_job_that_fills_the_filesystem_does_not_stop_another_jobs_end(
    small_fs: Path,
) -> None:
    """A job fills the state directory's filesystem through its scratch directory and
    keeps starting processes; meanwhile another user's task exits. The agent cannot
    record its live tasks then; it must still report the exit (a failed record ended
    the thread that reports it, and the other job held its slot for good, even once
    space was back)."""
    live, cwds = _cluster(small_fs)
    # Fills the filesystem, then keeps starting processes: its task's processes change
    # at every look, so the agent records its tasks again at every one.
    fill = 'head -c 100000000 /dev/zero > "$XCE_JOB_DIR/fill"; while :; do sleep 0.01; done'
    victims: list[int] = []
    try:
        live.start()
        victim = live.submit(VICTIM_TOKEN, command=["sleep", "600"], cwd=cwds[VICTIM_TOKEN])
        victims += [pid for pid in [live.running(victim, 1)["tasks"][0]["pid"]] if pid]
        hostile = live.submit(
            HOSTILE_TOKEN, command=["/bin/sh", "-c", fill], cwd=cwds[HOSTILE_TOKEN]
        )
        live.running(hostile, 1)
        filled = live.state / "jobs" / hostile / "scratch" / "fill"
        wait_until(lambda: os.statvfs(small_fs).f_bavail == 0, 30, "a full filesystem")
        os.kill(victims[0], signal.SIGKILL)  # the victim's task ends on its own
        # The agent sees the exit while the filesystem is full (the controller hears of
        # it only once the agent reports it), then space comes back.
        wait_until(
            lambda: _failing(live) or _state(live, victim) not in ("RUN", ""),
            30,
            "the controller told of the victim's exit",
        )
        filled.unlink()
        wait_until(lambda: _state(live, victim) not in ("RUN", ""), 30, "the victim job's end")
        job = live.job(victim)
        assert job["state"] == "EXIT" and job["tasks"][0]["status"] == 128 + 9, job
        assert job["held"] == []
    finally:
        for pid in victims:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        live.cleanup()
