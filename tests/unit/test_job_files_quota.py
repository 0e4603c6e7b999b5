"""A job's hostfile and task file are its owner's (docs/live-controller.md, "State
directory"), so the owner's disk quota may refuse them: that ends the job, not the
controller's writes for every user; a file the controller keeps as its own still fails
as the controller's disk."""

from __future__ import annotations

import errno
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from xce_resize_plugin.controllers.live import task_commands
from xce_resize_plugin.controllers.live.live_state import LiveState
from xce_resize_plugin.controllers.live.proc import Account
from xce_resize_plugin.controllers.live.task_commands import TaskCommands
from xce_resize_plugin.core.models import Task

OWNER = Account("nobody", 65534, 65534, (65534,), "/nonexistent")


def _over_quota(path: Path, data: str, mode: int, owner: Account | None = None) -> None:
    raise OSError(errno.EDQUOT, "Disk quota exceeded")


def _controller(tmp_path: Path, euid: int, account: Account) -> Any:
    fake = SimpleNamespace(euid=euid, _broken={}, live_store={})
    fake.job_dir = lambda job_id: tmp_path / job_id
    fake._job = lambda job_id: None
    fake._account = lambda job, spec: account
    fake._make_job_dir = lambda job_id, acc: None
    fake._file_owner = lambda acc: LiveState._file_owner(fake, acc)
    fake._write_job_file = lambda *args: TaskCommands._write_job_file(fake, *args)
    return fake


def test_the_owners_quota_ends_the_job_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(task_commands, "atomic_write", _over_quota)
    fake = _controller(tmp_path, 0, OWNER)
    TaskCommands._write_hostfile(fake, "101", [Task(0, "h1")])
    assert fake._broken == {"101": "hostfile: over the disk quota of user nobody"}


def test_a_file_the_controller_keeps_fails_as_its_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A personal controller's job (its own user's): the file is the controller's, and
    the quota is the controller's disk's failure (docs/live-controller.md)."""
    monkeypatch.setattr(task_commands, "atomic_write", _over_quota)
    fake = _controller(tmp_path, 65534, OWNER)
    with pytest.raises(OSError) as raised:
        TaskCommands._write_hostfile(fake, "101", [Task(0, "h1")])
    assert raised.value.errno == errno.EDQUOT and fake._broken == {}
