"""Recording a live controller run and replaying it in simulated time (issue #4 §2).

One run with real processes (module fixture): jobs submitted over REST, grows without
and with a notification command, releases, a notification that fails, a rejected
request, kills (of a running and of a pending job), a job ending on its own, a job
still running at the stop; the controller records (``[controller] record``) and is
stopped with SIGTERM. Then ``xce-resize simulate --replay`` must give the same resize
facts, and changed recordings must not. A second run is SIGKILLed: its recording is a
prefix that still replays. The refusals (existing file, state directory with jobs, file
locked) go through the real command line.
"""

from __future__ import annotations

import fcntl
import json
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from xce_resize_plugin.recording.format import read_recording
from xce_resize_plugin.recording.replay import replay
from xce_resize_plugin.testing.live import LiveCluster, kill_marked, wait_until

#: Task 0 runs until $STOP_FILE exists, then exits 0 (the job ends DONE on its own);
#: the other tasks sleep until they are stopped.
ENDS_ON_FILE = [
    "/bin/sh",
    "-c",
    'if [ "$XCE_TASK_ID" = 0 ]; then while [ ! -e "$STOP_FILE" ]; do sleep 0.05; done; '
    "exit 0; fi; exec sleep 600",
]
RESIZE = {"stop_grace": 0.5, "notify_timeout": 5.0}


def recording_cluster(tmp: Path, hosts: dict[str, int], name: str = "run.jsonl") -> LiveCluster:
    """A LiveCluster whose configuration records to ``tmp/name`` (the config key)."""
    live = LiveCluster(tmp, hosts, RESIZE)
    text = live.config.read_text()
    live.config.write_text(text.replace("[controller]\n", f'[controller]\nrecord = "{name}"\n', 1))
    return live


def stop(proc: subprocess.Popen[bytes]) -> int:
    """SIGTERM the controller (a clean stop) and return its exit status."""
    proc.send_signal(signal.SIGTERM)
    return proc.wait(15)


def controller_cli(config: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "xce_resize_plugin", "controller", "--config", str(config), *extra],
        capture_output=True,
        text=True,
        timeout=60,
    )


