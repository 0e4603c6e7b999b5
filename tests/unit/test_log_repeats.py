"""The live controller's log holds back repeats of uvicorn's per-request warnings
(controllers/live/logs.py ``RepeatLimit``): a client sending malformed requests in a
loop cannot fill the log, and the first of each kind is still written at once."""

from __future__ import annotations

import logging

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
        "Invalid HTTP request received. (4 more like it in the last 60 s)"
    )
    assert not limit.filter(_record("Invalid HTTP request received."))


def test_the_limit_survives_uvicorns_own_log_configuration() -> None:
    """uvicorn configures its loggers when its Config is made (the text format keeps
    uvicorn's own layout): the filter on its error logger stays."""
    import uvicorn

    server_errors = logging.getLogger(logs.SERVER_ERRORS)
    before = list(server_errors.filters)
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        logs.configure("text")
        logs.configure("text")  # twice: one filter
        uvicorn.Config(app=lambda *a: None)  # applies uvicorn's LOGGING_CONFIG
        kept = [f for f in server_errors.filters if isinstance(f, logs.RepeatLimit)]
        assert len(kept) == 1
    finally:
        for f in list(server_errors.filters):
            if f not in before:
                server_errors.removeFilter(f)
        root.handlers[:] = handlers
        root.setLevel(level)
