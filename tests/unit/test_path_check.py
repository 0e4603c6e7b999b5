"""The PATH of other users' jobs is checked at a root controller's start
(controllers/live/path_check.py): an entry someone other than root can change is told."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from xce_resize_plugin.controllers.live.path_check import unsafe_path_entries
from xce_resize_plugin.controllers.runners import DEFAULT_PATH


def test_the_default_path_of_this_machine_is_roots() -> None:
    if any(os.stat(p).st_uid != 0 for p in DEFAULT_PATH.split(":") if os.path.exists(p)):
        pytest.skip("this machine's own directories are not root's")
    assert unsafe_path_entries(DEFAULT_PATH) == []


@pytest.mark.skipif(os.geteuid() != 0, reason="a root-owned directory needs root to make")
def test_a_writable_entry_or_parent_is_told(tmp_path: Path) -> None:
    safe = tmp_path / "safe" / "bin"
    safe.mkdir(parents=True)
    os.chmod(tmp_path, 0o755)
    os.chmod(tmp_path / "safe", 0o755)
    os.chmod(safe, 0o755)
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o775)  # a group's tool directory
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    os.chown(theirs, 65534, 65534)
    sticky = tmp_path / "sticky"
    sticky.mkdir()
    os.chmod(sticky, 0o1777)
    path = os.pathsep.join(
        [str(safe), str(shared), str(theirs), str(sticky / "not-yet"), "relative", ""]
    )
    told = unsafe_path_entries(path)
    assert [line.split(":")[0] for line in told] == [
        str(shared),
        str(theirs),
        str(sticky / "not-yet"),
    ], told
    assert "mode 0775" in told[0] and "uid 65534" in told[1] and "mode 1777" in told[2]
