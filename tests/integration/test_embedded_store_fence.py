"""Two embedded controllers on one state directory: the newer one's start fences the
older one's writes to its own store (``state_dir/embedded``), as the live controller's
store and the plugin's journal are fenced (docs/journal-format.md). The older one's
submission of a job that is not resizable (no journal fact to fence) overwrote the
newer one's jobs without an error."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from xce_resize_plugin.controllers.sim import EmbeddedController
from xce_resize_plugin.errors import FencedError
from xce_resize_plugin.manager import get_plugin_manager

CONFIG = {"journal_sync": False}


def _controller(state: Path, hosts: dict[str, int] | None = None) -> EmbeddedController:
    return EmbeddedController(
        get_plugin_manager(CONFIG, entry_points=False), state, hosts, config=CONFIG
    )


def test_the_older_controller_is_fenced_and_the_newer_ones_jobs_are_kept(tmp_path: Path) -> None:
    state = tmp_path / "state"
    first = _controller(state, {"h1": 8})
    first.submit("alice", 1)
    first.settle()
    # A newer controller on the same directory, in another process (LMDB opens an
    # environment once per process), submits a job of bob's.
    newer = textwrap.dedent(
        f"""
        from tests.integration.test_embedded_store_fence import _controller
        from pathlib import Path
        c = _controller(Path({str(state)!r}))
        print(c.submit("bob", 2)); c.settle(); c.close()
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", newer], capture_output=True, text=True, timeout=120, check=True
    )
    bobs = out.stdout.strip()
    with pytest.raises(FencedError, match="embedded controller's state is at epoch"):
        first.submit("carol", 1)
        first.settle()
    first.close()  # releases its files (it did not when its last write was refused)
    again = _controller(state)
    try:
        assert again.job(bobs).user == "bob"  # not carol's
        assert sorted(j.user for j in again.jobs()) == ["alice", "bob"]
    finally:
        again.close()
