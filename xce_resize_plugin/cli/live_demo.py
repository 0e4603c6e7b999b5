"""``xce-resize demo --live``: a real controller, real processes, a job that is resized.

In a temporary directory: start the live controller (which starts one worker agent per
host), submit an elastic job whose head task logs the hostfile it sees, grow it with the
real ``bresize`` command, shrink it, show the job's own log and its history, then shut
everything down and check that no process is left behind.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from xce_resize_plugin.controllers.live.proc import pid_alive
from xce_resize_plugin.controllers.live.tasks import registered_workers
from xce_resize_plugin.rest.client import Client

TOKEN = "demo-alice-token"
#: Task 0 prints the hostfile whenever it changes; the other tasks just wait.
SCRIPT = r"""
if [ "$XCE_TASK_ID" != 0 ]; then exec sleep 600; fi
last=""
while true; do
  now=$(tr '\n' ' ' < "$XCE_HOSTFILE")
  if [ "$now" != "$last" ]; then echo "task 0 sees hostfile: $now"; last="$now"; fi
  sleep 0.2
done
"""
NOTIFY = 'echo "notified: $LSB_RESIZE_EVENT of $LSB_RESIZE_HOSTS; now $LSB_MCPU_HOSTS"'


def _wait(fn: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = fn()
        if value:
            return value
        time.sleep(0.05)
    raise RuntimeError(f"timed out waiting for {what}")


class _Demo:
    def __init__(self, tmp: Path, out: TextIO) -> None:
        self.tmp = tmp
        self.out = out
        self.state = tmp / "state"
        # The controller's port is the one it binds (listen on port 0): a port found free
        # beforehand could be taken by then on a busy machine. Known once it serves.
        self.url = ""
        self.env: dict[str, str] = {}
        self.client = Client("http://127.0.0.1:1", TOKEN)
        self.controller: subprocess.Popen[bytes] | None = None
        self.t0 = time.monotonic()

    def say(self, text: str) -> None:
        self.out.write(f"[{time.monotonic() - self.t0:6.2f}s] {text}\n")
        self.out.flush()

    def command(self, *argv: str) -> None:
        """Run a real command (bresize, xce-resize) as the user would, and show it."""
        self.say("alice$ " + " ".join(argv))
        exe = (
            [sys.executable, "-m", "xce_resize_plugin"]
            if argv[0] == "xce-resize"
            else [
                sys.executable,
                "-c",
                "import sys; from xce_resize_plugin.cli.bresize import main; sys.exit(main())",
            ]
        )
        proc = subprocess.run(
            [*exe, *argv[1:]], env=self.env, capture_output=True, text=True, timeout=60
        )
        for line in (proc.stdout + proc.stderr).splitlines():
            self.out.write(f"           {line}\n")
        if proc.returncode != 0:
            raise RuntimeError(f"{argv[0]} exited {proc.returncode}")

    def start(self) -> None:
        config = self.tmp / "controller.toml"
        config.write_text(
            f"""[controller]
listen = "127.0.0.1:0"
state_dir = "state"
kill_grace = 1.0
single_user = true

[cluster]
hosts = {{ hostA = 2, hostB = 2, hostC = 2 }}

[users]
admins = []
tokens = {{ alice = "{TOKEN}" }}

