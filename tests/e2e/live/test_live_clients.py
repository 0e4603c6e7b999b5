"""The command lines against a live controller, as a user and a job run them: the real
`xce-resize submit/jobs/history/kill` and `bresize` processes over HTTP, and the elastic
task farm example growing and shrinking itself through the in-job API."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from xce_resize_plugin.testing.live import ALICE, BOB, LiveCluster, processes_marked, wait_until

ROOT_DIR = Path(__file__).resolve().parents[3]


def cli(live: LiveCluster, *args: str, token: str = ALICE, tool: str = "xce-resize") -> Any:
    argv = (
        [sys.executable, "-m", "xce_resize_plugin", *args]
        if tool == "xce-resize"
        else [
            sys.executable,
            "-c",
            "import sys; from xce_resize_plugin.cli.bresize import main; sys.exit(main())",
            *args,
        ]
    )
    env = {**os.environ, "XCE_CONTROLLER_URL": live.url(), "XCE_TOKEN": token}
    env.pop("XCE_JOB_TOKEN", None)
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60)


def test_client_commands_and_bresize_over_http(resize_live_factory: Any, tmp_path: Path) -> None:
    live: LiveCluster = resize_live_factory({"h1": 2, "h2": 2})
    live.start()
    proc = cli(live, "submit", "-n", "1,4", "--resizable", "--", "sleep", "60")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("Job <") and proc.stdout.endswith("> is submitted.\n")
    job_id = proc.stdout.split("<")[1].split(">")[0]
    job = live.running(job_id, 4)  # moldable: as many as fit
    assert sum(job["hosts"].values()) == 4

    # shrink with the real bresize, over HTTP; then grow back
    proc = cli(live, "release", "2*h2", job_id, tool="bresize")
    assert proc.returncode == 0, proc.stderr
    assert "Release request of job <" in proc.stdout
    live.idle(job_id, 1)
    proc = cli(live, "request", "1,2", job_id, tool="bresize")
    assert proc.returncode == 0, proc.stderr
    live.idle(job_id, 2)

    # LSF's codes and exit values come back from the controller
    proc = cli(live, "request", "9", job_id, tool="bresize")
    assert proc.returncode == 255 and "Incorrect number of tasks specified" in proc.stderr
    # another user's job is not found, as one that does not exist (docs/rest-api.md)
    proc = cli(live, "release", "1*h1", job_id, tool="bresize", token=BOB)
    assert proc.returncode == 255 and "No matching job found" in proc.stderr
    proc = cli(live, "release", "h1*2", job_id, tool="bresize")  # refused locally
    assert proc.returncode == 255 and "Incorrect host specified for release" in proc.stderr
    proc = cli(live, "request", "-rnc", "x", "-rncn", "1", job_id, tool="bresize")
    assert proc.returncode == 2 and "mutually exclusive" in proc.stderr

    proc = cli(live, "jobs", "--json")
    jobs = json.loads(proc.stdout)["jobs"]
    assert [j["id"] for j in jobs] == [job_id]
    proc = cli(live, "jobs")
    assert job_id in proc.stdout and "RUN" in proc.stdout
    proc = cli(live, "history", job_id)
    assert proc.returncode == 0 and "JOB_RESIZE" in proc.stdout and "shrink" in proc.stdout
    history = json.loads(cli(live, "history", job_id, "--json").stdout)
    assert [r["type"] for r in history["records"]] == ["shrink", "grow"]

    proc = cli(live, "kill", job_id)
    assert proc.returncode == 0 and f"Job <{job_id}> is being terminated" in proc.stdout
    wait_until(lambda: live.job(job_id)["state"] == "EXIT", 15, "job killed")
    proc = cli(live, "kill", "424242")
    assert proc.returncode == 255 and "No matching job found" in proc.stderr


def test_elastic_task_farm_grows_and_shrinks_itself(
    resize_live_factory: Any, tmp_path: Path
) -> None:
    live: LiveCluster = resize_live_factory({"h1": 2, "h2": 2, "h3": 2})
    live.start()
    work = tmp_path / "farm"
    work.mkdir()
    farm = ROOT_DIR / "docs" / "examples" / "task_farm.py"
    answer = live.ok(
        "POST",
        "/v1/jobs",
        ALICE,
        {
            "command": [
                sys.executable,
                str(farm),
                "--items",
                "30",
                "--work",
                "0.15",
                "--spool",
                str(work / "spool"),
            ],
            "tasks": "1,6",
            "resizable": True,
            "cwd": str(work),
            "alloc": {"h1": 1},
        },
    )
    job_id = answer["id"]
    wait_until(lambda: live.job(job_id)["state"] in ("DONE", "EXIT"), 60, "the farm to finish")
    job = live.job(job_id)
    assert job["state"] == "DONE", live.logs()
    done = sorted(p.name for p in (work / "spool" / "done").iterdir())
    assert done == [f"item-{i:05d}" for i in range(30)]  # every item, exactly once
    records = live.ok("GET", f"/v1/jobs/{job_id}/resize/history", ALICE)["records"]
    kinds = [r["type"] for r in records]
    assert "grow" in kinds and "shrink" in kinds  # it grew with a backlog, shrank when idle


def test_live_demo_runs_and_leaves_nothing_behind() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "xce_resize_plugin", "demo", "--live"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    seen = [line for line in out.splitlines() if "task 0 sees hostfile" in line]
    assert [len(line.split(":")[1].split()) for line in seen] == [2, 4, 3]
    assert "notified: grow of hostB 2" in out and "notified: shrink of hostB 1" in out
    assert "JOB_RESIZE" in out and "no process left behind" in out


def test_live_demo_cut_short_leaves_nothing_behind(tmp_path: Path) -> None:
    """`xce-resize demo --live | head`: the reader goes away while the demo's job runs;
    the controller and its agents leave a running job's tasks alone when they stop (as
    a failover needs), so the demo stops them itself. It left task 0 running before."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "xce_resize_plugin", "demo", "--live"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "TMPDIR": str(tmp_path)},
    )
    assert proc.stdout is not None
    try:
        for line in proc.stdout:  # up to the job's first change: its tasks run then
            if b"alice$ bresize" in line:
                break
        proc.stdout.close()
        assert proc.wait(60) == 141
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
    left = processes_marked(str(tmp_path))
    for pid in left:  # by pid, so that a failure here leaves nothing either
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    assert not left, left


