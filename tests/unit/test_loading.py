"""The collector is paused while a controller loads its live state, and only then."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from pathlib import Path

import pytest

from xce_resize_plugin.controllers.sim import EmbeddedController
from xce_resize_plugin.core.models import GrowRequest
from xce_resize_plugin.host import Principal
from xce_resize_plugin.journal import Journal, collector_paused
from xce_resize_plugin.manager import get_plugin_manager


@pytest.fixture(autouse=True)
def _collector_on() -> Iterator[None]:
    was = gc.isenabled()
    gc.enable()
    yield
    if not was:
        gc.disable()


def test_paused_inside_restored_after() -> None:
    with collector_paused():
        assert not gc.isenabled()
    assert gc.isenabled()


def test_restored_when_the_block_raises() -> None:
    with pytest.raises(RuntimeError), collector_paused():
        raise RuntimeError("boom")
    assert gc.isenabled()


def test_a_caller_that_paused_it_keeps_it_paused() -> None:
    gc.disable()
    with collector_paused():
        with collector_paused():
            pass
        assert not gc.isenabled()
    assert not gc.isenabled()


def test_a_controller_start_pauses_while_loading_and_leaves_it_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both loads at a restart (the controller's job store, the plugin's live states)
    run with the collector paused, and the controller runs on with it enabled."""
    pm = get_plugin_manager({}, entry_points=False)
    ctl = EmbeddedController(pm, tmp_path, hosts=[("h1", 4)], store="lmdb", durable=False)
    job = ctl.submit("alice", "1,4", runtime=1e6, resizable=True, alloc={"h1": 1})
    ctl.request_resize(Principal("alice"), job, GrowRequest(1, 1, no_notify=True))
    ctl.settle()
    ctl.close()  # a crash: the restart loads both stores

    seen: list[tuple[str, bool]] = []
    load_states = Journal.live_states

    def live_states(self: Journal) -> Iterator[tuple[str, bytes]]:
        seen.append(("journal", gc.isenabled()))
        return load_states(self)

    monkeypatch.setattr(Journal, "live_states", live_states)
    from xce_resize_plugin.controllers import store

    decode = store._decode

    def _decode(raw: bytes, where: str, key: str) -> object:
        seen.append(("store", gc.isenabled()))
        return decode(raw, where, key)

    monkeypatch.setattr(store, "_decode", _decode)
    again = EmbeddedController(get_plugin_manager({}, entry_points=False), tmp_path, durable=False)
    assert ("store", False) in seen
    assert ("journal", False) in seen
    assert all(not enabled for _, enabled in seen)
    assert gc.isenabled()
    assert len(again.job(job).tasks) == 2
    again.stop()
