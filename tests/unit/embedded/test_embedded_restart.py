"""Crash and restart: a new controller on the same state_dir finds its state again."""

from __future__ import annotations

import gc
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import CtlFactory, Recorder, ToyResizer, make_pm
from xce_resize_plugin import hookimpl
from xce_resize_plugin.controllers.sim import (
    EmbeddedController,
    MemoryStore,
    StoreError,
    TaskFaults,
    TaskState,
)
from xce_resize_plugin.controllers.store import LmdbStore
from xce_resize_plugin.core.models import JobState, Task
from xce_resize_plugin.host import Controller


def crash(ctl: EmbeddedController) -> None:
    """Stop the controller without any hook, like a killed process (the caller still
    holds a reference, so the LMDB handle is released explicitly)."""
    ctl.close()


def test_restart_finds_jobs_slots_tasks_and_clock(tmp_path: Path) -> None:
    state = tmp_path / "state"
    toy = ToyResizer()
    ctl = EmbeddedController(make_pm(toy), state, {"h1": 4, "h2": 4}, durable=True)
    a = ctl.submit("alice", "2,6", runtime=100, alloc={"h1": 2}, resizable=True)
    b = ctl.submit("bob", 7, runtime=50)  # waits: 6 free, then a grows by 2
    toy.grow(a, 2)
    ctl.advance(10)
    before = {j.id: j for j in ctl.jobs()}
    assert before[a].version == 1 and len(before[a].held) == 4
    assert before[b].state is JobState.PEND
    del ctl  # a crash: no stop hook, no close(); the object is simply dropped

    recorder = Recorder()
    ctl2 = EmbeddedController(make_pm(recorder), state)  # hosts come from the store
    assert recorder.calls == [("start", 10.0)]
    assert ctl2.now() == 10.0
    after = {j.id: j for j in ctl2.jobs()}
    assert after == before
    assert ctl2.hosts_view() == {"h1": {"slots": 4, "used": 4}, "h2": {"slots": 4, "used": 0}}
    assert ctl2.job(a).task_states == dict.fromkeys(range(4), TaskState.RUNNING)
    assert ctl2.check_invariants() == []
    # The timeline is rebuilt from the records: a ends at 100, then b starts.
    ctl2.run()
    assert ctl2.job(a).end_time == 100.0
    assert ctl2.job(b).start_time == 100.0 and ctl2.job(b).end_time == 150.0
    assert ctl2.submit("carol", 1) == "103"  # the id sequence survived too
    ctl2.close()


def test_restart_reports_a_job_end_the_crash_interrupted(tmp_path: Path) -> None:
    class Crashy:
        @hookimpl
        def xce_job_end(self, controller: Controller, job_id: str) -> None:
            raise RuntimeError("controller process dies here")

    ctl = EmbeddedController(make_pm(Crashy()), tmp_path, {"h1": 2})
    job_id = ctl.submit("u", 2, runtime=5)
    with pytest.raises(RuntimeError, match="dies here"):
        ctl.run()
    crash(ctl)

    recorder = Recorder()
    ctl2 = EmbeddedController(make_pm(recorder), tmp_path)
    assert recorder.names() == ["start", "end"]
    assert ctl2.job(job_id).state is JobState.DONE
    assert ctl2.hosts_view()["h1"]["used"] == 0
    ctl2.close()
    recorder3 = Recorder()
    EmbeddedController(make_pm(recorder3), tmp_path).close()
    assert recorder3.names() == ["start"]  # reported once it returned


def test_stopping_task_exit_is_rearmed(tmp_path: Path) -> None:
    toy = ToyResizer(grace=30.0)
    store = MemoryStore()  # the same store object survives the "crash"
    ctl = EmbeddedController(make_pm(toy), tmp_path, {"h1": 4}, store=store)
    job_id = ctl.submit("u", "1,4", runtime=100)
    ctl.settle()
    ctl.faults.stop_delay = 8.0
    toy.release(job_id, (3,))
    ctl.advance(5)
    assert ctl.job(job_id).task_states[3] is TaskState.STOPPING
    del ctl
    gc.collect()

    class Freer:
        def __init__(self) -> None:
            self.exits: list[tuple[int, float]] = []

        @hookimpl
        def xce_task_events(self, controller: Controller, events: Sequence[Any]) -> None:
            # The embedded controller delivers task events in batches.
            for event in events:
                self.xce_task_event(controller, event)

        def xce_task_event(self, controller: Controller, event: object) -> None:
            self.exits.append((event.task_id, controller.now()))  # type: ignore[attr-defined]
            controller.free_slots(job_id, [3])

    freer = Freer()
    # Fault injection is the driver's and is not saved: install it again.
    ctl2 = EmbeddedController(
        make_pm(freer), tmp_path, store=store, faults=TaskFaults(stop_delay=8.0)
    )
    ctl2.run(until=20)
    assert freer.exits == [(3, 8.0)]  # exit at stop time + delay, not restart + delay
    assert ctl2.job(job_id).held == (Task(0, "h1"), Task(1, "h1"), Task(2, "h1"))


