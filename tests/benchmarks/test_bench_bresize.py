"""bresize start-up: `bresize -V` wall time against `python3 -c pass` (target <= 1.6x),
both run as fresh processes, interleaved, in one run.

Measured in a virtualenv this benchmark creates with only the package installed (and its
dependencies): a tox environment full of test tools puts more on ``sys.path`` and
``site`` than a user's installation has, and would measure the wrong thing."""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TARGET = 1.6


def wall(argv: list[str], n: int) -> float:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def clean_venv(where: Path) -> Path:
    """A new virtualenv holding the package from this checkout; its ``bin`` directory."""
    venv.EnvBuilder(with_pip=True, clear=True).create(where)
    python = where / "bin" / "python"
    subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", str(ROOT)],
        check=True,
    )
    return python.parent


def test_bresize_version_startup(tmp_path: Path) -> None:
    bin_dir = clean_venv(tmp_path / "venv")
    base_argv = [str(bin_dir / "python"), "-c", "pass"]
    cmd_argv = [str(bin_dir / "bresize"), "-V"]
    wall(cmd_argv, 3)  # warm the page cache and the .pyc files
    a, b = [], []
    for _ in range(15):
        a.append(wall(base_argv, 3))
        b.append(wall(cmd_argv, 3))
    base, cmd = statistics.median(a), statistics.median(b)
    ratio = cmd / base
    met = "met" if ratio <= TARGET else "NOT met"
    print(
        f"\nbresize -V (clean virtualenv, {sys.version.split()[0]}): {cmd * 1e3:.1f} ms vs "
        f"python3 -c pass {base * 1e3:.1f} ms = {ratio:.2f}x (target <= {TARGET}x) {met}"
    )
