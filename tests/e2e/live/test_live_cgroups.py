"""Per-task cgroups of the worker agent (docs/live-controller.md, "Process
containment"): a root controller runs jobs as ``nobody``, each task in a cgroup of its
own under the agent's subtree of the cgroup v2 hierarchy.

A "comet" — every process of it forks a child and exits within milliseconds — is never
seen by a scan of ``/proc``: the ``/proc`` tracking alone reported its task gone while
it ran on. Each comet here stops by itself after :data:`COMET_GENERATIONS` generations
or when its stop file exists (the test's clean-up cannot catch it by pid, which changes
every fraction of a millisecond); it says it is alive by a heartbeat file that grows,
and carries a unique marker in its command line.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.live.reachable import reachable_dir
from xce_resize_plugin.controllers.live import cgroups
from xce_resize_plugin.testing.live import (
    LiveCluster,
    cgroup_trees,
    processes_marked,
    remove_cgroups,
    wait_until,
)

TOKEN = "nobody-token-00001"


def _why_no_cgroups() -> str | None:
    """Why this machine cannot run these tests (``None``: it can)."""
    if os.geteuid() != 0:
        return "running jobs as nobody in cgroups needs root"
    probe = Path(tempfile.gettempdir()) / f"xce-cgroup-probe-{uuid.uuid4().hex}"
    try:
        found = cgroups.open_containment(probe, "probe", None)
    except cgroups.Unavailable as exc:
        return f"no writable cgroup v2 hierarchy: {exc}"
    for tree in found.trees():
        cgroups.remove_tree(tree.parent)
    return None


pytestmark = pytest.mark.skipif(_why_no_cgroups() is not None, reason=str(_why_no_cgroups()))

#: A comet, in the shell: each generation starts its successor in the background and
#: exits at once (a fraction of a millisecond: dash's fork). ``$0`` is its marker,
#: ``$1`` its stop file; it stops after :data:`COMET_GENERATIONS` generations anyway.
#: Each generation adds a byte to its heartbeat file, ``$2``: a comet is too fast for a
#: scan of ``/proc`` to see (the test's own as the agent's), so it is alive while
#: that file grows.
COMET = (
    'f() { [ -e "$1" ] || [ "$3" -le 0 ] && exit 0; printf . >> "$2"; '
    'f "$1" "$2" $(($3 - 1)) & exit 0; }; f "$@"'
)
#: Generations a comet lives at most (a minute or two, a few thousand a second).
COMET_GENERATIONS = 300000


@pytest.fixture
def base() -> Iterator[Path]:
    """A directory other users can reach (the state directory must be searchable)."""
    with reachable_dir("xce-cgroups-") as path:
        try:
            yield path
        finally:
            remove_cgroups(path / "state")


def _cluster(base: Path, hosts: dict[str, int], worker: str = "") -> tuple[LiveCluster, str]:
    """A root cluster whose jobs run as ``nobody``; its working directory (nobody's)."""
    nobody = pwd.getpwuid(65534)
    live = LiveCluster(
        base,
        hosts,
        {"notify_timeout": 10, "stop_grace": 1.0},
        limits=f"[worker]\n{worker}\n",
        single_user=False,
        tokens={nobody.pw_name: TOKEN},
    )
    work = base / "work"
    work.mkdir()
    os.chown(work, nobody.pw_uid, nobody.pw_gid)
    return live, str(work)


def _python() -> str:
    """A Python interpreter that ``nobody`` may run (the test's own may be in a
    directory only root reaches)."""
    for exe in (sys.executable, shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin")):
        if exe is None:
            continue
        try:
            subprocess.run([exe, "-c", "pass"], user=65534, capture_output=True, check=True)
        except (OSError, subprocess.CalledProcessError):
            continue
        return exe
    pytest.skip("no Python interpreter that nobody may run")


def _comet(base: Path, cwd: str, marker: str) -> tuple[list[str], Path, Path]:
    """A comet's command (its marker in its argv), its stop file and its heartbeat."""
    stop, beat = base / f"stop-{marker}", Path(cwd) / f"beat-{marker}"
    return (
        ["/bin/sh", "-c", COMET, marker, str(stop), str(beat), str(COMET_GENERATIONS)],
        stop,
        beat,
    )


def _size(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0


def _comet_alive(beat: Path) -> bool:
    """Whether the comet of heartbeat ``beat`` runs: its file grows in 0.3 s, or a
    process of it shows in ``/proc``."""
    before = _size(beat)
    time.sleep(0.3)
    return _size(beat) > before or bool(processes_marked(beat.name[len("beat-") :]))


def _shell(argv: list[str]) -> str:
    return " ".join("'" + a.replace("'", "'\\''") + "'" for a in argv)


def _worker_log(live: LiveCluster, host: str) -> str:
    path = live.state / "workers" / host / "worker.log"
    return path.read_text(errors="replace") if path.exists() else ""


def _state(live: LiveCluster, job_id: str) -> str:
    return str(live.job(job_id)["state"])


@pytest.mark.parametrize("how", ["kill", "release"])
def test_a_comet_is_gone_before_its_task_is_reported_gone(base: Path, how: str) -> None:
    """A task runs a comet beside its main process; the job is killed (or the task
    released). The task is reported gone only once no process of the comet is left,
    and none comes back. (With containment = "proc" this fails: the comet runs on.)"""
    live, cwd = _cluster(base, {"h1": 2})
    marker = f"comet-{uuid.uuid4().hex}"
    comet, stop, beat = _comet(base, cwd, marker)
    victim = 0 if how == "kill" else 1  # the task that runs the comet
    script = f'if [ "$XCE_TASK_ID" = {victim} ]; then {_shell(comet)} & fi; exec sleep 600'
    try:
        live.start()
        resizable: dict[str, object] = {}
        if how == "release":
            resizable = {"tasks": "1,2", "resizable": True, "alloc": {"h1": 1}}
        job_id = live.submit(TOKEN, command=["/bin/sh", "-c", script], cwd=cwd, **resizable)
        live.running(job_id, 1)
        if how == "release":
            assert live.grow(job_id, 1, TOKEN).status_code == 202
            live.idle(job_id, 1)
        wait_until(lambda: _size(beat) > 100, 15, "the comet running")
        if how == "kill":
            assert live.call("DELETE", f"/v1/jobs/{job_id}", TOKEN).status_code == 202
            wait_until(lambda: _state(live, job_id) == "EXIT", 20, "the job's end")
        else:
            assert live.release(job_id, TOKEN, task_ids=[1]).status_code == 202
            live.idle(job_id, 2, timeout=20)
            running = [t["id"] for t in live.job(job_id)["tasks"] if t["state"] == "RUNNING"]
            assert running == [0]
        # Reported gone: nothing of it runs any more.
        assert not _comet_alive(beat)
        assert "Traceback" not in _worker_log(live, "h1")
    finally:
        stop.touch()
        live.cleanup()


def test_a_task_that_exits_leaves_no_comet_behind(base: Path) -> None:
    """Task 0 starts a comet and exits 0: its leftovers get the short clean-up grace,
    then ``cgroup.kill``; the job is DONE only once the comet is gone, and its cgroup
    is removed."""
    live, cwd = _cluster(base, {"h1": 1})
    marker = f"comet-{uuid.uuid4().hex}"
    comet, stop, beat = _comet(base, cwd, marker)
    script = f"{_shell(comet)} & sleep 0.5; exit 0"
    try:
        live.start()
        job_id = live.submit(TOKEN, command=["/bin/sh", "-c", script], cwd=cwd)
        wait_until(lambda: _size(beat) > 100, 15, "the comet running")
        wait_until(lambda: _state(live, job_id) != "RUN", 20, "the job's end")
        assert not _comet_alive(beat)
        job = live.job(job_id)
        assert job["state"] == "DONE", job
        host_tree = cgroup_trees(live.state)[0] / "h1"
        assert [p.name for p in host_tree.iterdir() if p.is_dir()] == []
    finally:
        stop.touch()
        live.cleanup()


def test_a_tasks_pids_are_bounded_by_task_pids_max(base: Path) -> None:
    """A fork bomb, limited to 20 pids, gets no more (fork fails with EAGAIN), and is
    still stopped with its job."""
    live, cwd = _cluster(base, {"h1": 1}, "task_pids_max = 20")
    marker = f"bomb-{uuid.uuid4().hex}"
    bomb = (
        "import os, sys, time\n"
        "n = 1\n"
        "while n < 1000:\n"
        "    try:\n"
        "        pid = os.fork()\n"
        "    except OSError:\n"
        "        break\n"
        "    if pid == 0:\n"
        "        time.sleep(600)\n"
        "        os._exit(0)\n"
        "    n += 1\n"
        "print('processes', n, flush=True)\n"
        "time.sleep(600)\n"
    )
    try:
        live.start()
        wait_until(lambda: "pids.max 20 " in _worker_log(live, "h1"), 10, "pids.max in the log")
        job_id = live.submit(TOKEN, command=[_python(), "-c", bomb, marker], cwd=cwd)
        out = live.state / "jobs" / job_id / "task-0.out"
        text = wait_until(lambda: out.exists() and out.read_text(), 20, "the bomb's count")
        assert text.split() == ["processes", "20"], text
        assert len(processes_marked(marker)) == 20
        assert live.call("DELETE", f"/v1/jobs/{job_id}", TOKEN).status_code == 202
        wait_until(lambda: _state(live, job_id) == "EXIT", 20, "the job's end")
        assert processes_marked(marker) == {}
    finally:
        live.cleanup()


def test_a_new_agent_kills_what_its_dead_predecessors_cgroups_hold(base: Path) -> None:
    """The agent of h2 dies (SIGKILL) while its task runs a comet; its successor kills
    the predecessor's cgroups (and what is in them) before it serves, and removes them.
    Then a clean stop of the agents removes their whole subtree."""
    live, cwd = _cluster(base, {"h1": 1, "h2": 1})
    marker = f"comet-{uuid.uuid4().hex}"
    comet, stop, beat = _comet(base, cwd, marker)
    script = f'if [ "$XCE_TASK_ID" = 1 ]; then {_shell(comet)} & fi; exec sleep 600'
    try:
        live.start()
        job_id = live.submit(TOKEN, command=["/bin/sh", "-c", script], cwd=cwd, tasks=2, ptile=1)
        live.running(job_id, 2)
        wait_until(lambda: _size(beat) > 100, 15, "the comet running")
        h2 = cgroup_trees(live.state)[0] / "h2"
        before = [p for p in h2.iterdir() if p.is_dir()]
        assert len(before) == 1, before
        agent = int(live.cluster()["hosts"]["h2"]["worker"]["pid"])
        os.kill(agent, signal.SIGKILL)
        wait_until(lambda: not _comet_alive(beat), 20, "the comet killed by the successor")
        wait_until(lambda: not before[0].exists(), 10, "the dead agent's cgroup removed")
        assert "killed what 1 cgroup(s) of a previous agent held" in _worker_log(live, "h2")
        job = wait_until(lambda: (j := live.job(job_id))["state"] == "EXIT" and j, 15, "EXIT")
        assert job["exit_reason"] == "host failure"
        # A clean stop of the agents (SIGTERM) removes their cgroups.
        live.crash()
        for host in ("h1", "h2"):
            registration = live.state / "workers" / host / "worker.json"
            os.kill(int(json.loads(registration.read_text())["pid"]), signal.SIGTERM)
        for tree in cgroup_trees(live.state):
            for host in ("h1", "h2"):
                gone = tree / host
                wait_until(lambda gone=gone: not gone.exists(), 15, f"{gone} removed")
    finally:
        stop.touch()
        live.cleanup()


def test_containment_cgroup_refuses_an_agent_that_cannot_have_them(base: Path) -> None:
    """An agent told ``--containment cgroup`` that cannot make its cgroups refuses to
    start, with one line that says why. Here the agent sees no cgroup v2 hierarchy: it
    runs in a mount namespace of its own, where the hierarchy is unmounted."""
    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.skip("no unshare(1) to start the agent without a cgroup v2 hierarchy")
    v2, _ = cgroups.find_hierarchies(
        Path("/proc/self/mountinfo").read_text(), Path("/proc/self/cgroup").read_text()
    )
    mount = next(m for m in cgroups.cgroup_mounts() if v2 is not None and v2.is_relative_to(m))
    state = base / "state"
    (state / "workers").mkdir(parents=True)
    (state / "workers" / "secret").write_text("s" * 32)
    agent = [sys.executable, "-m", "xce_resize_plugin", "worker", "--state-dir", str(state)]
    agent += ["--host", "h1", "--containment", "cgroup"]
    script = 'umount -l "$1" || exit 99; shift; exec "$@"'
    out = subprocess.run(
        [unshare, "-m", "/bin/sh", "-c", script, "sh", str(mount), *agent],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert out.returncode == 2, out.stderr
    lines = [line for line in out.stderr.splitlines() if line.startswith("xce-resize worker:")]
    assert lines == [
        "xce-resize worker: containment = cgroup, but no cgroup v2 hierarchy is mounted "
        "where this process sees it"
    ], out.stderr
    assert "Traceback" not in out.stderr
