"""HostHooks calls a hook's only plain implementation directly (host._sole) only when
that is the call pluggy would make: monitors, later plugins, wrappers and
implementations taking other arguments all go through pluggy as before."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import pluggy
import pytest

from xce_resize_plugin import hookspecs
from xce_resize_plugin.host import HostHooks, _sole

impl = pluggy.HookimplMarker("xce")


class Recorder:
    """A plugin with plain implementations of the hooks HostHooks shortcuts."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[Any, ...]]] = []

    @impl
    def xce_sched_cycle(self, controller: Any, cluster: Any) -> None:
        self.calls.append(("sched_cycle", (controller, cluster)))

    @impl
    def xce_dispatch_cycle(self, controller: Any) -> None:
        self.calls.append(("dispatch_cycle", (controller,)))

    @impl
    def xce_job_validate(self, controller: Any, job: Any) -> None:
        self.calls.append(("job_validate", (controller, job)))

    @impl
    def xce_job_start(self, controller: Any, job: Any) -> None:
        self.calls.append(("job_start", (controller, job)))

    @impl
    def xce_job_end(self, controller: Any, job_id: str) -> None:
        self.calls.append(("job_end", (controller, job_id)))

    @impl
    def xce_task_events(self, controller: Any, events: Any) -> None:
        self.calls.append(("task_events", (controller, events)))


def _manager(*plugins: object) -> pluggy.PluginManager:
    pm = pluggy.PluginManager("xce")
    pm.add_hookspecs(hookspecs)
    for plugin in plugins:
        pm.register(plugin)
    return pm


def _call_all(hooks: HostHooks) -> None:
    hooks.sched_cycle("ctl", "cluster")  # type: ignore[arg-type]
    hooks.dispatch_cycle("ctl")  # type: ignore[arg-type]
    hooks.job_validate("ctl", "job")  # type: ignore[arg-type]
    hooks.job_start("ctl", "job")  # type: ignore[arg-type]
    hooks.job_end("ctl", "7")  # type: ignore[arg-type]
    hooks.task_events("ctl", ("e",))  # type: ignore[arg-type]


EXPECTED = [
    ("sched_cycle", ("ctl", "cluster")),
    ("dispatch_cycle", ("ctl",)),
    ("job_validate", ("ctl", "job")),
    ("job_start", ("ctl", "job")),
    ("job_end", ("ctl", "7")),
    ("task_events", ("ctl", ("e",))),
]


def test_a_sole_plain_implementation_is_called_directly() -> None:
    rec = Recorder()
    pm = _manager(rec)
    assert _sole(pm, pm.hook.xce_sched_cycle, ("controller", "cluster")) == rec.xce_sched_cycle
    _call_all(HostHooks(pm))
    assert rec.calls == EXPECTED


def test_a_monitor_sees_every_call_even_one_added_later() -> None:
    rec = Recorder()
    pm = _manager(rec)
    hooks = HostHooks(pm)
    seen: list[str] = []
    pm.add_hookcall_monitoring(lambda name, impls, kwargs: seen.append(name), lambda *a: None)
    assert _sole(pm, pm.hook.xce_sched_cycle, ("controller", "cluster")) is None
    _call_all(hooks)
    assert rec.calls == EXPECTED
    assert seen == [f"xce_{name}" for name, _ in EXPECTED]


def test_a_plugin_registered_later_is_called_too() -> None:
    first, second = Recorder(), Recorder()
    pm = _manager(first)
    hooks = HostHooks(pm)
    pm.register(second)
    _call_all(hooks)
    assert first.calls == EXPECTED and second.calls == EXPECTED
    pm.unregister(second)
    _call_all(hooks)
    assert len(first.calls) == 2 * len(EXPECTED) and len(second.calls) == len(EXPECTED)


def test_wrappers_and_other_signatures_go_through_pluggy() -> None:
    order: list[str] = []

    class Wrapper:
        @impl(wrapper=True)
        def xce_dispatch_cycle(self, controller: Any) -> Generator[None, None, None]:
            order.append("before")
            yield
            order.append("after")

    class Fewer:
        # pluggy passes an implementation only the arguments it names.
        @impl
        def xce_sched_cycle(self, cluster: Any) -> None:
            order.append(f"sched {cluster}")

    rec = Recorder()
    pm = _manager(rec, Wrapper())
    HostHooks(pm).dispatch_cycle("ctl")  # type: ignore[arg-type]
    assert order == ["before", "after"] and rec.calls == [("dispatch_cycle", ("ctl",))]
    pm2 = _manager(Fewer())
    assert _sole(pm2, pm2.hook.xce_sched_cycle, ("controller", "cluster")) is None
    HostHooks(pm2).sched_cycle("ctl", "c1")  # type: ignore[arg-type]
    assert order[-1] == "sched c1"


def test_an_exception_comes_out_as_raised() -> None:
    class Failing:
        @impl
        def xce_job_end(self, controller: Any, job_id: str) -> None:
            raise KeyError(job_id)

    pm = _manager(Failing())
    with pytest.raises(KeyError, match="'9'"):
        HostHooks(pm).job_end("ctl", "9")  # type: ignore[arg-type]


def test_without_pluggy_internals_the_shortcut_is_off(monkeypatch: pytest.MonkeyPatch) -> None:
    rec = Recorder()
    pm = _manager(rec)
    monkeypatch.delattr(pm.hook.xce_sched_cycle, "_hookimpls")
    assert _sole(pm, pm.hook.xce_sched_cycle, ("controller", "cluster")) is None
