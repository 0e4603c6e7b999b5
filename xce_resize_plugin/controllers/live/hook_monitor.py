"""The live controller's hook calls: each under the lock, and durable waits.

The seventh layer of :class:`~.live_controller.LiveController` (see :mod:`.live_state`):
every hook call made through the plugin manager takes the controller lock, from any
thread (a hook-call monitor), and is shown to the observers; a resize request hands the
lock over while its journal write's fsync runs (:meth:`HookMonitor.durable_wait`), so
that concurrent requests share fsyncs (docs/architecture.md, "Concurrency").
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pluggy
from pluggy import HookImpl

from xce_resize_plugin.controllers.live.agents import Agents
from xce_resize_plugin.controllers.live.live_state import LIFECYCLE_HOOKS
from xce_resize_plugin.controllers.live.storage_faults import StateNotWritable, storage_failure
from xce_resize_plugin.errors import FencedError


class HookMonitor(Agents):
    """Hook calls under the lock, and durable waits (see the module docstring)."""

    def _before_hook(self, hook_name: str, impls: Any, kwargs: Mapping[str, Any]) -> None:
        self.lock.acquire()
        if (
            self.failing is not None
            and hook_name not in LIFECYCLE_HOOKS
            and threading.get_ident() != self._loop_ident
        ):
            # The plugin is stopped until the state can be written again (the resize
            # routes call hooks directly): refuse, with the reason.
            self.lock.release()
            raise StateNotWritable(str(self.failing))
        self._hook_calls().append((hook_name, kwargs))

    def _hook_calls(self) -> list[tuple[str, Mapping[str, Any]]]:
        calls: list[tuple[str, Mapping[str, Any]]] | None = getattr(self._calls, "stack", None)
        if calls is None:
            calls = self._calls.stack = []
        return calls

    def _after_hook(
        self,
        outcome: pluggy.Result[Any],
        hook_name: str,
        impls: Sequence[HookImpl],
        kwargs: Mapping[str, Any],
    ) -> None:
        calls = self._hook_calls()
        calls.pop()
        error = outcome.exception
        failure = storage_failure(error)
        try:
            if failure is not None:
                # E.g. the plugin's journal could not be written during a resize
                # request (no other catch of this controller's is on that path).
                self.storage_failed(failure)
            elif self.fenced is None and not isinstance(error, FencedError):
                # Nothing of ours happened once a newer controller owns the journal.
                for observer in self._observers:
                    observer.hook_returned(hook_name, kwargs, error)
        finally:
            self.lock.release()
        if hook_name == "xce_resize_request" and error is None:
            self._crash("after-request")
        # The outermost call wakes the loop (the hooks called inside it, e.g. the
        # policies a request asks, change nothing the loop would not see through it),
        # unless it is a request that woke it when it was decided (durable_wait).
        if not calls and not self._woke_at_decision() and threading.get_ident() != self._loop_ident:
            self._wake.set()  # e.g. a resize request: place it now, not at the next tick
        if isinstance(error, FencedError):
            self.fence(error)

    @contextlib.contextmanager
    def durable_wait(self) -> Iterator[None]:
        """The resize request hook in progress in this thread waits for its fsync: let
        other hook calls in meanwhile (:func:`xce_resize_plugin.host.durable_wait`).

        Only when the thread holds the lock just once, for that hook call alone (a
        caller holding it around more keeps it). The observers hear of the decision
        first (:meth:`~.observer.LiveObserver.hook_decided`), under the lock, in
        decision order. docs/architecture.md, "Concurrency", says why this keeps every
        guarantee.
        """
        calls = self._hook_calls()
        if len(calls) != 1 or not self.lock.held_once():
            yield
            return
        if self.fenced is None:
            name, kwargs = calls[0]
            for observer in self._observers:
                observer.hook_decided(name, kwargs)
        # The decision is the change a cycle acts on: wake the loop now, so that its
        # cycle runs during the fsync (with the lock handed over) rather than after,
        # once per request (docs/performance.md, "Durable REST throughput").
        self._calls.woken = True
        self._wake.set()
        with self.lock.handed_over():
            yield

    def _woke_at_decision(self) -> bool:
        """Whether this thread's request hook woke the loop when it was decided
        (:meth:`durable_wait`); asking clears it, for the next hook call."""
        woken: bool = getattr(self._calls, "woken", False)
        self._calls.woken = False
        return woken
