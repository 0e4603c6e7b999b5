"""The soak (issue #13, "Soak"; ``tox -e soak``, not in the default run).

Mixed load from 50 clients — submit, grow, release, cancel, status, kill — against a
real live controller with real agents and task processes, while every 30-60 s the
controller or a random agent is SIGKILLed (a killed controller is started again on the
same state directory; a killed agent is replaced by the controller). After every
kill the clients are held, the cluster settles and the test checks:

- the controller's own invariant check is empty, and neither it nor an agent logged
  an error (a failed cycle of the controller's loop is logged and survived);
- every running task has exactly one process, no task ever started twice, and every
  task of a job's allocation runs or was lost with its agent (a host failure);
- slots held equal the allocation of each running job, and the accounting charges them;
- every acknowledged request is in the plugin's journal (none lost) and nothing more
  than the acknowledged and the unanswered ones (none duplicated); every acknowledged
  submission is a known job.

At the end: the summary (requests acknowledged, lost, duplicated; restarts; orphan
processes) is printed, and the run fails if anything was lost, duplicated, orphaned or
inconsistent. Orphans are found by PID: every task, agent and controller process the
test saw is recorded, and after the last jobs are killed none may be left. Whatever it
started is killed by PID at the end.

Environment: ``XCE_SOAK_SECONDS`` (default 600), ``XCE_SOAK_CLIENTS`` (50),
``XCE_SOAK_KILL_EVERY`` ("30,60": seconds between kills, drawn uniformly),
``XCE_SOAK_SEED`` (random by default; printed, to repeat a run's choices).
docs/performance.md, "Soak", reports a run.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import threading
import time
from collections import Counter
from collections.abc import Iterator
from http.client import HTTPException
from pathlib import Path
from typing import Any

import httpx
import pytest

from xce_resize_plugin.errors import Unreachable
from xce_resize_plugin.journal import Journal
from xce_resize_plugin.rest.client import Client, RemoteError
from xce_resize_plugin.testing.live import (
    ALICE,
    ROOT,
    SLEEPER,
    LiveCluster,
    alive,
    kill_marked,
    processes_marked,
    wait_until,
)

SECONDS = float(os.environ.get("XCE_SOAK_SECONDS", "600"))
CLIENTS = int(os.environ.get("XCE_SOAK_CLIENTS", "50"))
KILL_EVERY = tuple(float(x) for x in os.environ.get("XCE_SOAK_KILL_EVERY", "30,60").split(","))
SEED = int(os.environ.get("XCE_SOAK_SEED", str(random.SystemRandom().randrange(1 << 30))))
HOSTS = {f"s{i}": 16 for i in range(4)}
#: Jobs a client keeps at once (of 1..3 tasks: the 64 slots are mostly taken).
JOBS_PER_CLIENT = 1
#: The journal fact each acknowledged resize request writes (a cancel: reason "cancel").
FACT = {"grow": "GrowRequested", "cancel": "GrowCancelled", "release": "ReleaseAccepted"}
#: How often each client does what (status most, kill least).
ACTIONS = ["status"] * 6 + ["grow"] * 4 + ["cancel"] * 3 + ["release"] * 3 + ["submit"] * 2
ACTIONS += ["kill"]
FINISHED = ("DONE", "EXIT")


@pytest.fixture
def live(tmp_path: Path) -> Iterator[LiveCluster]:
    cluster = LiveCluster(tmp_path, HOSTS, {"stop_grace": 0.5, "notify_timeout": 5.0})
    try:
        yield cluster
    finally:
        cluster.cleanup()
        kill_marked(str(tmp_path))


class Soak:
    """The clients, the killer and the books."""

    def __init__(self, live: LiveCluster) -> None:
        self.live = live
        self.rng = random.Random(SEED)
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.gate = threading.Event()  # set: clients may send requests
        self.gate.set()
        self.inflight = 0
        self.acked: Counter[tuple[str, str]] = Counter()
        self.unknown: Counter[tuple[str, str]] = Counter()
        self.outcomes: Counter[str] = Counter()
        self.submitted: set[str] = set()
        self.unknown_submits = 0
        self.restarts: Counter[str] = Counter()
        self.problems: list[str] = []
        self.pids: dict[int, str] = {}  # every process seen: pid -> what it was
        self.checks = 0
        self.lost = self.duplicated = 0  # as of the last check
        self.unsettled = ""  # why the last look found the cluster not settled
        self.done: set[str] = set()  # finished jobs already checked
        self.log_lines: dict[Path, int] = {}  # log file -> lines judged

    # -- the clients -------------------------------------------------------------------

    def client(self, n: int) -> None:
        rng = random.Random(SEED + n)
        api = Client(self.live.url(), ALICE, timeout=30)
        mine: list[str] = []
        while not self.stop.is_set():
            self.gate.wait()
            action = rng.choice(ACTIONS)
            if action == "submit" and len(mine) >= JOBS_PER_CLIENT:
                action = "status"
            if action != "submit" and not mine:
                action = "submit"
            job = rng.choice(mine) if mine else ""
            with self.lock:
                self.inflight += 1
            try:
                self._one(api, action, job, mine)
            finally:
                with self.lock:
                    self.inflight -= 1
            time.sleep(rng.uniform(0.02, 0.2))

    def _one(self, api: Client, action: str, job: str, mine: list[str]) -> None:
        base = f"/v1/jobs/{job}"
        try:
            if action == "submit":
                body = {"command": SLEEPER, "min_tasks": 1, "max_tasks": 3, "resizable": True}
                new = str(api.call("POST", "/v1/jobs", body)["id"])
                with self.lock:
                    self.submitted.add(new)
                mine.append(new)
            elif action == "status":
                if api.call("GET", base)["state"] in FINISHED:
                    mine.remove(job)
            elif action == "kill":
                api.call("DELETE", base)
                mine.remove(job)
            elif action == "grow":
                api.call("POST", f"{base}/resize/grow", {"tasks": 1, "no_notify": True})
            elif action == "release":
                api.call("POST", f"{base}/resize/release", {"count": 1, "no_notify": True})
            else:
                api.call("DELETE", f"{base}/resize/pending")
        except (Unreachable, RemoteError, HTTPException, OSError) as exc:
            # HTTPException: the controller died in the middle of the answer.
            if isinstance(exc, RemoteError) and exc.http_status < 500:
                self._count(f"refused {exc.code}")
                return
            # The controller died or refused with 503 meanwhile: done or not, unknown.
            with self.lock:
                if action == "submit":
                    self.unknown_submits += 1
                elif action in FACT:
                    self.unknown[(job, FACT[action])] += 1
            self._count(f"{action} unanswered")
            return
        if action in FACT:
            with self.lock:
                self.acked[(job, FACT[action])] += 1
        self._count(f"{action} ok")

    def _count(self, what: str) -> None:
        with self.lock:
            self.outcomes[what] += 1

    # -- the killer ----------------------------------------------------------------------

    def killer(self, until: float) -> None:
        while not self.stop.wait(min(self.rng.uniform(*KILL_EVERY), max(0.0, until - now()))):
            if now() >= until:
                return
            self.kill_one()
            self.gate.clear()
            wait_until(lambda: self.inflight == 0, 120, "the clients' requests answered")
            self.recover()
            self.check()
            self.gate.set()

    def kill_one(self) -> None:
        agents = {h: w["worker"]["pid"] for h, w in self.live.cluster()["hosts"].items()}
        if self.rng.random() < 0.5:
            proc = self.live.procs[-1]
            self.pids[proc.pid] = "controller"
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(10)
            self.restarts["controller"] += 1
        else:
            host = self.rng.choice(sorted(agents))
            pid = int(agents[host])
            self.pids[pid] = f"agent {host}"
            os.kill(pid, signal.SIGKILL)
            self.restarts["agent"] += 1

    def recover(self) -> None:
        """Start the controller again if it is dead; wait for every agent."""
        if self.live.procs[-1].poll() is not None:
            self.live.start()
        wait_until(
            lambda: all(h["worker"]["ready"] for h in self.live.cluster()["hosts"].values()),
            60,
            "every agent ready",
        )

    # -- the checks ------------------------------------------------------------------------

    def check(self) -> None:
        """Settle, then the invariants and the books (module docstring)."""
        self.checks += 1
        try:
            jobs = wait_until(self._settled, 120, "the cluster settled")
        except AssertionError as exc:
            self.problems.append(f"check {self.checks}: {exc} ({self.unsettled})")
            return
        procs = self._task_processes()
        for job in jobs:
            if job["id"] not in self.done:
                self._check_job(job, procs.get(job["id"], {}))
                if job["state"] in FINISHED:
                    self.done.add(job["id"])  # checked once over
        cluster = self.live.cluster()
        if cluster["problems"]:
            self.problems.append(f"check {self.checks}: invariants: {cluster['problems']}")
        for host, info in cluster["hosts"].items():
            self.pids[int(info["worker"]["pid"])] = f"agent {host}"
        self._check_books({j["id"] for j in jobs})
        self._check_logs()

    def _settled(self) -> list[dict[str, Any]] | None:
        try:
            jobs: list[dict[str, Any]] = self.live.ok("GET", "/v1/jobs", ROOT)["jobs"]
        except httpx.TimeoutException:
            # Thousands of jobs on a saturated machine: one slow answer is not a
            # problem, a controller that never answers is (the settle times out).
            self.unsettled = "GET /v1/jobs did not answer within 10 s"
            return None
        for job in jobs:
            phase = (job["resize"] or {"phase": "IDLE"})["phase"]
            busy = [t for t in job["tasks"] if t["state"] in ("STARTING", "STOPPING")]
            if busy or job["ending"] or phase not in ("IDLE", "GROW_PENDING", "ENDED"):
                self.unsettled = f"job {job['id']}: {phase}, ending {job['ending']}, {busy}"
                return None
        return jobs

    def _task_processes(self) -> dict[str, dict[int, list[int]]]:
        """Job id -> task id -> pids of its task processes (leaders), one /proc scan
        (:meth:`LiveCluster.task_processes` for every job at once)."""
        out: dict[str, dict[int, list[int]]] = {}
        for pid, info in processes_marked(str(self.live.state)).items():
            env = info["env"]
            if "XCE_JOB_ID" in env and "XCE_TASK_ID" in env and info["pgid"] == pid:
                tasks = out.setdefault(env["XCE_JOB_ID"], {})
                tasks.setdefault(int(env["XCE_TASK_ID"]), []).append(pid)
        return out

    def _check_job(self, job: dict[str, Any], procs: dict[int, list[int]]) -> None:
        live, jid = self.live, job["id"]
        for pids in procs.values():
            for pid in pids:
                self.pids[pid] = f"task of job {jid}"
        running = {t["id"] for t in job["tasks"] if t["state"] == "RUNNING"}
        where = f"check {self.checks}: job {jid}"
        if {t: len(p) for t, p in procs.items()} != dict.fromkeys(running, 1):
            tasks = [(t["id"], t["state"], t["reason"]) for t in job["tasks"]]
            self.problems.append(f"{where} ({job['state']}): processes {procs}, tasks {tasks}")
        for t in job["tasks"]:
            if live.starts(jid, t["id"]) > 1:
                self.problems.append(f"{where}: task {t['id']} started twice")
        if job["state"] != "RUN":
            return
        held = {t["id"] for t in job["held"]}
        alloc = {t["id"] for t in job["allocation"]}
        # Lost with their host (a killed agent is a host failure): unheld at once; a job
        # the failure ends keeps them in its allocation, charged, until its other tasks
        # are stopped.
        failed = {t["id"] for t in job["tasks"] if t["reason"] == "host failure"}
        lost = failed | {t["id"] for t in job["tasks"] if "lost" in (t["reason"] or "")}
        charged = job["accounting"]["charged_slots"]
        if held != alloc - failed or (job["ending"] is None and charged != len(held)):
            self.problems.append(f"{where}: held {held}, allocation {alloc}, {job['accounting']}")
        if alloc - running - lost:
            self.problems.append(f"{where}: tasks {alloc - running - lost} neither run nor lost")

    def _check_logs(self) -> None:
        """An error the controller or an agent logged is a problem: a failed cycle of
        the controller's loop is logged and survived, and may leave nothing else to
        see (each log line is judged once)."""
        logs = [*self.live.tmp.glob("controller-*.log")]
        logs += self.live.state.glob("workers/*/worker.log")
        for path in sorted(logs):
            lines = path.read_text(errors="replace").splitlines()
            seen, self.log_lines[path] = self.log_lines.get(path, 0), len(lines)
            for line in lines[seen:]:
                if " ERROR " in line or " CRITICAL " in line:
                    self.problems.append(f"check {self.checks}: {path.name}: {line}")

    def _check_books(self, known: set[str]) -> None:
        with Journal.open(self.live.state / "resize", readonly=True) as journal:
            facts: Counter[tuple[str, str]] = Counter()
            for _, job, raw in journal.facts():
                fact = json.loads(raw)
                if fact["type"] != "GrowCancelled" or fact.get("reason") == "cancel":
                    facts[(job, fact["type"])] += 1
        with self.lock:
            acked, unknown = Counter(self.acked), Counter(self.unknown)
            submitted, unknown_submits = set(self.submitted), self.unknown_submits
        lost = {k: n - facts[k] for k, n in acked.items() if facts[k] < n}
        extra = {
            k: n - acked[k] - unknown[k]
            for k, n in facts.items()
            if k[1] in FACT.values() and n > acked[k] + unknown[k]
        }
        self.lost, self.duplicated = sum(lost.values()), sum(extra.values())
        if lost or extra:
            self.problems.append(f"check {self.checks}: lost {lost}, duplicated {extra}")
        if submitted - known:
            self.problems.append(f"check {self.checks}: jobs lost {sorted(submitted - known)}")
        if len(known - submitted) > unknown_submits:
            self.problems.append(f"check {self.checks}: unasked jobs {sorted(known - submitted)}")

    # -- the end ---------------------------------------------------------------------------

    def finish(self) -> list[int]:
        """Kill every job, wait for their ends; the recorded task pids still alive."""
        jobs = self.live.ok("GET", "/v1/jobs", ROOT)["jobs"]
        for job in jobs:
            if job["state"] not in FINISHED:
                self.live.call("DELETE", f"/v1/jobs/{job['id']}", ROOT)
        for jid, tasks in self._task_processes().items():
            for pids in tasks.values():
                for pid in pids:
                    self.pids[pid] = f"task of job {jid}"
        wait_until(
            lambda: all(
                j["state"] in FINISHED for j in self.live.ok("GET", "/v1/jobs", ROOT)["jobs"]
            ),
            60,
            "every job ended",
        )
        tasks = [p for p, what in self.pids.items() if what.startswith("task")]
        with contextlib.suppress(AssertionError):  # those left are the orphans
            wait_until(lambda: not [p for p in tasks if alive(p)], 30, "no task process left")
        ours = processes_marked(str(self.live.state))  # not a pid reused meanwhile
        return [p for p in tasks if alive(p) and p in ours]

    def summary(self, elapsed: float, orphans: list[int]) -> str:
        total = sum(self.outcomes.values())
        refused = sum(n for k, n in self.outcomes.items() if k.startswith("refused"))
        unanswered = sum(self.unknown.values()) + self.unknown_submits
        changes = sum(self.acked.values())
        return (
            f"\nsoak: {elapsed:.0f} s, {CLIENTS} clients, seed {SEED}: {total} requests, "
            f"{total - refused - unanswered} acknowledged ({changes} resize changes, "
            f"{len(self.submitted)} submissions), {refused} refused with an LSF code, "
            f"{unanswered} unanswered (the controller was killed meanwhile); lost "
            f"{self.lost}, duplicated {self.duplicated}; restarts: controller "
            f"{self.restarts['controller']}, agent {self.restarts['agent']}; {self.checks} "
            f"checks; orphan processes {len(orphans)} (of {len(self.pids)} pids recorded); "
            f"problems {len(self.problems)}\noutcomes: {dict(sorted(self.outcomes.items()))}"
        )


def now() -> float:
    return time.monotonic()


def test_soak(live: LiveCluster) -> None:
    soak = Soak(live)
    live.start()
    started = now()
    clients = [threading.Thread(target=soak.client, args=(n,)) for n in range(CLIENTS)]
    for t in clients:
        t.start()
    try:
        soak.killer(started + SECONDS)
    finally:
        soak.stop.set()
        soak.gate.set()
        for t in clients:
            t.join(60)
    elapsed = now() - started
    soak.recover()
    soak.check()  # the last books, after the last kill's aftermath
    orphans = soak.finish()
    print(soak.summary(elapsed, orphans))
    # Everything this test saw, by pid (agents outlive controllers), if it is still ours
    # (its command line or environment names this test's directory: not a reused pid).
    ours = processes_marked(str(live.tmp))
    for pid in soak.pids:
        if pid in ours:
            os.kill(pid, signal.SIGKILL)
    assert soak.problems == [], soak.problems[:20]
    assert orphans == [], {p: soak.pids[p] for p in orphans}
    assert sum(soak.acked.values()) > 0 and soak.restarts
