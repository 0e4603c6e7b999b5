"""A job directory an earlier version made (0750, the owner's primary group, its
notification hostfiles 0644) is closed before it is opened to passing through: the
upgrade never makes a file readable to users who could not read it before
(docs/live-controller.md, "State directory")."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from types import SimpleNamespace

import pytest

from xce_resize_plugin.controllers.live.live_state import LiveState
from xce_resize_plugin.controllers.live.proc import SHARED_JOB_DIR, Account

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="giving files away needs root")

OWNER = Account("nobody", 65534, 65534, (65534,), "/nonexistent")


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_an_earlier_versions_directory_is_closed_then_opened(tmp_path: Path) -> None:
    jdir = tmp_path / "jobs" / "101"
    jdir.mkdir(parents=True)
    os.chown(jdir, 0, OWNER.gid)
    os.chmod(jdir, 0o750)
    old = {"hostfile.v1": 0o644, "hostfile": 0o644, "tasks": 0o640, "plain": 0o600}
    for name, mode in old.items():
        (jdir / name).write_text("h1\n")
        os.chmod(jdir / name, mode)
    log = jdir / "task-0.out"
    log.write_text("the owner's\n")
    os.chown(log, OWNER.uid, OWNER.gid)
    os.chmod(log, 0o600)
    (jdir / "link").symlink_to("/etc/passwd")
    state = SimpleNamespace(euid=0, job_dir=lambda job_id: tmp_path / "jobs" / job_id)

    LiveState._make_job_dir(state, "101", OWNER)  # type: ignore[arg-type]

    st = os.stat(jdir)
    assert (st.st_uid, st.st_gid, _mode(jdir)) == (0, 0, SHARED_JOB_DIR)
    assert {name: _mode(jdir / name) for name in old} == dict.fromkeys(old, 0o600)
    assert _mode(log) == 0o600 and os.stat(log).st_uid == OWNER.uid  # left as it was
    assert _mode(Path("/etc/passwd")) == 0o644  # a link is not followed
    # As made now: nothing is walked again (a file that is the owner's stays so).
    os.chmod(jdir / "plain", 0o644)
    LiveState._make_job_dir(state, "101", OWNER)  # type: ignore[arg-type]
    assert _mode(jdir / "plain") == 0o644