def simulate_replay(recording: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "xce_resize_plugin", "simulate", "--replay", str(recording)],
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The recorded run: ``{"path", "jobs": {"A".."D": id}, "live": LiveCluster}``."""
    tmp = tmp_path_factory.mktemp("recorded")
    live = recording_cluster(tmp, {"h1": 2, "h2": 2, "h3": 2})
    try:
        proc = live.start()
        # A: one task on h1, grown by 2 without a notification.
        a = live.submit(tasks="1,4", alloc={"h1": 1}, resizable=True)
        live.running(a, 1)
        rejected = live.grow(a, 10)  # 1 + 10 > max 4: refused at once, and recorded
        assert rejected.status_code == 400, rejected.text
        assert live.grow(a, 2).status_code == 202
        assert live.idle(a, 1)["hosts"] == {"h1": 2, "h2": 1}
        # B: one task on h3, grown by 1 with its notification command (which succeeds).
        stop_file = tmp / "stop-b"
        b = live.submit(
            command=ENDS_ON_FILE,
            tasks="1,3",
            alloc={"h3": 1},
            resizable=True,
            notify_cmd="exit 0",
            env={"STOP_FILE": str(stop_file)},
        )
        live.running(b, 1)
        assert live.grow(b, 1).status_code == 202
        assert live.idle(b, 1)["hosts"] == {"h3": 2}
        # A releases its task on h2; B's release fails in its notification command.
        assert live.release(a, task_ids=[2]).status_code == 202
        assert live.idle(a, 2)["hosts"] == {"h1": 2}
        assert live.release(b, task_ids=[1], notify_cmd="exit 1").status_code == 202
        job_b = wait_until(
            lambda: (
                (j := live.job(b))["resize"]["phase"] == "IDLE"
                and len(j["notifications"]) == 2
                and j
            ),
            10,
            "B's failed release",
        )
        assert job_b["version"] == 1 and job_b["notifications"][1]["status"] == 1
        # C waits for 3 slots (2 are free), gets them when A is killed.
        c = live.submit(tasks=3)
        assert live.job(c)["state"] == "PEND"
        # D waits behind C and is killed while pending: it ends at once, never started.
        d = live.submit(tasks=6)
        assert live.call("DELETE", f"/v1/jobs/{d}").status_code == 202
        assert live.job(d)["state"] == "EXIT"
        assert live.call("DELETE", f"/v1/jobs/{a}").status_code == 202
        live.running(c, 3)
        assert live.job(a)["state"] == "EXIT"
        # B's task 0 exits 0: B ends DONE, its other task is stopped first.
        stop_file.touch()
        wait_until(lambda: live.job(b)["state"] == "DONE", 10, "B done")
        assert live.cluster()["problems"] == []
        assert stop(proc) == 0, live.logs()
        yield {"path": tmp / "run.jsonl", "jobs": {"A": a, "B": b, "C": c, "D": d}, "live": live}
    finally:
        live.cleanup()
        kill_marked(str(tmp))


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _write(path: Path, lines: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


# -- the recorded run replays ------------------------------------------------------------


def test_live_recording_holds_the_run(recorded: dict[str, Any]) -> None:
    header, lines = read_recording(recorded["path"])
    jobs = recorded["jobs"]
    assert header["controller"] == "live" and header["hosts"] == [["h1", 2], ["h2", 2], ["h3", 2]]
    assert header["config"]["stop_grace"] == 0.5 and header["protect_reservation"] is True
    kinds = {line["kind"] for line in lines}
    assert {
        "submit",
        "request",
        "task",
        "notify",
        "ending",
        "end",
        "cycle",
        "started",
        "fact",
    } <= kinds
    assert lines[-1]["kind"] == "closed" and lines[-1]["clean"] is True
    requests = [
        (r["job"], r["request"]["type"], r["result"]) for r in lines if r["kind"] == "request"
    ]
    assert requests == [
        (jobs["A"], "grow", "LSBE_RESIZE_BAD_SLOTS_4SLOTS"),
        (jobs["A"], "grow", "ok"),
        (jobs["B"], "grow", "ok"),
        (jobs["A"], "release", "ok"),
        (jobs["B"], "release", "ok"),
    ]
    notes = [(n["job"], n["status"]) for n in lines if n["kind"] == "notify"]
    assert notes == [(jobs["B"], 0), (jobs["B"], 1)]
    ends = {e["job"]: e["state"] for e in lines if e["kind"] == "end"}
    assert ends == {jobs["A"]: "EXIT", jobs["B"]: "DONE", jobs["D"]: "EXIT"}
    facts = [(f["job"], f["fact"]["type"]) for f in lines if f["kind"] == "fact"]
    assert {"GrowPlaced", "ReleaseAccepted", "Committed", "NotifyDone"} <= {t for _, t in facts}
    assert [f["seq"] for f in lines if f["kind"] == "fact"] == list(range(1, len(facts) + 1))


def test_replay_of_the_live_recording_gives_the_same_facts(recorded: dict[str, Any]) -> None:
    path = recorded["path"]
    lines = _lines(path)
    result = replay(path)
    assert result.ok, result.problems
    assert result.controller == "live"
    assert result.facts == sum(1 for line in lines if line["kind"] == "fact")
    assert result.starts == 3
    # The same through the command line.
    proc = simulate_replay(path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "identical" in proc.stdout and "3 job starts" in proc.stdout


# -- changed recordings do not --------------------------------------------------------


def _first(lines: list[dict[str, Any]], **match: Any) -> int:
    for i, line in enumerate(lines):
        if all(_get(line, key) == value for key, value in match.items()):
            return i
    raise AssertionError(f"no line with {match}")


def _get(line: dict[str, Any], dotted: str) -> Any:
    value: Any = line
    for part in dotted.split("__"):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def test_replay_reports_a_removed_request(recorded: dict[str, Any], tmp_path: Path) -> None:
    """Without A's grow request, A never grows: its facts differ from the run's."""
    a = recorded["jobs"]["A"]
    lines = _lines(recorded["path"])
    del lines[_first(lines, kind="request", job=a, request__type="grow", result="ok")]
    result = replay(_write(tmp_path / "no-grow.jsonl", lines))
    assert not result.ok
    # (How many facts live: the grow's, the release's, and the exits of A's tasks when
    # it was killed, which the host may report in one batch or apart.)
    assert any(
        re.match(rf"job {a}: 1[2-4] facts live, 0 in the replay", p) for p in result.problems
    ), result.problems
    # A's release of task 2 now names a task A does not have: answered differently.
    assert any("answered" in p and "recorded ok" in p for p in result.problems), result.problems


def test_replay_reports_a_changed_task_id(recorded: dict[str, Any], tmp_path: Path) -> None:
    """A's release names task 1 instead of 2: the release takes another task."""
    a = recorded["jobs"]["A"]
    lines = _lines(recorded["path"])
    i = _first(lines, kind="request", job=a, request__type="release")
    assert lines[i]["request"]["task_ids"] == [2]
    lines[i]["request"]["task_ids"] = [1]
    result = replay(_write(tmp_path / "other-task.jsonl", lines))
    assert not result.ok
    wrong = [p for p in result.problems if p.startswith(f"job {a} fact")]
    assert wrong and "ReleaseAccepted" in wrong[0] and "2@h2" in wrong[0], result.problems


