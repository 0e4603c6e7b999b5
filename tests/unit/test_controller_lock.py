"""The live controller's lock: handed over only by a thread that holds it once."""

from __future__ import annotations

import threading

import pytest

from xce_resize_plugin.controllers.live.controller_lock import ControllerLock


def _free_for_others(lock: ControllerLock) -> bool:
    """Whether another thread can take the lock now (without waiting)."""
    got: list[bool] = []

    def probe() -> None:
        taken = lock.acquire(blocking=False)
        got.append(taken)
        if taken:
            lock.release()

    thread = threading.Thread(target=probe)
    thread.start()
    thread.join()
    return got == [True]


def test_held_once_hands_the_lock_over_and_takes_it_back() -> None:
    lock = ControllerLock()
    assert not lock.held_once()
    with lock:
        assert lock.held_once()
        with lock.handed_over() as released:
            assert released
            assert not lock.held_once()
            assert _free_for_others(lock)
        assert lock.held_once()
        assert not _free_for_others(lock)
    assert _free_for_others(lock)


def test_held_twice_or_not_at_all_nothing_is_handed_over() -> None:
    lock = ControllerLock()
    with lock, lock:
        assert not lock.held_once()
        with lock.handed_over() as released:
            assert not released
            assert not _free_for_others(lock)  # the outer hold's operation stays whole
    with lock.handed_over() as released:
        assert not released


def test_the_lock_is_taken_back_when_the_body_raises() -> None:
    lock = ControllerLock()
    with lock:
        with pytest.raises(RuntimeError), lock.handed_over():
            raise RuntimeError("the fsync failed")
        assert lock.held_once()
        assert not _free_for_others(lock)


def test_another_thread_holding_it_once_is_not_this_thread() -> None:
    lock = ControllerLock()
    holding, done = threading.Event(), threading.Event()

    def hold() -> None:
        with lock:
            holding.set()
            done.wait(10)

    thread = threading.Thread(target=hold)
    thread.start()
    assert holding.wait(10)
    try:
        assert not lock.held_once()
    finally:
        done.set()
        thread.join()
