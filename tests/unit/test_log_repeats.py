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


def test_what_was_held_back_is_told_when_the_server_stops(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A kind that never comes again would keep its count to itself: the controller
    tells every kind's count once the server has stopped, each on a line of its own
    (the limit does not hold those back), and then the counts start from zero."""
    clock = Clock()
    limit = logs.RepeatLimit(window=60.0, clock=clock)
    server_errors = logging.getLogger(logs.SERVER_ERRORS)
    server_errors.addFilter(limit)
    try:
        for _ in range(3):
            limit.filter(_record("Invalid HTTP request received."))
        for _ in range(1002):
            limit.filter(_record("kind one"))
        for n in range(1001):  # past 1,000 kinds: forgotten, counted as untold
            limit.filter(_record(f"kind {n} %s"))
            limit.filter(_record(f"kind {n} %s"))
        limit.filter(_record("last kind"))
        limit.filter(_record("last kind"))
        with caplog.at_level(logging.WARNING, logger=logs.SERVER_ERRORS):
            logs.tell_held_back()
            logs.tell_held_back()  # nothing new: nothing more
    finally:
        server_errors.removeFilter(limit)
    told = [r.getMessage() for r in caplog.records if r.name == logs.SERVER_ERRORS]
    # Kind 999 was the 1,002nd: the 1,001 kinds before it were forgotten with their
    # 2 + 1,001 + 999 held back.
    assert told == [
        "kind 999 %s (1 more like it held back, not written)",
        "kind 1000 %s (1 more like it held back, not written)",
        "last kind (1 more like it held back, not written)",
        "2,002 more warnings held back, of kinds no longer counted one by one",
    ]


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
