"""The key-value writes in progress (controllers/live/job_kv.WriteSlots): at most so
many of one user, and of all users together, so that any other request waits behind a
bounded number of fsyncs however many users write (docs/in-job-api.md)."""

from __future__ import annotations

import contextlib

import pytest

from xce_resize_plugin.controllers.live.job_kv import WriteSlots
from xce_resize_plugin.errors import TooManyRequests


def test_a_user_and_all_users_are_bounded() -> None:
    slots = WriteSlots(limit=2, in_all=3)
    with contextlib.ExitStack() as stack:
        stack.enter_context(slots.take("a"))
        stack.enter_context(slots.take("a"))
        with pytest.raises(TooManyRequests, match=r": user a has 2 key-value writes in progress"):
            stack.enter_context(slots.take("a"))
        stack.enter_context(slots.take("b"))
        with pytest.raises(TooManyRequests, match=r": the controller has 3 key-value writes"):
            stack.enter_context(slots.take("c"))
        assert "c" not in slots._held  # a refused write counts nowhere
    assert slots._held == {}  # every slot given back
    with slots.take("c"):
        assert slots._held == {"c": 1, "": 1}


def test_a_slot_comes_back_when_the_write_fails() -> None:
    slots = WriteSlots(limit=1, in_all=1)
    with pytest.raises(OSError), slots.take("a"):
        raise OSError("disk")
    with slots.take("b"):
        pass
    assert slots._held == {}
