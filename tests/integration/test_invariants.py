"""Random interleavings of everything that can happen to resizes, with the controller
crashing at fact boundaries, must keep the invariants of docs/architecture.md
("Resize semantics") and docs/failover.md — autoresizable jobs among them: their demand
is kept exactly, and no grow (theirs or anyone's) takes slots the blocked queue head
needs (the controller runs with ``protect_reservation``, as scenarios and the live
controller do); hosts failing, coming back, being closed (with or without evacuation)
and opened included.

A crash is injected inside a host method the plugin calls to carry out an effect: by
then the facts of the transition are durable in the journal, and the effect is lost.
The controller object is dropped (no stop hook) and a new one starts on the same state
directory; task "processes" (the simulated task runner) outlive it, as real ones do.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from xce_resize_plugin import errors, plugin
from xce_resize_plugin.controllers.cluster import HostState
from xce_resize_plugin.controllers.sim import (
    EmbeddedController,
    NotificationRequest,
    NotificationResult,
    ScriptedNotificationRunner,
    SimTaskRunner,
    SubmissionRejected,
    TaskFaults,
)
from xce_resize_plugin.controllers.violations import HostStateError
from xce_resize_plugin.core import audit
from xce_resize_plugin.core.models import (
    AutoresizeRequest,
    CancelRequest,
    ChangeKind,
    GrowRequest,
    JobState,
    ReleaseRequest,
    ResizeRequest,
    ResizeState,
    Task,
)
from xce_resize_plugin.host import Principal
from xce_resize_plugin.journal import Journal
from xce_resize_plugin.manager import get_plugin_manager

HOSTS = [("h1", 4), ("h2", 8), ("h3", 2), ("h4", 8), ("h5", 6), ("h6", 8)]
USERS = ["alice", "bob"]
LIMITS = {"alice": 20}
GRACE = 10.0
#: Examples per run: quick by default; XCE_STRESS_EXAMPLES=2000 before a release.
EXAMPLES = int(os.environ.get("XCE_STRESS_EXAMPLES", "60"))


class SimulatedCrash(Exception):
    """The controller died here."""


class CountingRunner(SimTaskRunner):
    """Counts real task starts: a task id started twice is a bug."""

    def __init__(self, faults: TaskFaults) -> None:
        super().__init__(faults)
        self.starts: Counter[tuple[str, int]] = Counter()

    def start(self, job_id: str, task: Task, env: Mapping[str, str]) -> None:
        self.starts[(job_id, task.id)] += 1
        super().start(job_id, task, env)


class CrashingController(EmbeddedController):
    """Dies on the n-th effect call after ``arm(n)``; records the held slot count after
    every reserve and free in ``ledger`` (shared across restarts), and in ``overreach``
    every reservation of more new slots than the cycle offered the plugin (slots the
    blocked queue head needs at its shadow time)."""

    countdown: int | None = None
    ledger: dict[str, list[tuple[float, int]]]
    overreach: list[str]

    def _record(self, job_id: str) -> None:
        self.ledger.setdefault(job_id, []).append((self.now(), len(self.job(job_id).held)))

    def arm(self, n: int) -> None:
        self.countdown = n

    def _tick(self) -> None:
        if self.countdown is not None:
            self.countdown -= 1
            if self.countdown <= 0:
                self.countdown = None
                raise SimulatedCrash

    def reserve_slots(self, job_id: str, tasks: Sequence[Task]) -> None:
        self._tick()
        held = {t.id for t in self.job(job_id).held}
        # Recovery re-reserves held ones; and those on a failed host, which are not
        # charged but settled as lost (docs/failover.md).
        down = {h.name for h in self.host_views() if h.state is HostState.UNAVAIL}
        new = sum(1 for t in tasks if t.id not in held and t.host not in down)
        offered = self.offered_slot_count()
        if new > offered:
            self.overreach.append(f"t={self.now()} job {job_id}: {new} slots, {offered} offered")
        super().reserve_slots(job_id, tasks)
        self._record(job_id)

    def free_slots(self, job_id: str, task_ids: Sequence[int]) -> None:
        self._tick()
        super().free_slots(job_id, task_ids)
        self._record(job_id)

    def launch_tasks(self, job_id: str, tasks: Sequence[Task], env: Mapping[str, str]) -> None:
        self._tick()
        super().launch_tasks(job_id, tasks, env)

    def stop_tasks(self, job_id: str, task_ids: Sequence[int], grace: float) -> None:
        self._tick()
        super().stop_tasks(job_id, task_ids, grace)

    def run_notification(
        self,
        job_id: str,
        attempt: int,
        host: str,
        command: str,
        env: Mapping[str, str],
        timeout: float,
    ) -> None:
        self._tick()
        super().run_notification(job_id, attempt, host, command, env, timeout)

    def commit_allocation(self, job_id: str, tasks: Sequence[Task], version: int) -> None:
        self._tick()
        super().commit_allocation(job_id, tasks, version)


def scripted(request: NotificationRequest) -> NotificationResult:
    # The command names its outcome: no process per notification in a property test
    # (real commands are tested in test_hooks.py and the scenario tests).
    if request.command == "fail":
        return NotificationResult(1, "exit 1")
    if request.command == "timeout":
        return NotificationResult(None, "timeout")
    return NotificationResult(0, "exit 0")


class World:
    def __init__(self, state_dir: Path, defer: bool = False) -> None:
        self.state_dir = state_dir
        self.faults = TaskFaults()
        self.runner = CountingRunner(self.faults)
        self.notifier = ScriptedNotificationRunner(scripted)
        self.config = {
            "notify_max_failures": 2,
            "stop_grace": GRACE,
            "journal_sync": False,
            "journal_defer": defer,
        }
        self.ledger: dict[str, list[tuple[float, int]]] = {}
        self.overreach: list[str] = []
        self.ctl = self._make()
        self.crashes = 0
        self.jobs: list[str] = []
        #: Hosts out of scheduling (closed or failed) -> the tasks held there when they
        #: went out: no other task may be held there until they are back.
        self.off: dict[str, set[tuple[str, int]]] = {}

    def _make(self) -> CrashingController:
        CrashingController.ledger = self.ledger  # set before the constructor recovers
        CrashingController.overreach = self.overreach
        return CrashingController(
            get_plugin_manager(self.config, entry_points=False),
            self.state_dir,
            hosts=HOSTS,
            config=self.config,
            user_slots=LIMITS,
            durable=False,
            task_runner=self.runner,
            notification_runner=self.notifier,
            strict=False,
            protect_reservation=True,
        )

    def restart(self) -> None:
        self.crashes += 1
        self.ctl.close()
        self.ctl = self._make()

    def guarded(self, fn: Any, *args: Any) -> Any:
        """Run a driver call; on a simulated crash restart (a crash may strike during
        recovery too) and settle the new controller."""
        try:
            return fn(*args)
        except SimulatedCrash:
            while True:
                try:
                    self.restart()
                    self.ctl.settle()
                    return None
                except SimulatedCrash:
                    continue


def check(world: World) -> None:
    ctl = world.ctl
    assert ctl.check_invariants() == []
    assert world.overreach == [], "a grow took slots the blocked queue head needs"
    runtime = plugin.runtime_of(ctl)
    held_by_user: Counter[str] = Counter()
    for job in ctl.jobs():
        if job.state is JobState.RUN:
            held_by_user[job.user] += len(job.held)
            assert job.tasks[0].id == 0, "task 0 was released"
            state = runtime.states.get(job.id)
            if state is not None:
                # the plugin charges exactly what the host holds
                assert {t.id: t.host for t in state.held} == dict(
                    (t.id, t.host) for t in job.held
                ), job.id
                assert state.tasks == job.tasks
                change = state.change
                size = len(state.tasks)
                if change is not None and change.kind is ChangeKind.GROW:
                    size += len(change.tasks)
                assert job.min_tasks <= size <= job.max_tasks
                if change is not None and change.kind is ChangeKind.SHRINK:
                    assert len(state.tasks) - len(change.tasks) >= job.min_tasks
                _check_demand(state, job.max_tasks)
        else:
            assert not job.held
    for view in ctl.host_views():
        # No task placed on a closed or failed host after it became so (a failed host
        # holds nothing at all: check_invariants above).
        if view.state is not HostState.OK:
            held = {(j.id, t.id) for j in ctl.jobs() for t in j.held if t.host == view.name}
            assert held <= world.off.get(view.name, set()), view.name
    users = ctl.users_view()
    for user in USERS:
        assert users.get(user, {"slots_in_use": 0})["slots_in_use"] == held_by_user[user]
    assert all(n == 1 for n in world.runner.starts.values()), "a task started twice"


def _check_demand(state: ResizeState, max_tasks: int) -> None:
    """An autoresizable job idle below its maximum has exactly its demand pending, of
    1..max - current; no other job has one."""
    pending = state.pending
    if pending is not None and pending.auto:
        assert state.autoresize, f"job {state.job_id}: a demand without autoresize"
        assert (pending.min_add, pending.max_add) == (1, max_tasks - len(state.tasks))
    if state.autoresize and state.change is None and len(state.tasks) < max_tasks:
        assert pending is not None and pending.auto, f"job {state.job_id}: no demand"


# --- the operations ---------------------------------------------------------------------

_grow = st.tuples(
    st.just("grow"),
    st.integers(0, 9),
    st.integers(1, 2),
    st.integers(0, 3),
    st.booleans(),
    st.sampled_from([None, "ok", "fail", "timeout", "none"]),
)
_release_op = st.tuples(
    st.just("release"),
    st.integers(0, 9),
    st.sampled_from(["spec", "hosts", "ids", "count", "all", "allbut"]),
    st.integers(0, 50),
    st.booleans(),
    st.sampled_from([None, "ok", "fail", "none"]),
)

_submit = st.tuples(
    st.just("submit"),
    st.sampled_from(USERS),
    st.integers(1, 3),
    st.integers(1, 6),
    st.sampled_from([None, None, "ok", "fail", "timeout"]),
    st.sampled_from([True, True, True, False]),
    st.integers(20, 400),
    st.sampled_from([True, True, False]),
    # autoresizable (bsub -ar); without a range it is refused at submission
    st.sampled_from([False, False, True]),
)
# A wide rigid job of bob's (no limit): it queues, and often becomes the blocked head
# whose reservation grows and autoresize demands must leave alone.
_wide = st.tuples(
    st.just("submit"),
    st.just("bob"),
    st.integers(10, 24),
    st.just(0),
    st.just(None),
    st.just(False),
    st.integers(20, 400),
    st.just(False),
    st.just(False),
)
_advance = st.tuples(st.just("advance"), st.sampled_from([1, 5, 11, 60, 150]))
_crash = st.tuples(st.just("crash"), st.integers(1, 6))
_host = st.tuples(
    st.just("host"),
    st.integers(0, len(HOSTS) - 1),
    st.sampled_from(["down", "down", "up", "up", "close", "evacuate", "open"]),
)

# Weighted by repetition: mostly resizes on running jobs, with crashes armed often.
# Mostly resizable jobs pinned at their minimum: otherwise a job starts with all the
# tasks it may have and every grow is (rightly) rejected, and nothing is exercised.
ops = st.one_of(
    _grow,
    _grow,
    _grow,
    _release_op,
    _release_op,
    _release_op,
    _submit,
    _submit,
    _wide,
    _advance,
    _advance,
    _crash,
    _crash,
    st.tuples(st.just("cancel"), st.integers(0, 9)),
    st.tuples(st.just("modify"), st.integers(0, 9), st.booleans()),
    st.tuples(st.just("kill"), st.integers(0, 9)),
    st.tuples(st.just("failstart"), st.integers(0, 9), st.integers(0, 3)),
    st.tuples(st.just("stopdelay"), st.sampled_from([0.0, 3.0, 20.0])),
    _host,
    _host,
)


def _notify(choice: str | None) -> dict[str, Any]:
    if choice is None:
        return {}
    if choice == "none":
        return {"no_notify": True}
    return {"notify_cmd": choice}


def _release(kind: str, n: int, tasks: tuple[Task, ...], extra: dict[str, Any]) -> ReleaseRequest:
    hosts = list(dict.fromkeys(t.host for t in tasks))
    host = hosts[n % len(hosts)]
    if kind == "spec":
        return ReleaseRequest(spec=f"{1 + n % 3}*{host}", **extra)
    if kind == "hosts":
        return ReleaseRequest(hosts={host: None}, **extra)
    if kind == "ids":
        return ReleaseRequest(task_ids=(tasks[n % len(tasks)].id,), **extra)
    if kind == "count":
        return ReleaseRequest(count=1 + n % 3, **extra)
    if kind == "all":
        return ReleaseRequest(spec="all", **extra)
    return ReleaseRequest(spec=f"all ~{host}", **extra)


def apply(world: World, op: tuple[Any, ...]) -> None:
    ctl = world.ctl
    kind = op[0]
    # Requests go mostly to running resizable jobs (a request to a finished or rigid job
    # is rejected, which the unit tests cover); now and then to any job.
    live = [j.id for j in ctl.jobs() if j.state is JobState.RUN and j.resizable]
    pool = live or world.jobs
    pick = (lambda i: pool[i % len(pool)]) if pool else None
    if kind == "submit":
        _, user, lo, extra, notify, resizable, runtime, pinned, auto = op
        # A pinned job starts below its maximum on one host with room (as a job does on a
        # busy cluster); otherwise it queues and starts with as many tasks as fit.
        size = lo + runtime % (extra + 1)  # somewhere in lo..max, drawn with the runtime
        free = {h: n - ctl.hosts_view()[h]["used"] for h, n in HOSTS}
        room = [h for h, n in free.items() if n >= size]
        alloc = {room[0]: size} if pinned and room else None
        try:
            job_id = ctl.submit(
                user,
                (lo, lo + extra),
                runtime=float(runtime),
                resizable=resizable,
                autoresize=auto,
                notify_cmd=notify,
                alloc=alloc,
            )
        except (errors.ResizeError, SubmissionRejected):
            return
        world.jobs.append(job_id)
        world.guarded(ctl.settle)
        return
    if kind == "advance":
        world.guarded(ctl.run, ctl.now() + op[1])
        return
    if kind == "stopdelay":
        world.faults.stop_delay = op[1]
        return
    if kind == "crash":
        ctl.arm(op[1])
        return
    if kind == "host":
        change_host(world, HOSTS[op[1]][0], op[2])
        return
    if pick is None:
        return
    job_id = pick(op[1])
    job = ctl.job(job_id)
    request: ResizeRequest
    if kind == "grow":
        _, _, lo, extra, c, notify = op
        request = GrowRequest(lo, lo + extra, cancel_pending=c, **_notify(notify))
    elif kind == "release":
        _, _, form, n, c, notify = op
        if not job.tasks:
            return
        request = _release(form, n, job.tasks, {"cancel_pending": c, **_notify(notify)})
    elif kind == "cancel":
        request = CancelRequest()
    elif kind == "modify":
        request = AutoresizeRequest(op[2])
    elif kind == "kill":
        world.guarded(ctl.kill, job_id)
        world.guarded(ctl.settle)
        return
    elif kind == "failstart":
        base = max((t.id for t in job.held), default=-1) + 1
        world.faults.fail_starts.add((job_id, base + op[2]))
        return
    else:  # pragma: no cover
        raise AssertionError(kind)
    owner = Principal(job.user)

    def submit_request() -> None:
        try:
            ctl.request_resize(owner, job_id, request)
        except errors.ResizeError:
            return
        ctl.settle()

    world.guarded(submit_request)


def change_host(world: World, name: str, action: str) -> None:
    """Fail, repair, close (evacuate) or open a host, as an injected failure or an
    administrator would; an invalid transition is refused and changes nothing."""
    ctl = world.ctl
    before = {(j.id, t.id) for j in ctl.jobs() for t in j.held if t.host == name}

    def act() -> None:
        try:
            if action == "down":
                ctl.host_down(name)
            elif action == "up":
                ctl.host_up(name)
            elif action in ("close", "evacuate"):
                ctl.host_close(name, evacuate=action == "evacuate")
            else:
                ctl.host_open(name)
        except HostStateError:
            return
        ctl.settle()

    world.guarded(act)
    ctl = world.ctl
    if ctl.host_view(name).state is HostState.OK:
        world.off.pop(name, None)
    else:
        world.off.setdefault(name, before)
    # The host frees a failed host's slots itself: the ledger of held counts follows.
    for job in ctl.jobs():
        if job.state is JobState.RUN:
            world.ledger.setdefault(job.id, []).append((ctl.now(), len(job.held)))


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(st.lists(ops, min_size=30, max_size=90), st.booleans())
def test_random_interleavings_keep_the_invariants(
    tmp_path_factory: Any, script: list[tuple[Any, ...]], defer: bool
) -> None:
    world = World(tmp_path_factory.mktemp("inv"), defer)
    try:
        for op in script:
            apply(world, op)
            check(world)
        # Let every change in flight finish: stops exit within the grace period.
        world.ctl.countdown = None
        world.guarded(world.ctl.run, world.ctl.now() + GRACE + 1)
        check(world)
        runtime = plugin.runtime_of(world.ctl)
        for state in runtime.states.values():
            assert state.change is None, f"job {state.job_id} stuck in {state.phase}"
        # run everything to the end: all jobs end, no slot outlives its job
        world.guarded(world.ctl.run, None)
        check(world)
        assert all(h["used"] == 0 for h in world.ctl.hosts_view().values())
        assert runtime.states == {} or all(
            world.ctl.job(j).state is JobState.RUN for j in runtime.states
        )
        # accounting equals the integral of what the host charged
        for job in world.ctl.jobs():
            usage = world.ctl.acct_usage(job.id)
            assert abs(usage.slot_seconds - _host_integral(job, world.ledger)) < 1e-6, job.id
    finally:
        world.ctl.close()
    assert audit.replay_problems(world.state_dir / "resize") == []


def _host_integral(job: Any, ledger: Mapping[str, list[tuple[float, int]]]) -> float:
    """Slot-seconds from the host's side: held counts recorded after every reserve and
    free, from the job's start (its dispatch allocation) to its end (everything freed)."""
    if job.start_time is None:
        return 0.0
    points = [(job.start_time, len(job.versions[0].tasks) if job.versions else len(job.tasks))]
    points += ledger.get(job.id, [])
    end = job.end_time
    assert end is not None
    points.append((end, 0))
    return sum(n * (points[i + 1][0] - t) for i, (t, n) in enumerate(points[:-1]))


