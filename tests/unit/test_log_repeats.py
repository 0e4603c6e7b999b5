"""The live controller's log holds back repeats of uvicorn's per-request warnings
(controllers/live/logs.py ``RepeatLimit``): a client sending malformed requests in a
loop cannot fill the log, and the first of each kind is still written at once."""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest

pytest.importorskip("uvicorn")

from xce_resize_plugin.controllers.live import logs


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _record(msg: str, level: int = logging.WARNING) -> logging.LogRecord:
    return logging.LogRecord("uvicorn.error", level, "f", 1, msg, None, None)


def test_one_line_per_kind_per_window_then_how_many_were_held_back() -> None:
    clock = Clock()
    limit = logs.RepeatLimit(window=60.0, clock=clock)
    assert limit.filter(_record("Invalid HTTP request received."))
    held = [limit.filter(_record("Invalid HTTP request received.")) for _ in range(4)]
    assert held == [False] * 4
    assert limit.filter(_record("another kind"))  # each kind has its own window
    assert not limit.filter(_record("another kind"))
    assert limit.filter(_record("info passes", logging.INFO))
    assert limit.filter(_record("info passes", logging.INFO))
    clock.now = 60.0
    later = _record("Invalid HTTP request received.")
    assert limit.filter(later)
    assert later.getMessage() == (
        "Invalid HTTP request received. (4 more like it since the last one written)"
    )
    assert not limit.filter(_record("Invalid HTTP request received."))


def test_the_limit_survives_uvicorns_own_log_configuration() -> None:
    """uvicorn configures its loggers when its Config is made (the text format keeps
    uvicorn's own layout): the filter on its error logger stays. In a process of its
    own: configure() sets the logging of the whole process."""
    script = (
        "import logging, uvicorn\n"
        "from xce_resize_plugin.controllers.live import logs\n"
        "logs.configure('text'); logs.configure('text')\n"
        "uvicorn.Config(app=lambda *a: None)\n"
        "kept = [f for f in logging.getLogger(logs.SERVER_ERRORS).filters\n"
        "        if isinstance(f, logs.RepeatLimit)]\n"
        "print(len(kept))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == "1", done.stderr
