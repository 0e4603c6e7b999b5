"""The worker agent's cgroups (docs/live-controller.md, "Process containment"): where
the hierarchies are found, the ``[worker]`` settings, a task that cannot be placed in
its cgroup, and the agent's answer to a call it cannot serve."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest

from xce_resize_plugin.controllers.live import cgroups
from xce_resize_plugin.controllers.live.agent_client import AgentAuth
from xce_resize_plugin.controllers.live.proc import Account, account_json
from xce_resize_plugin.controllers.live.settings import parse
from xce_resize_plugin.controllers.live.worker import WorkerAgent, worker_dir
from xce_resize_plugin.controllers.live.worker_server import make_app
from xce_resize_plugin.errors import ConfigError
from xce_resize_plugin.testing.live import alive, wait_until

HYBRID = """\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
"""
HYBRID_CGROUP = "8:pids:/user.slice\n4:memory:/x\n0::/system.slice/xce.service\n"
PURE_V2 = "30 23 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"


def test_the_hierarchies_are_found_from_mountinfo_wherever_they_are_mounted() -> None:
    v2, pids = cgroups.find_hierarchies(HYBRID, HYBRID_CGROUP)
    assert v2 == Path("/sys/fs/cgroup/unified/system.slice/xce.service")
    assert pids == Path("/sys/fs/cgroup/pids/user.slice")
    assert cgroups.find_hierarchies(PURE_V2, "0::/\n") == (Path("/sys/fs/cgroup"), None)
    # A mount of a subtree (a container's): the cgroup is seen below the mount's root.
    sub = "30 23 0:26 /kube/pod1 /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n"
    assert cgroups.find_hierarchies(sub, "0::/kube/pod1/c\n")[0] == Path("/sys/fs/cgroup/c")
    assert cgroups.find_hierarchies(sub, "0::/other\n")[0] is None
    # An escaped space in a mount point; no cgroup2 at all.
    spaced = "30 23 0:26 / /mnt/cg\\040two rw - cgroup2 cgroup2 rw\n"
    assert cgroups.find_hierarchies(spaced, "0::/a\n")[0] == Path("/mnt/cg two/a")
    assert cgroups.find_hierarchies(HYBRID.splitlines()[1], "0::/\n") == (
        None,
        Path("/sys/fs/cgroup/pids"),
    )


def test_names_of_cgroups_are_plain_whatever_the_host_or_the_job() -> None:
    top, host = cgroups.subtree_name(Path("/srv/state"), "node-1.a_b")
    assert top.startswith("xce-") and len(top) == 16 and host == "node-1.a_b"
    assert cgroups.subtree_name(Path("/srv/state"), "../x")[1].startswith("host-")
    assert cgroups.subtree_name(Path("/srv/other"), "h")[0] != top
    assert cgroups.leaf_name("42", "task3") == "job42.task3"
    odd = cgroups.leaf_name("a/../b\n", "notify1")
    assert "/" not in odd and "\n" not in odd and odd.endswith(".notify1")


def test_task_pids_max_is_checked_and_computed() -> None:
    assert cgroups.parse_pids_max("max") == "max"
    assert cgroups.parse_pids_max(100) == 100
    assert cgroups.parse_pids_max("15%") == "15%"
    for bad in (0, -1, "0%", "101%", "ten", 1.5, True, cgroups.PID_MAX_LIMIT + 1):
        with pytest.raises(ValueError, match="must be"):
            cgroups.parse_pids_max(bad)
    assert cgroups.pids_limit("max") is None
    assert cgroups.pids_limit(7) == 7
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    assert 1 <= (cgroups.pids_limit("100%") or 0) <= pid_max


def _config(tmp_path: Path, worker: str) -> Any:
    text = f"""