[resize]
notify_timeout = 10
stop_grace = 2
"""
        )
        ready = self.tmp / "ready.json"
        log = (self.tmp / "controller.log").open("wb")
        self.controller = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "xce_resize_plugin",
                "controller",
                "--config",
                str(config),
                "--ready-file",
                str(ready),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        log.close()
        ctl = self.controller
        _wait(lambda: ready.exists() or ctl.poll() is not None, 30, "controller")
        if ctl.poll() is not None:
            raise RuntimeError((self.tmp / "controller.log").read_text())
        self.url = str(json.loads(ready.read_text())["url"])
        self.env = {**os.environ, "XCE_CONTROLLER_URL": self.url, "XCE_TOKEN": TOKEN}
        self.env.pop("XCE_JOB_TOKEN", None)
        self.client = Client(self.url, TOKEN)
        agents = registered_workers(self.state)
        self.say(
            f"controller on {self.url}, worker agents for {', '.join(agents)} "
            f"(pids {', '.join(str(a['pid']) for a in agents.values())})"
        )

    def settled(self, job_id: str, version: int) -> dict[str, Any]:
        doc: dict[str, Any] = self.client.call(
            "GET", f"/v1/jobs/{job_id}/resize/wait?version={version}&timeout=20", timeout=30
        )
        if not doc.get("done"):
            raise RuntimeError(f"the resize of job {job_id} did not complete: {doc}")
        hosts = " ".join(f"{h} {n}" for h, n in doc["hosts"].items())
        self.say(f"job {job_id} allocation v{doc['version']}: {hosts}")
        return doc

    def run(self) -> None:
        self.start()
        answer = self.client.call(
            "POST",
            "/v1/jobs",
            {
                "command": ["/bin/sh", "-c", SCRIPT],
                "min_tasks": 1,
                "max_tasks": 6,
                "resizable": True,
                "notify_cmd": NOTIFY,
                "alloc": {"hostA": 2},
                "cwd": str(self.tmp),
            },
        )
        job_id = str(answer["id"])
        self.say(f"Job <{job_id}> is submitted: 2 tasks on hostA, may grow to 6")
        _wait(lambda: self._log(job_id), 15, "the job's first log line")
        self.command("bresize", "request", "2", job_id)
        self.settled(job_id, 0)
        time.sleep(0.6)
        self.command("bresize", "release", "1*hostB", job_id)
        doc = self.settled(job_id, 1)
        time.sleep(0.6)
        self.command("xce-resize", "kill", job_id)
        _wait(
            lambda: self.client.call("GET", f"/v1/jobs/{job_id}")["state"] != "RUN",
            20,
            "the job to end",
        )
        self.out.write("\nWhat the job itself saw (its task 0's log):\n")
        for line in self._log(job_id).splitlines():
            self.out.write(f"    {line}\n")
        job = self.client.call("GET", f"/v1/jobs/{job_id}")
        self.out.write("\nIts notification command's output:\n")
        for note in job.get("notifications", []):
            text = (note.get("stdout") or note.get("output") or "").strip()
            self.out.write(f"    {text}\n")
        self.out.write("\n")
        self.command("xce-resize", "history", job_id)
        assert doc["version"] == 2

    def _log(self, job_id: str) -> str:
        path = self.state / "jobs" / job_id / "task-0.out"
        return path.read_text() if path.exists() else ""

    def shutdown(self) -> list[int]:
        """Stop the controller, then the agents (which stop their tasks); return the
        pids of anything that had to be killed."""
        killed: list[int] = []
        agents = [int(a["pid"]) for a in registered_workers(self.state).values()]
        if self.controller is not None and self.controller.poll() is None:
            self.controller.send_signal(signal.SIGTERM)
            try:
                self.controller.wait(15)
            except subprocess.TimeoutExpired:
                self.controller.kill()
                killed.append(self.controller.pid)
                self.controller.wait(5)
        # An agent that outlives SIGTERM is killed with its process group.
        return killed + _terminate(agents, 10, os.killpg)


def main(out: TextIO) -> int:
    with tempfile.TemporaryDirectory(prefix="xce-resize-live-") as tmp:
        demo = _Demo(Path(tmp), out)
        try:
            demo.run()
        finally:
            # Also when the run stopped short (its reader went away: `demo --live |
            # head`; Ctrl-C): the controller and its agents leave running jobs' tasks
            # alone when they stop, as a failover needs, so what is left of the demo's
            # job is stopped here, by pid.
            killed = demo.shutdown()
            stopped = _terminate(_processes_under(Path(tmp)), 2, os.kill)
        left = _processes_under(Path(tmp))
        out.write(
            "\nShut down: controller and worker agents stopped"
            + (f"; had to SIGKILL {killed}" if killed else " cleanly")
            + (f"; stopped what the run left: {stopped}" if stopped else "")
            + ("; no process left behind.\n" if not left else f"; STILL RUNNING: {left}\n")
        )
        return 0 if not left else 1


def _terminate(pids: list[int], grace: float, kill: Callable[[int, int], None]) -> list[int]:
    """SIGTERM each of ``pids`` still alive, then ``kill(pid, SIGKILL)`` those alive
    ``grace`` seconds later; the pids that had to be killed."""
    for pid in pids:
        if pid_alive(pid):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while any(pid_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    killed = [pid for pid in pids if pid_alive(pid)]
    for pid in killed:
        with contextlib.suppress(OSError):
            kill(pid, signal.SIGKILL)
    return killed


def _processes_under(tmp: Path) -> list[int]:
    """Pids of the demo's processes (Linux /proc): the controller and agents name its
    directory on their command line; its tasks have their hostfile there (in their
    environment); a command run from it has it as working directory."""
    mark = str(tmp).encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cwd = os.readlink(entry / "cwd").encode()
        except OSError:
            cwd = b""
        try:
            mentioned = (
                mark in (entry / "cmdline").read_bytes()
                or cwd.startswith(mark)
                or mark in (entry / "environ").read_bytes()
            )
            if mentioned and pid_alive(int(entry.name)):
                found.append(int(entry.name))
        except OSError:
            continue
    return found


__all__ = ["main"]
