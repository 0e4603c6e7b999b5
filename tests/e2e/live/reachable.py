"""A temporary directory other users can reach, for the tests whose jobs run as
another user than root (``nobody``): the state directory under it must be
searchable by them, which pytest's private ``tmp_path`` is not."""

from __future__ import annotations

import contextlib
import os
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def reachable_dir(prefix: str) -> Iterator[Path]:
    """A new directory in /tmp, mode 0711, removed afterwards with all it holds."""
    path = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    os.chmod(path, 0o711)
    try:
        yield path
    finally:
        # rm, not shutil.rmtree: what a failed test leaves may be too deep to recurse.
        subprocess.run(["rm", "-rf", "--", str(path)], check=False)
