"""A live cluster for tests: the live controller and its agents as real processes.

:class:`LiveCluster` writes a configuration into a test's temporary directory, runs
``python -m xce_resize_plugin controller`` as a subprocess (which starts one worker
agent per host), and talks to it over HTTP. :meth:`LiveCluster.cleanup` kills every
process the test caused to exist, even when the test failed: the controller, the agents
(own sessions), the tasks and notification commands (own sessions too). They are found
by pid through ``/proc``: each carries the test's temporary directory in its command
line (controller, agents) or its environment (tasks, notifications: ``XCE_HOSTFILE``).

The ``resize_live_factory`` fixture (:mod:`xce_resize_plugin.testing`) makes them and
cleans them up. Needs Linux (``/proc``) and the ``live`` extra (httpx, uvicorn, starlette).
"""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import httpx

__all__ = [
    "ALICE",
    "BOB",
    "ROOT",
    "SLEEPER",
    "LiveCluster",
    "alive",
    "cgroup_trees",
    "controller_command",
    "free_port",
    "kill_marked",
    "processes_marked",
    "remove_cgroups",
    "started_states",
    "wait_until",
]

#: The users' tokens in a :class:`LiveCluster`'s configuration (root is an admin).
ALICE, BOB, ROOT = "alice-token-0001", "bob-token-00002", "root-token-0003"
#: A task that says when it started, then sleeps (one process: sh execs sleep).
SLEEPER = ["/bin/sh", "-c", 'echo "start $XCE_TASK_ID $(date +%s.%N)"; exec sleep 600']


#: The state directories of the clusters made in this process: their agents' cgroups
#: must all be gone at the end (:func:`cgroup_trees`).
_STATES: set[Path] = set()

#: Ports handed out in this process (two clusters of one test never share one).
_GIVEN: set[int] = set()
#: Its own generator: tests that seed the module ``random`` (hypothesis does) must not
#: make two test processes draw the same ports.
_DRAW = random.Random()


def _ephemeral_low() -> int:
    """The first port of the kernel's range for outgoing connections."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range", encoding="ascii") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A TCP port on the loopback interface that nothing listens on (now), drawn below
    the kernel's range for outgoing connections: a port from that range (what binding
    port 0 gives) can be taken by any connection a busy machine opens before the
    controller binds it, and a test run then failed with "Address already in use"."""
    low = _ephemeral_low()
    first = max(1024, low - 12000)
    for _ in range(200 if first < low else 0):  # none below a range that starts at 1024
        port = _DRAW.randrange(first, low)
        if port in _GIVEN:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _GIVEN.add(port)
        return port
    with socket.socket() as s:  # no free port below the range: any
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until(fn: Callable[[], Any], timeout: float = 10.0, what: str = "condition") -> Any:
    """Poll ``fn`` until it returns something truthy; fail with ``what`` on timeout."""
    deadline = time.monotonic() + timeout
    while True:
        value = fn()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except OSError:
        return b""


def processes_marked(marker: str) -> dict[int, dict[str, Any]]:
    """Live (non-zombie) processes whose command line or environment mention ``marker``."""
    out: dict[int, dict[str, Any]] = {}
    me = os.getpid()
    raw_marker = marker.encode()
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        pid = int(name)
        stat = _read(f"/proc/{pid}/stat")
        if not stat:
            continue
        fields = stat[stat.rfind(b")") + 2 :].split()
        if fields[0] in (b"Z", b"X"):
            continue
        cmdline = _read(f"/proc/{pid}/cmdline")
        environ = _read(f"/proc/{pid}/environ")
        if raw_marker in cmdline or raw_marker in environ:
            env = dict(item.split(b"=", 1) for item in environ.split(b"\0") if b"=" in item)
            out[pid] = {
                "pgid": int(fields[2]),
                "cmdline": cmdline.replace(b"\0", b" ").decode(errors="replace"),
                "env": {
                    k.decode(errors="replace"): v.decode(errors="replace") for k, v in env.items()
                },
            }
    return out


