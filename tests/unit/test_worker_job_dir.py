"""A job's directory the worker agent makes itself (no shared state directory, or
the directory is missing) has the controller's mode (controllers/live/worker.py
``make_job_dir``; docs/live-controller.md, "State directory"): root's 0711 for a job
of another user, which it passes through and nobody lists; 0700 for the agent's own
user's. With the umask's 0755 every user could list another user's job directory
(its logs' names, ``notify-N.log``, ``hostfile.vN``: its resize history)."""

from __future__ import annotations

import os
import pwd
import stat
from pathlib import Path
from typing import Any

import pytest

from xce_resize_plugin.controllers.live.proc import Account, account_json
from xce_resize_plugin.controllers.live.worker import WorkerAgent, worker_dir
from xce_resize_plugin.testing.live import wait_until


def _mode(path: Path) -> tuple[int, int]:
    st = path.stat()
    return st.st_uid, stat.S_IMODE(st.st_mode)


@pytest.mark.parametrize("other_user", [False, True])
def test_a_job_directory_the_agent_makes_is_the_controllers(
    tmp_path: Path, other_user: bool
) -> None:
    if other_user and os.geteuid() != 0:
        pytest.skip("running a job as another user needs root")
    owner = Account.of_uid(os.geteuid())
    if other_user:
        owner = Account.named(pwd.getpwuid(65534).pw_name)
    state = tmp_path / "state"
    worker_dir(state, "h1").mkdir(parents=True)
    agent = WorkerAgent("h1", state)
    launch: dict[str, Any] = {"op": "launch", "job": "9", "task": 0, "cwd": "/"}
    launch |= {"argv": ["true"], "env": {"PATH": os.defpath}, "user": account_json(owner)}
    launch |= {"stdout": str(state / "jobs/9/t.out"), "stderr": str(state / "jobs/9/t.err")}
    notify = {"op": "notify", "job": "10", "attempt": 1, "command": "true", "timeout": 20}
    notify |= {"env": {"PATH": os.defpath}, "cwd": str(state / "jobs/10")}
    notify |= {"log": str(state / "jobs/10/notify-1.log"), "user": account_json(owner)}
    old = os.umask(0o022)
    try:
        agent.execute(0, agent.instance, [launch, notify])
        wait_until(lambda: any(e["kind"] == "notify_done" for e in agent.events), 20, "done")
    finally:
        os.umask(old)
        agent.shutdown(0.0)
    wanted = 0o711 if other_user else 0o700
    me = os.geteuid()
    assert _mode(state / "jobs") == (me, 0o711)
    assert _mode(state / "jobs/9") == (me, wanted)
    assert _mode(state / "jobs/10") == (me, wanted)