def test_lost_events_are_re_reported_on_relaunch(make_ctl: CtlFactory, tmp_path: Path) -> None:
    class LaunchOnly:
        @hookimpl
        def xce_dispatch_cycle(self, controller: Controller) -> None:
            job = controller.get_job("101")
            if job is not None and job.state is JobState.RUN and len(job.tasks) == 1:
                controller.reserve_slots("101", [Task(1, "h2")])
                controller.launch_tasks("101", [Task(1, "h2")], {})
                raise RuntimeError("crash before the started event is delivered")

    ctl = make_ctl(LaunchOnly(), state_dir=tmp_path / "s")
    ctl.submit("u", "1,2", runtime=100, alloc={"h1": 1})
    with pytest.raises(RuntimeError, match="crash"):
        ctl.settle()
    assert ctl.queued_events == 1
    crash(ctl)

    class Recover:
        events: list[str] = []

        @hookimpl
        def xce_controller_start(self, controller: Controller) -> None:
            controller.reserve_slots("101", [Task(1, "h2")])  # re-issued: no-op
            controller.launch_tasks("101", [Task(1, "h2")], {})  # re-reports

        @hookimpl
        def xce_task_events(self, controller: Controller, events: Sequence[Any]) -> None:
            # The embedded controller delivers task events in batches.
            for event in events:
                self.xce_task_event(controller, event)

        def xce_task_event(self, controller: Controller, event: object) -> None:
            self.events.append(repr(event))

    recover = Recover()
    ctl2 = make_ctl(recover, state_dir=tmp_path / "s", hosts=None)
    assert ctl2.queued_events == 1
    ctl2.settle()
    assert recover.events == [
        "TaskEvent(job_id='101', task_id=1, kind='started', status=None, reason='', stopped=False)"
    ]
    assert ctl2.hosts_view()["h2"]["used"] == 1


def test_newer_schema_refuses_to_start(tmp_path: Path) -> None:
    store = LmdbStore(tmp_path / "embedded")
    store.write({"schema": 99}, [])
    store.write(None, [])
    store.close()
    # encode_meta always writes the current schema: patch the raw record instead.
    import lmdb

    env = lmdb.open(str(tmp_path / "embedded"), max_dbs=4)
    with env.begin(write=True) as txn:
        txn.put(b"state", b'{"schema": 99}', db=env.open_db(b"meta", txn=txn))
    env.close()
    with pytest.raises(StoreError, match="newer"):
        EmbeddedController(make_pm(), tmp_path, {"h1": 1})


def test_failed_construction_releases_the_store(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="hosts are required"):
        EmbeddedController(make_pm(), tmp_path)
    ctl = EmbeddedController(make_pm(), tmp_path, {"h1": 1})  # the retry can open it
    assert ctl.hosts_view() == {"h1": {"slots": 1, "used": 0}}
    ctl.close()


def test_restart_keeps_a_queued_jobs_start_caps(tmp_path: Path) -> None:
    """A queued job's ``initial`` (and a trace's start size) are saved with it: after a
    restart it still starts with the size it was submitted with."""
    ctl = EmbeddedController(make_pm(Recorder()), tmp_path, {"h1": 4}, durable=True)
    ctl.submit("u", 4, runtime=10)
    capped = ctl.submit("u", "1,4", initial_tasks=2, runtime=10)
    sized = ctl.submit("u", "1,4", start_tasks=3, runtime=10)
    ctl.settle()
    assert ctl.job(capped).state is JobState.PEND
    crash(ctl)
    del ctl
    gc.collect()

    ctl2 = EmbeddedController(make_pm(Recorder()), tmp_path)
    assert ctl2.record(capped).initial_tasks == 2  # type: ignore[union-attr]
    assert ctl2.record(sized).start_tasks == 3  # type: ignore[union-attr]
    ctl2.run(until=10)
    assert len(ctl2.job(capped).tasks) == 2
    assert len(ctl2.job(sized).tasks) == 2  # 2 slots left: min..3 fits 2
    ctl2.close()