def test_a_deferred_launch_lost_in_a_crash_is_decided_again(tmp_path: Path) -> None:
    """With journal_defer, TasksLaunched is written with the next transaction
    (engine.DEFERRABLE): a crash inside the launch loses it, and the recovered
    controller decides the launch again without starting a task twice."""
    world = World(tmp_path, defer=True)
    job = world.ctl.submit("alice", "2,8", runtime=1000, resizable=True, alloc={"h1": 2})
    world.ctl.settle()
    world.ctl.request_resize(Principal("alice"), job, GrowRequest(2, 2, no_notify=True))
    world.ctl.arm(2)  # the placement's reserve_slots, then the launch: dies in there
    with pytest.raises(SimulatedCrash):
        world.ctl.settle()

    def kinds() -> list[str]:
        with Journal.open(tmp_path / "resize", readonly=True) as journal:
            return [json.loads(p)["type"] for _, p in journal.job_facts(job)]

    assert kinds()[-1] == "GrowPlaced"  # the launch was decided, not yet written
    world.restart()
    world.ctl.settle()
    assert len(world.ctl.job(job).tasks) == 4
    check(world)  # among others: no task started twice
    assert kinds()[-4:] == [
        "GrowPlaced",
        "TasksLaunched",
        "TasksStarted",  # the two starts, reported together
        "Committed",
    ]
    assert audit.replay_problems(tmp_path / "resize") == []


def test_a_job_end_lost_in_a_crash_is_accounted_at_the_hosts_end(tmp_path: Path) -> None:
    """A job that ended while its end was not yet written (journal_defer) or no
    controller ran: recovery ends its resize state at the end the host knows, so its
    accounting does not run on until the restart."""
    world = World(tmp_path, defer=True)
    job = world.ctl.submit("alice", "1,4", runtime=20, resizable=True, alloc={"h1": 1})
    world.ctl.settle()
    world.ctl.request_resize(Principal("alice"), job, GrowRequest(1, 1, no_notify=True))
    world.ctl.run(until=30)  # the job ended at 20; its JobEnded is not written yet
    with Journal.open(tmp_path / "resize", readonly=True) as journal:
        assert "JobEnded" not in [json.loads(p)["type"] for _, p in journal.job_facts(job)]
    world.restart()  # a crash: nothing written since
    world.ctl.run(until=60)
    usage = world.ctl.acct_usage(job)
    assert usage.slot_seconds == _host_integral(world.ctl.job(job), world.ledger) == 40.0
    check(world)