def test_replay_reports_a_changed_task_event(recorded: dict[str, Any], tmp_path: Path) -> None:
    """The start of B's grown task reported for a task B does not have: the grow of B
    never commits in the replay."""
    b = recorded["jobs"]["B"]
    lines = _lines(recorded["path"])
    i = _first(lines, kind="task", job=b, task=1, event="started")
    lines[i]["task"] = 7
    result = replay(_write(tmp_path / "lost-start.jsonl", lines))
    assert not result.ok
    assert any(p.startswith(f"job {b} fact") for p in result.problems), result.problems


def test_replay_reports_a_changed_notification_outcome(
    recorded: dict[str, Any], tmp_path: Path
) -> None:
    """B's failed release notification recorded as a success: the replay commits it.
    Through the command line: exit 1 and the list of differences."""
    b = recorded["jobs"]["B"]
    lines = _lines(recorded["path"])
    i = _first(lines, kind="notify", job=b, status=1)
    lines[i]["status"] = 0
    proc = simulate_replay(_write(tmp_path / "notify-ok.jsonl", lines))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "DIFFERENT" in proc.stdout
    assert f"job {b} fact" in proc.stdout and "NotifyDone" in proc.stdout, proc.stdout


# -- refusals, through the command line ------------------------------------------------


def test_controller_refuses_to_record_over_a_file_or_a_used_state_dir(
    recorded: dict[str, Any], tmp_path: Path
) -> None:
    live: LiveCluster = recorded["live"]
    before = recorded["path"].read_bytes()
    # The same file: it holds a recording, which is never overwritten or appended to.
    proc = controller_cli(live.config)
    assert proc.returncode == 2, proc.stderr
    assert "already holds a recording" in proc.stderr and str(recorded["path"]) in proc.stderr
    assert recorded["path"].read_bytes() == before
    # A new file (--record overrides the key) on the state directory of the run: refused.
    fresh = tmp_path / "new.jsonl"
    proc = controller_cli(live.config, "--record", str(fresh))
    assert proc.returncode == 2, proc.stderr
    assert "already has 4 job(s)" in proc.stderr, proc.stderr
    # A file another controller writes (it holds the file's lock): refused.
    state = tmp_path / "state2"
    with open(fresh, "a") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)
        proc = controller_cli(live.config, "--state-dir", str(state), "--record", str(fresh))
    assert proc.returncode == 2, proc.stderr
    assert "another controller is writing" in proc.stderr, proc.stderr


def test_bad_record_key_is_refused(tmp_path: Path) -> None:
    live = LiveCluster(tmp_path, {"h1": 1}, RESIZE)
    live.config.write_text(
        live.config.read_text().replace("[controller]\n", "[controller]\nrecord = 3\n")
    )
    proc = controller_cli(live.config)
    assert proc.returncode == 2
    assert "controller.record: must be a file name, got 3" in proc.stderr


# -- a crash leaves a prefix that replays ----------------------------------------------


def test_recording_of_a_crashed_controller_replays_as_a_prefix(tmp_path: Path) -> None:
    live = recording_cluster(tmp_path, {"h1": 2, "h2": 2})
    try:
        live.start()
        job = live.submit(tasks="1,3", alloc={"h1": 1}, resizable=True)
        live.running(job, 1)
        assert live.grow(job, 1).status_code == 202
        live.idle(job, 1)
        # The next grow's notification is still running when the controller dies.
        assert live.grow(job, 1, notify_cmd="sleep 5").status_code == 202
        wait_until(lambda: live.phase(job) == "GROW_NOTIFYING", 10, "notifying")
        live.crash()
        path = tmp_path / "run.jsonl"
        lines = _lines(path)
        assert lines[-1]["kind"] != "closed"
        types = [line["fact"]["type"] for line in lines if line["kind"] == "fact"]
        assert types.count("Committed") == 1 and types[-1] == "NotifyStarted", types
        result = replay(path)
        assert result.ok, result.problems
        assert result.facts >= len(types)
        # A prefix that claims more than the replay produces is still caught.
        lines.append({"kind": "fact", "seq": 99, "job": job, "fact": {"type": "Committed"}})
        changed = replay(_write(tmp_path / "more.jsonl", lines))
        assert not changed.ok and any("not replayed" in p for p in changed.problems)
    finally:
        live.cleanup()
        kill_marked(str(tmp_path))
