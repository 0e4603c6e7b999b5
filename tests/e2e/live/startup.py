"""Helpers for the tests of the live controller's start on a given state directory:
stop a controller cleanly, and start one that must refuse the state."""

from __future__ import annotations

import os
import signal
import subprocess
from typing import Any

from xce_resize_plugin.testing.live import LiveCluster, controller_command

#: The exit status of ``xce-resize controller`` for a state it will not start on.
EXIT_ERROR = 1


def stop_cleanly(live: LiveCluster) -> None:
    """A clean stop (SIGTERM): the controller exits 0; agents and tasks live on."""
    proc = live.procs[-1]
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(20) == 0, live.logs()
    # The last controller's log says that what it started lives on.
    last = (live.tmp / f"controller-{live.runs}.log").read_text(errors="replace")
    assert "stopped; the worker agents and their tasks keep running" in last, last


def resized_job(
    factory: Any, hosts: dict[str, int] | None = None, **options: Any
) -> tuple[LiveCluster, str]:
    """A started controller (``factory(hosts, **options)``) with a running resizable
    job grown once, so that both the controller's store and the plugin's journal hold
    it: the cluster and the job's id."""
    live: LiveCluster = factory(hosts or {"h1": 2, "h2": 2}, **options)
    live.start()
    job_id = live.submit(tasks="1,3", alloc={"h1": 1}, resizable=True)
    live.running(job_id, 1)
    assert live.grow(job_id, 1).status_code == 202
    live.idle(job_id, 1)
    return live, job_id


def refused_start(live: LiveCluster, env: dict[str, str] | None = None) -> str:
    """Start a controller on ``live``'s state, which must refuse it: the one line it
    printed (after its log lines), once it has exited with :data:`EXIT_ERROR`.

    A controller that starts instead is killed at the timeout (its agents by the
    fixture's clean-up), failing the test.
    """
    out = subprocess.run(
        controller_command(live.config),
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
        env={**os.environ, **(env or {})},
    )
    assert out.returncode == EXIT_ERROR, (out.returncode, out.stderr)
    assert "Traceback" not in out.stderr, out.stderr
    lines = [line for line in out.stderr.splitlines() if line.startswith("xce-resize")]
    assert len(lines) == 1, out.stderr
    return lines[0]