[controller]
state_dir = "state"
[cluster]
hosts = {{ h1 = 1 }}
[worker]
{worker}
"""
    import tomllib

    return parse(tomllib.loads(text), tmp_path / "controller.toml")


def test_worker_settings_are_checked_with_one_line_naming_the_setting(tmp_path: Path) -> None:
    cfg = _config(tmp_path, "")
    assert (cfg.containment, cfg.task_pids_max) == ("auto", cgroups.DEFAULT_PIDS_MAX)
    cfg = _config(tmp_path, 'containment = "cgroup"\ntask_pids_max = 4096')
    assert (cfg.containment, cfg.task_pids_max) == ("cgroup", 4096)
    for bad, key in (
        ('containment = "cgroups"', "worker.containment"),
        ("task_pids_max = 0", "worker.task_pids_max"),
        ('task_pids_max = "lots"', "worker.task_pids_max"),
        ("pids = 3", "worker.pids"),
    ):
        with pytest.raises(ConfigError) as err:
            _config(tmp_path, bad)
        assert key in str(err.value) and "\n" not in str(err.value), str(err.value)


def test_a_task_that_cannot_be_placed_in_its_cgroup_does_not_run(tmp_path: Path) -> None:
    """Its cgroup takes no process (here: a directory that is not a cgroup): the launch
    fails, naming the cgroup, and the command never ran (it was held at its barrier
    and killed)."""
    state = tmp_path / "state"
    worker_dir(state, "h1").mkdir(parents=True)
    fake = tmp_path / "not-a-cgroup"
    fake.mkdir()
    agent = WorkerAgent("h1", state, containment=cgroups.Containment(fake, "0::/fake"))
    ran = tmp_path / "ran"
    launch = {"op": "launch", "job": "7", "task": 0, "argv": ["touch", str(ran)]}
    launch |= {"env": {"PATH": os.defpath}, "cwd": str(tmp_path)}
    launch |= {"stdout": str(tmp_path / "o"), "stderr": str(tmp_path / "e")}
    launch["user"] = account_json(Account.of_uid(os.geteuid()))
    agent.execute(0, agent.instance, [launch])
    [event] = agent.events
    assert event["kind"] == "start_failed", event
    assert f"cannot place it in its cgroup {fake}/job7.task0.1" in event["reason"], event
    time.sleep(0.2)
    assert not ran.exists()
    assert list(fake.iterdir()) == []  # the cgroup made for it was removed


def test_a_call_the_agent_cannot_serve_is_answered_not_dropped(tmp_path: Path) -> None:
    """A handler that raises RuntimeError (no thread to run on: the agent's pids
    budget) gets a signed 503 ``unavailable`` answer, not a dropped connection."""
    import asyncio

    import httpx

    state = tmp_path / "state"
    worker_dir(state, "h1").mkdir(parents=True)
    agent = WorkerAgent("h1", state)

    def no_thread(*args: Any) -> None:
        raise RuntimeError("can't start new thread")

    agent.execute = no_thread  # type: ignore[method-assign]
    secret = "x" * 43
    transport = httpx.ASGITransport(app=make_app(agent, secret, 80))

    async def call() -> httpx.Response:
        async with httpx.AsyncClient(transport=transport, base_url="http://agent") as client:
            body = {"epoch": 0, "instance": agent.instance, "commands": []}
            return await client.post("/v1/commands", json=body, auth=AgentAuth(secret))

    answer = asyncio.run(call())  # its signature checked by AgentAuth
    assert answer.status_code == 503
    assert answer.json() == {
        "code": "unavailable",
        "detail": "the agent cannot serve this call now: can't start new thread",
    }


def test_a_leftover_of_a_notification_command_is_killed_with_its_cgroup(
    tmp_path: Path,
) -> None:
    """A notification command that leaves a process in a new session behind: once the
    command ends, its cgroup is killed and removed before its result is reported."""
    try:
        found = cgroups.open_containment(tmp_path / "state", "h1", None)
    except cgroups.Unavailable as exc:
        pytest.skip(f"no writable cgroup v2 hierarchy: {exc}")
    try:
        state = tmp_path / "state"
        worker_dir(state, "h1").mkdir(parents=True)
        agent = WorkerAgent("h1", state, containment=found)
        pidfile = tmp_path / "left.pid"
        command = f"setsid sleep 600 > /dev/null 2>&1 < /dev/null & echo $! > {pidfile}"
        notify = {"op": "notify", "job": "7", "attempt": 1, "command": command}
        notify |= {"timeout": 30, "env": {"PATH": os.defpath}, "cwd": str(tmp_path)}
        notify |= {"log": str(tmp_path / "notify-1.log")}
        notify["user"] = account_json(Account.of_uid(os.geteuid()))
        agent.execute(0, agent.instance, [notify])
        wait_until(lambda: any(e["kind"] == "notify_done" for e in agent.events), 30, "done")
        left = int(pidfile.read_text())
        assert not alive(left)
        assert [p for p in found.root.iterdir() if p.is_dir()] == []
    finally:
        found.close()


def test_a_cgroup_removed_while_its_files_are_read_is_gone_not_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CI, session 30: one supervisor thread's tracker pass read the ``cgroup.procs`` of
    another task's cgroup that its own supervisor was removing. The kernel answers a
    read of a file opened before the ``rmdir`` with ENODEV, not ENOENT; that escaped,
    killed the supervisor thread, and its task's exit was never reported (the job never
    ended). Here each read of a cgroup file opens it, removes the cgroup, then reads:
    the same race, every time, with the kernel's own answer."""
    try:
        found = cgroups.open_containment(tmp_path / "state", "h1", None)
    except cgroups.Unavailable as exc:
        pytest.skip(f"no writable cgroup v2 hierarchy: {exc}")
    real_read_text = Path.read_text

    def read_after_rmdir(self: Path, *args: Any, **kwargs: Any) -> str:
        if self.parent.parent != found.root:
            return real_read_text(self, *args, **kwargs)
        with open(self) as fh:
            os.rmdir(self.parent)
            return fh.read()  # ENODEV

    try:
        for check in (
            lambda group: group.pids_in() == [],
            lambda group: group.populated() is False,
            lambda group: group.signal(15) is False,
        ):
            group = found.create("job1.task0")
            monkeypatch.setattr(Path, "read_text", read_after_rmdir)
            try:
                assert check(group)
            finally:
                monkeypatch.undo()
            assert not group.path.exists()
        # Opened before the rmdir, read after: wait_empty and kill see a removed cgroup.
        group = found.create("job1.task1")
        with open(group.path / "cgroup.events", "rb") as fh:
            os.rmdir(group.path)
            with pytest.raises(OSError) as info:
                fh.read()
        assert cgroups._gone(info.value)
        assert cgroups.wait_empty(group.path, 1.0) is True
        cgroups.kill(group.path)  # nothing to kill: no error
    finally:
        found.close()


