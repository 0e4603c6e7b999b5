"""Concurrent resize requests share fsyncs, and keep every guarantee (issue #13, "Speed").

The live controller hands its lock over while a request's journal write is fsynced
(docs/architecture.md, "Concurrency"). What must still hold, checked here with real
LMDB files, threads, and for the second test real processes and a real HTTP server:

- requests are decided while another request's fsync runs (so they can share the
  next one), and none is answered before its own fsync;
- the journal holds each job's facts in the order its requests were answered, and
  the observers (a recording) heard of the decisions in the journal's order;
- after a ``kill -9`` in the middle of a burst, a restarted controller finds every
  acknowledged request, and nothing that was not asked for;
- a recording of such a run replays to the same facts.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tests.e2e.live.test_live_inprocess import GOOD
from xce_resize_plugin.controllers.live import settings as live_config
from xce_resize_plugin.controllers.live.live_controller import LiveController
from xce_resize_plugin.controllers.observer import LiveObserver
from xce_resize_plugin.core.models import GrowRequest
from xce_resize_plugin.errors import Unreachable
from xce_resize_plugin.host import Principal
from xce_resize_plugin.journal import Journal
from xce_resize_plugin.manager import get_plugin_manager
from xce_resize_plugin.plugin import runtime_of
from xce_resize_plugin.recording.replay import replay
from xce_resize_plugin.rest.client import Client, RemoteError
from xce_resize_plugin.testing.live import ALICE, LiveCluster, kill_marked, wait_until

#: The in-process tests' configuration: hosts h1 and h2 of 2 slots; alice may use all 4.
CONFIG = GOOD.replace("alice = 3", "alice = 8")


class _Decisions(LiveObserver):
    """The job ids of the requests the controller said were decided, in that order."""

    def __init__(self) -> None:
        self.jobs: list[str] = []

    def hook_decided(self, name: str, kwargs: Mapping[str, Any]) -> None:
        self.jobs.append(str(kwargs["job_id"]))


def _journal_facts(state: Path) -> list[tuple[str, str]]:
    """(job id, fact type) of every fact in the plugin's journal, in sequence order."""
    with Journal.open(state / "resize", readonly=True) as journal:
        return [(job, json.loads(raw)["type"]) for _, job, raw in journal.facts()]


def _controller(tmp_path: Path) -> tuple[LiveController, live_config.LiveConfig]:
    """A live controller of :data:`CONFIG` in ``tmp_path``, not opened yet."""
    path = tmp_path / "c.toml"
    path.write_text(CONFIG)
    cfg = live_config.load(path)
    return LiveController(get_plugin_manager(cfg.resize), cfg), cfg


def _running_jobs(ctl: LiveController, hosts: tuple[str, ...]) -> list[str]:
    """Open ``ctl``; one running resizable job of alice's on each of ``hosts``."""
    ctl.open()
    jobs = [
        ctl.submit_job(
            Principal("alice"),
            {"command": ["sleep", "600"], "tasks": "1,2", "alloc": {h: 1}, "resizable": True},
        )["id"]
        for h in hosts
    ]
    for job in jobs:
        wait_until(lambda j=job: ctl.job_json(j)["tasks"][0]["pid"], 10, f"job {job} running")
    return jobs


def test_requests_are_decided_while_another_waits_for_its_fsync(tmp_path: Path) -> None:
    """Four grows on a full cluster while the journal cannot write: all four are decided
    (the controller lock is free for them), none is answered; once the journal writes,
    all four are answered and the journal has them in the order they were decided.
    Before the controller handed its lock over, the first request held it through its
    fsync and the others could not even be decided."""
    ctl, cfg = _controller(tmp_path)
    pm = ctl.plugin_manager
    decisions = _Decisions()
    ctl.add_observer(decisions)
    try:
        jobs = _running_jobs(ctl, ("h1", "h1", "h2", "h2"))
        alice = Principal("alice")
        runtime = runtime_of(ctl)
        answered: list[str] = []

        def grow(job: str) -> None:
            request = GrowRequest(1, 1, no_notify=True)
            pm.hook.xce_resize_request(controller=ctl, principal=alice, job_id=job, request=request)
            answered.append(job)

        def decided() -> bool:
            if not ctl.lock.acquire(timeout=5):
                raise AssertionError("the controller lock is held while a request is fsynced")
            try:
                return all(
                    (s := runtime.states.get(j)) is not None and s.pending is not None for j in jobs
                )
            finally:
                ctl.lock.release()

        threads = [threading.Thread(target=grow, args=(j,)) for j in jobs]
        with runtime.journal._shared.turn:  # no journal write can start meanwhile
            for t in threads:
                t.start()
            wait_until(decided, 10, "all four requests decided")
            assert answered == []  # nothing acknowledged before its fsync
        for t in threads:
            t.join(10)
        assert sorted(answered) == sorted(jobs)
        grows = [job for job, kind in _journal_facts(cfg.state_dir) if kind == "GrowRequested"]
        assert grows == decisions.jobs
        assert sorted(grows) == sorted(jobs)
        assert ctl.check_invariants() == []
    finally:
        ctl.shutdown()
        kill_marked(str(tmp_path))


class _Wakes(threading.Event):
    """The loop's wake-up event, noting for each ``set()`` by thread ``who`` whether
    the journal was held up at the time."""

    def __init__(self) -> None:
        super().__init__()
        self.who: int | None = None
        self.held_up = False
        self.calls: list[bool] = []

    def set(self) -> None:
        if threading.get_ident() == self.who:
            self.calls.append(self.held_up)
        super().set()


