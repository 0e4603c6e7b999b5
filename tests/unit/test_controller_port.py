"""A root controller for several users warns when any user may take its port: while it
is down, another user's process listening there is sent the jobs' tokens by their
clients, which outlive the restart (docs/admin-guide.md, "Security")."""

from __future__ import annotations

from pathlib import Path

import pytest
from attrs import evolve

from xce_resize_plugin.controllers.live.settings import (
    LiveConfig,
    first_unprivileged_port,
    takeable_port,
)

BASE = LiveConfig(state_dir=Path("/nonexistent"), hosts=(("h1", 1),))


@pytest.mark.parametrize(
    ("port", "euid", "single_user", "warned"),
    [
        (6820, 0, False, True),  # the default port, root, several users
        (0, 0, False, True),  # any free port: above 1024 as well
        (680, 0, False, False),  # only root binds below 1024
        (6820, 1000, False, False),  # not root: jobs run as the controller's own user
        (6820, 0, True, False),  # single user: no other user's job runs
    ],
)
def test_a_port_any_user_may_take_is_warned_of(
    port: int, euid: int, single_user: bool, warned: bool
) -> None:
    cfg = evolve(BASE, listen_port=port, single_user=single_user)
    warning = takeable_port(cfg, euid, 1024)
    assert (warning is not None) == warned
    if warning is not None:
        assert f"port {port} can be taken by any user's process" in warning
        assert "listen on a port below 1024" in warning


def test_a_system_where_every_port_is_anyones_says_so() -> None:
    # Common in containers: "listen on a port below 0" was the advice.
    warning = takeable_port(evolve(BASE, listen_port=80), 0, 0)
    assert warning is not None and "every port is open to every user here" in warning
    assert "below 0" not in warning


def test_the_first_unprivileged_port_is_the_systems() -> None:
    known = Path("/proc/sys/net/ipv4/ip_unprivileged_port_start")
    expected = int(known.read_text()) if known.exists() else 1024
    assert first_unprivileged_port() == expected
    # A system that lets every user bind every port: no port is root's alone.
    assert takeable_port(evolve(BASE, listen_port=80), 0, 0) is not None