def test_a_task_ends_reported_whatever_the_tracker_raises(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pass of the tracker a supervisor makes after its task ended: an error there
    (the one above, or any other) killed the supervisor thread, and the task was never
    reported exited. Now it is logged and the end reported."""
    state = tmp_path / "state"
    worker_dir(state, "h1").mkdir(parents=True)
    agent = WorkerAgent("h1", state)
    agent.subreaper = True

    def broken_track() -> None:
        raise OSError(19, "No such device")

    monkeypatch.setattr(agent, "track", broken_track)
    launch = {"op": "launch", "job": "7", "task": 0, "argv": ["true"]}
    launch |= {"env": {"PATH": os.defpath}, "cwd": str(tmp_path)}
    launch |= {"stdout": str(tmp_path / "o"), "stderr": str(tmp_path / "e")}
    launch["user"] = account_json(Account.of_uid(os.geteuid()))
    agent.execute(0, agent.instance, [launch])
    wait_until(lambda: any(e["kind"] == "exited" for e in agent.events), 10, "the exit")
    [exited] = [e for e in agent.events if e["kind"] == "exited"]
    assert exited["status"] == 0, exited


def test_a_call_cut_before_its_body_is_answered_without_a_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A controller killed while it sent a call (the failover tests do it at every
    step): reading the body raised ClientDisconnect, which uvicorn logged as a
    traceback in worker.log. Now nothing runs and one line says so."""
    import asyncio

    from starlette.requests import Request

    from xce_resize_plugin.controllers.live import worker_server

    async def gone() -> dict[str, Any]:
        return {"type": "http.disconnect"}

    scope = {"type": "http", "method": "POST", "path": "/v1/commands", "headers": []}
    called: list[Any] = []
    with caplog.at_level("INFO", logger=worker_server.log.name):
        answer = asyncio.run(
            worker_server._answer(Request(scope, gone), "", lambda *a: called.append(a))
        )
    assert answer.status_code == 400 and called == []
    assert "cut before its body" in caplog.text