def test_a_request_wakes_the_loop_once_when_decided(tmp_path: Path) -> None:
    """A resize request wakes the controller loop once, when it is decided, while its
    fsync is still held up (so the cycle runs meanwhile, with the lock handed over),
    not again when it returns, nor for the policy hooks it calls; the next hook call of
    the same thread wakes the loop as usual. Before, the loop was woken after every hook
    call, the nested ones included, and after the fsync."""
    ctl, _ = _controller(tmp_path)
    pm = ctl.plugin_manager
    wakes = _Wakes()
    try:
        job, *_ = _running_jobs(ctl, ("h1", "h1", "h2", "h2"))  # the cluster is full
        ctl._wake = wakes
        alice = Principal("alice")
        runtime = runtime_of(ctl)
        done = threading.Event()

        def grow_then_status() -> None:
            wakes.who = threading.get_ident()
            request = GrowRequest(1, 1, no_notify=True)
            answer = pm.hook.xce_resize_request(
                controller=ctl, principal=alice, job_id=job, request=request
            )
            assert answer.pending is not None  # accepted, and it pends
            wakes.held_up = False
            pm.hook.xce_resize_status(controller=ctl, job_id=job)
            done.set()

        thread = threading.Thread(target=grow_then_status)
        with runtime.journal._shared.turn:  # no journal write can start meanwhile
            wakes.held_up = True
            thread.start()
            wait_until(lambda: wakes.calls, 10, "the loop woken")
            assert not done.is_set()
        thread.join(10)
        assert done.is_set()
        assert wakes.calls == [True, False]
        assert ctl.check_invariants() == []
    finally:
        ctl.shutdown()
        kill_marked(str(tmp_path))


#: Clients of the burst, each on its own one-task job of a full cluster (every grow
#: pends), alternating grow and cancel; the controller is killed once this many
#: requests were answered.
CLIENTS, OPS, KILL_AFTER = 24, 16, 150


def _client(
    live: LiveCluster, job: str, answered: list[tuple[str, str]], lock: threading.Lock
) -> str | None:
    """Grow, cancel, grow, ... until done or the controller is gone; the request whose
    answer never came (its outcome is unknown), if any."""
    client = Client(live.url(), ALICE, timeout=30)
    base = f"/v1/jobs/{job}/resize"
    for k in range(OPS):
        kind = "GrowRequested" if k % 2 == 0 else "GrowCancelled"
        try:
            if kind == "GrowRequested":
                client.call("POST", f"{base}/grow", {"tasks": 1, "no_notify": True})
            else:
                client.call("DELETE", f"{base}/pending")
        except (Unreachable, RemoteError) as exc:
            if isinstance(exc, RemoteError) and exc.http_status < 500:
                raise
            return kind  # killed meanwhile: this one may or may not be written
        with lock:
            answered.append((job, kind))
    return None


def test_a_burst_killed_midway_keeps_every_acknowledged_request(tmp_path: Path) -> None:
    """24 clients over HTTP, the controller SIGKILLed after 150 answers: every
    acknowledged request is in the journal, in each job's order, and nothing more
    than at most each client's one unanswered request; the recording (decisions in
    journal order) replays to the same facts; a restarted controller shows each job as
    its last acknowledged request left it."""
    hosts = {f"n{i}": 6 for i in range(4)}
    live = LiveCluster(tmp_path, hosts, {"stop_grace": 1.0})
    text = live.config.read_text()
    live.config.write_text(text.replace("[controller]\n", '[controller]\nrecord = "run.jsonl"\n'))
    try:
        live.start()
        jobs = [
            live.submit(min_tasks=1, max_tasks=2, resizable=True, alloc={f"n{i % 4}": 1})
            for i in range(CLIENTS)
        ]
        for job in jobs:
            live.running(job, 1)
        answered: list[tuple[str, str]] = []
        unknown: dict[str, str] = {}
        lock = threading.Lock()

        def run(job: str) -> None:
            left = _client(live, job, answered, lock)
            if left is not None:
                unknown[job] = left

        threads = [threading.Thread(target=run, args=(j,)) for j in jobs]
        for t in threads:
            t.start()
        wait_until(lambda: len(answered) >= KILL_AFTER, 60, f"{KILL_AFTER} answers")
        live.crash()
        for t in threads:
            t.join(60)
        facts = _journal_facts(live.state)
        for job in jobs:
            mine = [kind for j, kind in facts if j == job and kind != "JobTracked"]
            acked = [kind for j, kind in answered if j == job]
            # The journal holds the acknowledged requests, in order, and at most the
            # one request that was in flight when the controller died.
            assert mine[: len(acked)] == acked, (job, mine, acked)
            assert mine[len(acked) :] in ([], [unknown.get(job)]), (job, mine, acked)
        result = replay(tmp_path / "run.jsonl")
        assert result.ok, result.problems
        # The recording ends as after a crash: start again without it.
        live.config.write_text(text)
        live.start()
        for job in jobs:
            mine = [kind for j, kind in facts if j == job and kind != "JobTracked"]
            want = "GROW_PENDING" if mine and mine[-1] == "GrowRequested" else "IDLE"
            assert live.phase(job) == want, (job, mine)
        assert live.cluster()["problems"] == []
    finally:
        live.cleanup()
        kill_marked(str(tmp_path))