def test_submit_options_env_cwd_alloc_estimate(resize_live_factory: Any, tmp_path: Path) -> None:
    """`xce-resize submit --env --cwd --alloc --estimate` reach the job; bad items are
    usage errors (exit 2) that submit nothing."""
    live: LiveCluster = resize_live_factory({"h1": 2, "h2": 2})
    live.start()
    out = tmp_path / "seen"
    script = f'echo "$GREETING $(pwd) $XCE_TASK_ID" >> {out}; sleep 60'
    args = ["submit", "-n", "1,4", "--resizable", "--estimate", "90"]
    args += ["--env", "GREETING=hello=world", "--cwd", str(tmp_path), "--alloc", "h2=1"]
    proc = cli(live, *args, "--json", "--", "sh", "-c", script)
    assert proc.returncode == 0, proc.stderr
    job_id = json.loads(proc.stdout)["id"]
    job = live.running(job_id, 1)  # started small, on h2, though 4 would fit
    assert job["hosts"] == {"h2": 1}
    wait_until(lambda: out.exists() and out.read_text().strip(), 15, "task output")
    assert out.read_text().split() == ["hello=world", str(tmp_path), "0"]
    for bad, word in [("--alloc", "h2"), ("--alloc", "h2=0"), ("--env", "=x")]:
        proc = cli(live, "submit", bad, word, "--", "true")
        assert proc.returncode == 2, proc.stderr
        assert f"{bad} takes" in proc.stderr and repr(word) in proc.stderr
    assert [j["id"] for j in json.loads(cli(live, "jobs", "--json").stdout)["jobs"]] == [job_id]
