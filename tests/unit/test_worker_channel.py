"""The controller's sender to one agent (controllers/live/tasks.py): a command that no
encoder takes is dropped alone, logged, and the rest of its batch still goes; the
sender's thread lives on (it once died there, and nothing reached the host again)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from xce_resize_plugin.controllers.live.tasks import WorkerChannel, unsendable

GOOD = {"op": "stop", "job": "7", "task": 1, "grace": 1.0}
BAD = {"op": "launch", "job": "8", "task": 0, "argv": ["sleep", "\ud800"]}


class Wire:
    """The agent's end: the bodies posted; the first post refused to connect when
    ``refuse`` (the channel then keeps the batch for the next agent)."""

    def __init__(self, refuse: bool = False) -> None:
        self.bodies: list[Any] = []
        self.refuse = refuse

    def post(self, url: str, content: bytes, headers: dict[str, str]) -> Any:
        self.bodies.append(json.loads(content))
        if self.refuse:
            raise httpx.ConnectError("refused")
        return SimpleNamespace(status_code=200)


def _channel(tmp_path: Path) -> WorkerChannel:
    fleet: Any = SimpleNamespace(state_dir=tmp_path, secret="s", epoch=3, owner=object())
    fleet.closed = False
    return WorkerChannel(fleet, "h1")


def test_an_unsendable_command_is_dropped_alone(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    assert unsendable(GOOD) is None and unsendable(BAD) is not None
    channel = _channel(tmp_path)
    wire = Wire()
    with caplog.at_level(logging.ERROR):
        channel._post(wire, [GOOD, BAD, GOOD])
    assert [body["commands"] for body in wire.bodies] == [[GOOD, GOOD]]
    assert "agent h1: launch command dropped: cannot be sent" in caplog.text


def test_a_batch_kept_for_the_next_agent_keeps_no_unsendable_command(tmp_path: Path) -> None:
    channel = _channel(tmp_path)
    channel._post(Wire(refuse=True), [BAD, GOOD])
    assert channel.queued() == set() and list(channel._queue) == [GOOD]
