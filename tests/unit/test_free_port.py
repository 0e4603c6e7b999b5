"""The test helper's ports (``testing.live.free_port``): drawn below the kernel's range
for outgoing connections, never the same twice in a process, and still found when that
range starts at the lowest port a user may bind (a common tuning of busy hosts)."""

from __future__ import annotations

import socket

import pytest

from xce_resize_plugin.testing import live


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def test_ports_come_from_below_the_outgoing_range() -> None:
    low = live._ephemeral_low()
    ports = [live.free_port() for _ in range(20)]
    assert len(set(ports)) == 20
    assert all(max(1024, low - 12000) <= p < low for p in ports), (low, ports)
    assert all(_bindable(p) for p in ports)


def test_a_range_that_starts_at_1024_still_gives_a_port(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(live, "_ephemeral_low", lambda: 1024)
    port = live.free_port()
    assert 0 < port < 65536 and _bindable(port)
