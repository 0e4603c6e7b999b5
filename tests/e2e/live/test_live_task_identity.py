"""What a task learns about itself (docs/in-job-api.md, "Task identity"): its index on
its host, the job's bounds, task 0's address, the task file, a scratch directory of
the job's own that goes away with the job; and ``submit --initial``."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

from xce_resize_plugin.testing.live import ALICE, LiveCluster, wait_until

# Writes its environment to $XCE_JOB_DIR (the job's own scratch), then waits.
ENV_DUMPER = [
    "/bin/sh",
    "-c",
    'env | sort > "$XCE_JOB_DIR/env-$XCE_TASK_ID"; touch "$TMPDIR/t-$XCE_TASK_ID"; exec sleep 600',
]


def _env(path: Path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)


def _envs(scratch: Path, ids: list[int]) -> dict[int, dict[str, str]]:
    def ready() -> dict[int, dict[str, str]] | None:
        files = {i: scratch / f"env-{i}" for i in ids}
        if not all(f.exists() and f.stat().st_size for f in files.values()):
            return None
        return {i: _env(f) for i, f in files.items()}

    return dict(wait_until(ready, 15, f"environments of tasks {ids}"))


def test_task_identity_scratch_and_initial(resize_live_factory: Any) -> None:
    live: LiveCluster = resize_live_factory({"h1": 2, "h2": 2})
    live.start()
    body = {"command": ENV_DUMPER, "tasks": "1,4", "resizable": True, "initial": 3}
    job_id = live.submit(**body)
    job = live.running(job_id, 3)  # 4 would fit: --initial caps the start at 3
    assert job["hosts"] == {"h1": 2, "h2": 1}
    scratch = live.state / "jobs" / job_id / "scratch"
    envs = _envs(scratch, [0, 1, 2])
    assert {i: (e["XCE_HOSTNAME"], e["XCE_LOCAL_TASK_ID"]) for i, e in envs.items()} == {
        0: ("h1", "0"),
        1: ("h1", "1"),
        2: ("h2", "0"),
    }
    assert [envs[i]["XCE_TASKS_ON_HOST"] for i in range(3)] == ["2", "2", "1"]
    for e in envs.values():
        assert (e["XCE_MIN_TASKS"], e["XCE_MAX_TASKS"]) == ("1", "4")
        assert e["XCE_HEAD_ADDR"] == "127.0.0.1"
        assert e["XCE_JOB_DIR"] == str(scratch) and e["TMPDIR"] == str(scratch / "tmp")
    mode = scratch.stat()
    assert stat.S_IMODE(mode.st_mode) == 0o700 and mode.st_uid == os.geteuid()
    assert sorted(p.name for p in (scratch / "tmp").iterdir()) == ["t-0", "t-1", "t-2"]
    taskfile = Path(envs[0]["XCE_TASKFILE"])
    assert taskfile.read_text() == "0 h1\n1 h1\n2 h2\n"

    # Release task 1 on h1, then grow by 2: the new task on h1 takes the freed index
    # 1 (unique among the job's tasks there), the one on h2 index 1.
    assert live.release(job_id, task_ids=[1]).status_code == 202
    live.idle(job_id, 1)
    assert live.grow(job_id, 2).status_code == 202
    job = live.idle(job_id, 2)
    assert job["hosts"] == {"h1": 2, "h2": 2}
    new = _envs(scratch, [3, 4])
    assert {e["XCE_HOSTNAME"]: e["XCE_LOCAL_TASK_ID"] for e in new.values()} == {
        "h1": "1",
        "h2": "1",
    }
    assert {e["XCE_TASKS_ON_HOST"] for e in new.values()} == {"2"}
    assert taskfile.read_text() == "0 h1\n2 h2\n3 h1\n4 h2\n" or taskfile.read_text() == (
        "0 h1\n2 h2\n4 h1\n3 h2\n"
    )

    # The job ends: its scratch directory goes with it.
    assert live.call("DELETE", f"/v1/jobs/{job_id}", ALICE).status_code == 202
    wait_until(lambda: not scratch.exists(), 15, "scratch removed at the job's end")
    assert (live.state / "jobs" / job_id / "task-0.out").exists()  # logs stay


def test_initial_outside_the_range_is_refused(resize_live_factory: Any) -> None:
    live: LiveCluster = resize_live_factory({"h1": 2})
    live.start()
    for initial, word in [(5, "outside the job's 1,4"), (0, "initial must be an integer")]:
        r = live.call(
            "POST", "/v1/jobs", ALICE, {"command": ["true"], "tasks": "1,4", "initial": initial}
        )
        assert r.status_code == 400 and word in r.text, r.text
    assert live.ok("GET", "/v1/jobs", ALICE)["jobs"] == []