def kill_marked(marker: str) -> None:
    """SIGKILL every process group with a process that mentions ``marker``."""
    mine = os.getpgid(0)
    for _ in range(3):
        procs = processes_marked(marker)
        if not procs:
            return
        for pid, info in procs.items():
            pgid = info["pgid"]
            try:
                if pgid not in (mine, 0, 1):
                    os.killpg(pgid, signal.SIGKILL)
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.1)


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not)."""
    stat = _read(f"/proc/{pid}/stat")
    if not stat:
        return False
    return stat[stat.rfind(b")") + 2 :].split()[0] not in (b"Z", b"X")


def started_states() -> list[Path]:
    """The state directories of the clusters this process made (and registered)."""
    return sorted(_STATES)


def cgroup_trees(state: Path) -> list[Path]:
    """Where the agents of ``state`` make their cgroups, if they can: the
    ``xce-<hash>`` directories under this process's cgroup, in the v2 hierarchy and in
    a v1 pids one (docs/live-controller.md, "Process containment"). The agents run in
    the cgroup of the process that started their controller."""
    from xce_resize_plugin.controllers.live import cgroups

    try:
        mountinfo = Path("/proc/self/mountinfo").read_text()
        own = Path("/proc/self/cgroup").read_text()
    except OSError:
        return []
    top, _ = cgroups.subtree_name(state.resolve(), "h")
    return [p / top for p in cgroups.find_hierarchies(mountinfo, own) if p is not None]


def remove_cgroups(state: Path) -> list[Path]:
    """Kill what the cgroups of ``state``'s agents hold and remove them (a test's
    clean-up: agents killed with SIGKILL leave theirs); those that could not go."""
    from xce_resize_plugin.controllers.live import cgroups

    left: list[Path] = []
    for tree in cgroup_trees(state):
        left += cgroups.remove_tree(tree)
    return left


def controller_command(config: Path, listen_port: int | None = None) -> list[str]:
    """The command line that runs a live controller on ``config`` (what a site runs)."""
    args = [sys.executable, "-m", "xce_resize_plugin", "controller", "--config", str(config)]
    if listen_port is not None:
        args += ["--listen", f"127.0.0.1:{listen_port}"]
    return args


class LiveCluster:
    """One live controller (and its agents) in a temporary directory.

    :param tmp: the directory for its configuration, state and logs; every process
        whose command line or environment mentions it is killed by :meth:`cleanup`.
    :param hosts: host name -> slots.
    :param resize: the ``[resize]`` section.
    :param limits: extra TOML appended to the configuration (e.g. a ``[limits]`` table).
    :param single_user: ``[controller] single_user``: by default a personal controller
        (every job runs as the user who runs the tests, whatever its owner's name).
    :param tokens: more users and their tokens.
    :param controller: extra lines of its ``[controller]`` table (e.g. a
        ``metrics_token``).

    Nothing runs until :meth:`start` (whose ``args`` are added to the command line,
    e.g. ``["--log-format", "json"]``). Users ``alice`` and ``bob`` and the admin
    ``root`` have the tokens :data:`ALICE`, :data:`BOB` and :data:`ROOT`.
    """

    def __init__(
        self,
        tmp: Path,
        hosts: dict[str, int],
        resize: dict[str, Any],
        limits: str = "",
        controller: str = "",
        *,
        single_user: bool = True,
        tokens: dict[str, str] | None = None,
    ) -> None:
        self.tmp = tmp
        self.state = tmp / "state"
        self.port = free_port()
        self.config = tmp / "controller.toml"
        hosts_toml = ", ".join(f"{h} = {n}" for h, n in hosts.items())
        resize_toml = "\n".join(f"{k} = {v!r}" for k, v in resize.items())
        users = {"alice": ALICE, "bob": BOB, "root": ROOT, **(tokens or {})}
        tokens_toml = ", ".join(f'"{u}" = "{t}"' for u, t in users.items())
        self.config.write_text(
            f"""
[controller]
listen = "127.0.0.1:{self.port}"
state_dir = "state"
kill_grace = 0.5
worker_timeout = 10
single_user = {str(single_user).lower()}
{controller}

[cluster]
hosts = {{ {hosts_toml} }}

[users]
admins = ["root"]
tokens = {{ {tokens_toml} }}

{limits}

[resize]
{resize_toml}
"""
        )
        self.procs: list[subprocess.Popen[bytes]] = []
        self.runs = 0
        _STATES.add(self.state)

    # -- the controller process -------------------------------------------------------

    def start(
        self,
        env: dict[str, str] | None = None,
        listen_port: int | None = None,
        user: int | None = None,
        args: Sequence[str] = (),
        preexec_fn: Callable[[], None] | None = None,
    ) -> subprocess.Popen[bytes]:
        """Start the controller (as user id ``user``, when given: the test runs as root)
        and wait until it serves. ``preexec_fn`` runs in the child before the
        controller does (e.g. to lower its resource limits)."""
        self.runs += 1
        log = open(self.tmp / f"controller-{self.runs}.log", "wb")  # noqa: SIM115
        proc = subprocess.Popen(
            [*controller_command(self.config, listen_port), *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env={**os.environ, **(env or {})},
            user=user,
            preexec_fn=preexec_fn,
        )
        log.close()
        self.procs.append(proc)
        port = listen_port or self.port
        wait_until(lambda: self._healthy(port, proc), 20, f"controller on port {port}")
        return proc

    def _healthy(self, port: int, proc: subprocess.Popen[bytes]) -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"controller exited with {proc.returncode}:\n{self.logs()}")
        try:
            return httpx.get(f"http://127.0.0.1:{port}/v1/health", timeout=1).status_code == 200
        except httpx.TransportError:
            return False

    def crash(self) -> None:
        """SIGKILL the controller (its agents and tasks live on, in their own sessions)."""
        proc = self.procs[-1]
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait(5)

    def logs(self) -> str:
        return "\n".join(
            f"--- {p.name}\n{p.read_text(errors='replace')}"
            for p in sorted(self.tmp.glob("controller-*.log"))
        )

    def cleanup(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait(5)
        kill_marked(str(self.tmp))
        remove_cgroups(self.state)

    # -- HTTP ---------------------------------------------------------------------------

    def url(self, path: str = "", port: int | None = None) -> str:
        return f"http://127.0.0.1:{port or self.port}{path}"

    def call(
        self, method: str, path: str, token: str = ALICE, body: Any = None, port: int | None = None
    ) -> Any:
        return httpx.request(
            method,
            self.url(path, port),
            json=body,
            headers={"Authorization": f"Bearer {token}"},
            timeout=10,
        )

    def ok(self, method: str, path: str, token: str = ALICE, body: Any = None) -> Any:
        response = self.call(method, path, token, body)
        assert response.status_code < 300, (response.status_code, response.text)
        return response.json()

    def submit(self, token: str = ALICE, **body: Any) -> str:
        body.setdefault("command", SLEEPER)
        return str(self.ok("POST", "/v1/jobs", token, body)["id"])

    def job(self, job_id: str, token: str = ROOT) -> dict[str, Any]:
        return dict(self.ok("GET", f"/v1/jobs/{job_id}", token))

    def cluster(self) -> dict[str, Any]:
        return dict(self.ok("GET", "/v1/cluster", ROOT))

    def grow(self, job_id: str, tasks: int, token: str = ALICE, **options: Any) -> Any:
        return self.call(
            "POST", f"/v1/jobs/{job_id}/resize/grow", token, {"tasks": tasks, **options}
        )

    def release(self, job_id: str, token: str = ALICE, **body: Any) -> Any:
        return self.call("POST", f"/v1/jobs/{job_id}/resize/release", token, body)

    def phase(self, job_id: str) -> str:
        resize = self.job(job_id)["resize"]
        return str(resize["phase"]) if resize else "IDLE"

    def running(self, job_id: str, count: int) -> dict[str, Any]:
        """Wait until the job runs ``count`` tasks with processes; return the job."""

        def check() -> dict[str, Any] | None:
            job = self.job(job_id)
            live = [t for t in job["tasks"] if t["state"] == "RUNNING" and t["pid"]]
            return job if job["state"] == "RUN" and len(live) == count else None

        return dict(wait_until(check, 15, f"job {job_id} running {count} tasks"))

    def idle(self, job_id: str, version: int, timeout: float = 15) -> dict[str, Any]:
        """Wait until the job's resize is idle at ``version``."""

        def check() -> dict[str, Any] | None:
            job = self.job(job_id)
            resize = job["resize"] or {"phase": "IDLE", "version": 0}
            ok = resize["phase"] == "IDLE" and job["version"] == version
            return job if ok else None

        return dict(wait_until(check, timeout, f"job {job_id} idle at version {version}"))

    # -- what runs ----------------------------------------------------------------------

    def task_processes(self, job_id: str) -> dict[int, list[int]]:
        """Task id -> pids of the job's task processes running now (task leaders only)."""
        out: dict[int, list[int]] = {}
        for pid, info in processes_marked(str(self.state)).items():
            env = info["env"]
            if env.get("XCE_JOB_ID") == job_id and "XCE_TASK_ID" in env and info["pgid"] == pid:
                out.setdefault(int(env["XCE_TASK_ID"]), []).append(pid)
        return out

    def starts(self, job_id: str, task_id: int) -> int:
        """How many times the task's process started (its stdout log says)."""
        path = self.state / "jobs" / job_id / f"task-{task_id}.out"
        text = path.read_text() if path.exists() else ""
        return sum(1 for line in text.splitlines() if line.startswith("start "))

    def check_consistent(self, job_id: str) -> dict[str, Any]:
        """The invariants the failover tests assert after every restart."""
        job = self.job(job_id)
        cluster = self.cluster()
        assert cluster["problems"] == [], cluster["problems"]
        procs = self.task_processes(job_id)
        running = {t["id"] for t in job["tasks"] if t["state"] == "RUNNING"}
        # No task runs twice, none is lost: exactly the running tasks have one process
        # each, and every task id the job ever used started at most once.
        assert {tid: len(p) for tid, p in procs.items()} == dict.fromkeys(running, 1), (
            procs,
            job["tasks"],
        )
        for t in job["tasks"]:
            assert self.starts(job_id, t["id"]) <= 1, (t, self.starts(job_id, t["id"]))
        # Limits and accounting equal the allocation.
        held = len(job["held"])
        if job["state"] == "RUN":
            assert {t["id"] for t in job["allocation"]} <= {t["id"] for t in job["held"]}
            assert job["accounting"]["charged_slots"] == held, job["accounting"]
        used = sum(h["used"] for h in cluster["hosts"].values())
        in_use = sum(u["slots_in_use"] for u in cluster["users"].values())
        assert used == in_use
        for user, info in cluster["users"].items():
            assert info["limit"] is None or info["slots_in_use"] <= info["limit"], (user, info)
        return job
