"""The live controller's small state files (proc.atomic_write, proc.secret_file): a
failed write names the file. A buffered write or an fsync fails with an OSError that
names none, and the controller reports it as it is: at start on a full disk it said
``The controller's state cannot be written (nothing was changed): [Errno 28] No space
left on device``, in its message and in ``/v1/health``, with no file to look at."""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from xce_resize_plugin.controllers.live import proc
from xce_resize_plugin.controllers.live.storage_faults import StateNotWritable, storage_failure

FULL = Path("/dev/full")


def onto_a_full_disk(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every file the module opens by descriptor writes to /dev/full instead: its
    buffered write fails as on a full filesystem (ENOSPC, no file name)."""
    if not FULL.exists():
        pytest.skip("no /dev/full here")
    real = os.fdopen

    def fdopen(fd: int, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        os.close(fd)
        return real(os.open(FULL, os.O_WRONLY), mode, *args, **kwargs)

    monkeypatch.setattr(proc.os, "fdopen", fdopen)


def failing_fsync(monkeypatch: pytest.MonkeyPatch) -> None:
    def fsync(fd: int) -> None:
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(proc.os, "fsync", fsync)


@pytest.mark.parametrize(
    ("fault", "code"), [(onto_a_full_disk, errno.ENOSPC), (failing_fsync, errno.EIO)]
)
def test_a_failed_atomic_write_names_the_file_and_changes_nothing(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    fault: Callable[[pytest.MonkeyPatch], None],
    code: int,
) -> None:
    hostfile = tmp_path / "jobs" / "101" / "hostfile"
    hostfile.parent.mkdir(parents=True)
    hostfile.write_text("hostA\n")
    fault(monkeypatch)
    with pytest.raises(OSError) as failed:
        proc.atomic_write(hostfile, "hostA\nhostB\n")
    assert (failed.value.errno, failed.value.filename) == (code, str(hostfile))
    assert str(hostfile) in str(failed.value)
    assert hostfile.read_text() == "hostA\n"
    assert sorted(p.name for p in hostfile.parent.iterdir()) == ["hostfile"]  # no temp file
    # What the controller says (generations.storage_failed): the file and the error.
    cause = storage_failure(failed.value)
    assert cause is failed.value
    assert str(hostfile) in StateNotWritable(str(cause)).text


@pytest.mark.parametrize("fault", [onto_a_full_disk, failing_fsync])
def test_a_secret_that_cannot_be_written_names_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fault: Callable[[pytest.MonkeyPatch], None]
) -> None:
    key = tmp_path / "job-token.key"
    fault(monkeypatch)
    with pytest.raises(OSError) as failed:
        proc.secret_file(key)
    assert failed.value.filename == str(key)
    assert list(tmp_path.iterdir()) == []


def test_a_write_that_works_is_unchanged(tmp_path: Path) -> None:
    path = tmp_path / "tasks"
    proc.atomic_write(path, "x", mode=0o640)
    assert path.read_text() == "x" and path.stat().st_mode & 0o777 == 0o640
    assert proc.secret_file(tmp_path / "key") == proc.secret_file(tmp_path / "key")
