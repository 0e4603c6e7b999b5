"""The command lines as a user runs them: real processes, exit codes, messages."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from xce_resize_plugin import errors

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data"


def run(
    *args: str, cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "xce_resize_plugin", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**os.environ, **(env or {})},
        timeout=120,
    )


def scenario_json(path: Path) -> dict[str, Any]:
    proc = run("scenario", "run", str(path), "--json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)  # type: ignore[no-any-return]


def test_demo_shows_the_whole_story() -> None:
    proc = run("demo")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    for expected in [
        "grow of 2..4 tasks pending",
        "pending grow cancelled",
        "placed, slots reserved: hostB 4",
        "app: grow of hostB 4",
        "User permission denied",
        "shrink committed",
        "Cannot release all tasks from the first execution host",
        "JOB_RESIZE",
        "1700 slot-seconds",
    ]:
        assert expected in out, expected


def test_demo_json() -> None:
    proc = run("demo", "--json")
    doc = json.loads(proc.stdout)
    job = doc["jobs"]["101"]
    assert job["state"] == "DONE" and job["slot_seconds"] == 1700
    assert [r["type"] for r in job["resize_records"]] == ["grow", "shrink", "shrink"]


def test_scenario_json_shape_and_outcomes() -> None:
    doc = scenario_json(DATA / "scenarios" / "grow_limits.toml")
    assert set(doc) >= {"commands", "jobs", "hosts", "users"}
    c1, c2, c3 = doc["commands"]
    assert c1 == {
        "at": 5.0,
        "user": "carol",
        "argv": ["request", "1,8", "221"],
        "exit": 0,
        "code": None,
        "message": "",
    }
    assert c2["exit"] == 0
    # dave's grow failed its notification twice and was given up: nothing to cancel
    assert (c3["exit"], c3["code"]) == (255, "LSBE_RESIZE_NO_ACTIVE_REQUEST")
    job = doc["jobs"]["221"]
    # new-only, ptile 2, carol's limit of 7 slots: 5 more tasks on hosts other than n1
    assert job["hosts"] == {"n1": 2, "n2": 2, "n3": 2, "n4": 1}
    assert job["tasks"]["0"] == "n1" and job["pending_grow"] is None
    assert doc["users"]["carol"]["slots_in_use"] == 0  # the job ended at t=500
    assert doc["hosts"]["n1"] == {"slots": 4, "used": 0, "state": "ok"}
    assert job["slot_seconds"] == 2 * 5 + 7 * 495
    dave = doc["jobs"]["222"]
    assert dave["hosts"] == {"n4": 1} and dave["resize_records"] == []


def test_scenario_until_stops_the_clock(tmp_path: Path) -> None:
    text = (DATA / "scenarios" / "grow_limits.toml").read_text()
    path = tmp_path / "s.toml"
    path.write_text(text.replace("[resize]", "[scenario]\nuntil = 100\n\n[resize]"))
    doc = scenario_json(path)
    assert doc["end_time"] == 100
    assert doc["jobs"]["221"]["state"] == "RUN"
    assert doc["users"]["carol"]["slots_in_use"] == 7


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[cluster]\n", "cluster.hosts: missing"),
        ("[cluster]\nhosts = { a = 0 }\n", "cluster.hosts.a: must be at least 1"),
        ("[cluster]\nhosts = { a = 1048577 }\n", "cluster.hosts.a: at most 1,048,576 slots"),
        (
            "[cluster]\nhosts = { a = 2 }\n[[jobs]]\nuser = 'u'\ntasks = '3,x'\n",
            'jobs[0].tasks: must be N or "MIN,MAX"',
        ),
        (
            "[cluster]\nhosts = { a = 2 }\n[[jobs]]\nuser = 'u'\nalloc = { b = 1 }\n",
            "jobs[0].alloc.b: no such host",
        ),
        (
            "[cluster]\nhosts = { a = 2 }\n[[commands]]\nat = 1\nuser = 'u'\n",
            "commands[0]: give exactly one of bresize, resize, modify, target or host",
        ),
        (
            "[cluster]\nhosts = { a = 2 }\n[[commands]]\nuser = 'u'\nbresize = \"request '1\"\n",
            "commands[0].bresize: cannot be split like a shell",
        ),
        (
            "[cluster]\nhosts = { a = 2 }\n[resize]\nnotify_timout = 3\n",
            "unknown key 'notify_timout'",
        ),
        (
            "[cluster]\nhosts = { a = 2 }\n[resize]\npolicy_files = ['nope.py']\n",
            "nope.py: no such file",
        ),
        ("[clster]\n", "clster: unknown section"),
        ("not toml [", "not valid TOML"),
        (
            "[cluster]\nhosts = { a = 2 }\n[[jobs]]\nuser = 'u'\nsubmit = inf\n",
            "jobs[0].submit: must be a finite number, got inf",
        ),
        (
            "[cluster]\nhosts = { a = 2 }\n[[commands]]\nat = nan\nuser = 'u'\nbresize = 'x'\n",
            "commands[0].at: must be a finite number, got nan",
        ),
        (
            # Beyond the simulated clock's range: the job would end as it starts.
            "[cluster]\nhosts = { a = 2 }\n[[jobs]]\nuser = 'u'\nsubmit = 1e300\n",
            "jobs[0].submit: must be at most 1e+10 s, got 1e+300",
        ),
        (
            "[cluster]\nhosts = { a = 2 }\n[[jobs]]\nuser = 'u'\nruntime = 1.0000001e10\n",
            "jobs[0].runtime: must be at most 1e+10 s",
        ),
        ("[cluster]\nhosts = { a = 2 }\n[scenario]\nuntil = nan\n", "scenario.until: must be"),
        ("[cluster]\nhosts = { a = 2 }\n[resize]\nstop_grace = nan\n", "stop_grace must be"),
        (
            "[cluster]\nhosts = { a = 2 }\n[resize]\njournal_map_size = 18446744073709551616\n",
            "journal_map_size must be between 1048576 and 1099511627776, got 18446744073709551616",
        ),
        (
            "[cluster]\nhosts = { a = 2 }\n[resize]\npolicy_files = [1]\n",
            "policy_files entries must be paths, got 1",
        ),
        ("x = " + "[" * 5000 + "]" * 5000 + "\n", "not valid TOML: nested too deeply"),
    ],
)
def test_bad_scenarios_are_named(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    proc = run("scenario", "run", str(path))
    assert proc.returncode == 2
    assert message in proc.stderr and str(path) in proc.stderr
    assert proc.stdout == ""


def test_a_scenario_that_is_not_text_is_named(tmp_path: Path) -> None:
    path = tmp_path / "bin.toml"
    path.write_bytes(b"\xff\xfe[cluster]\n")
    proc = run("scenario", "run", str(path))
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == f"xce-resize: Configuration error: {path}: not UTF-8 text\n"


def test_scenario_with_a_policy_file(tmp_path: Path) -> None:
    path = tmp_path / "p2.toml"
    path.write_text(
        f"""
[cluster]
hosts = {{ a = 8, b = 8 }}
[resize]
policy_files = ["{ROOT / "hooks" / "power_of_two.py"}"]
[[jobs]]
user = "u"
tasks = "1,16"
resizable = true
alloc = {{ a = 4 }}
runtime = 50
[[commands]]
at = 1
user = "u"
bresize = "request 2 101"
[[commands]]
at = 2
user = "u"
bresize = "request 4 101"
"""
    )
    doc = scenario_json(path)
    rejected, accepted = doc["commands"]
    assert rejected["exit"] == 255 and rejected["code"] == "XCE_RESIZE_POLICY"
    assert "powers of two: 4 -> 6" in rejected["message"]
    assert accepted["exit"] == 0
    assert sum(doc["jobs"]["101"]["hosts"].values()) == 8


def test_usage_errors_exit_2_and_api_errors_in_scenarios(tmp_path: Path) -> None:
    path = tmp_path / "u.toml"
    path.write_text(
        """
[cluster]
hosts = { a = 4 }
[[jobs]]
user = "u"
tasks = "1,4"
resizable = true
alloc = { a = 2 }
[[commands]]
user = "u"
bresize = "request -rnc x -rncn 1 101"
[[commands]]
user = "u"
resize = { op = "grow", job = "101", tasks = "2" }
[[commands]]
user = "u"
resize = { op = "release", job = "101", spec = "a", count = 1 }
[[commands]]
user = "u"
resize = { op = "grow", job = "101", tasks = 1, min_tasks = 1 }
"""
    )
    doc = scenario_json(path)
    usage, bad_type, two_forms, ok = doc["commands"]
    assert usage["exit"] == 2 and "mutually exclusive" in usage["message"]
    assert bad_type["exit"] == 2 and "$.tasks" in bad_type["message"]
    assert two_forms["exit"] == 255 and "exactly one of" in two_forms["message"]
    assert ok["exit"] == 0
    assert doc["jobs"]["101"]["hosts"] == {"a": 3}


def test_journal_commands(tmp_path: Path) -> None:
    state = tmp_path / "state"
    proc = run(
        "scenario", "run", str(DATA / "scenarios" / "grow_limits.toml"), "--state-dir", str(state)
    )
    assert proc.returncode == 0, proc.stderr
    journal = state / "resize"
    proc = run("journal", "verify", str(journal), "--json")
    report = json.loads(proc.stdout)
    assert proc.returncode == 0 and report["ok"] and report["facts"] > 5
    proc = run("journal", "export", str(journal))
    lines = [json.loads(line) for line in proc.stdout.splitlines()]
    assert lines[0]["seq"] == 1 and lines[0]["fact"]["type"] == "JobTracked"
    assert len(lines) == report["facts"]
    # An output that cannot be written: one line naming it, not a traceback.
    nowhere = tmp_path / "no-such-dir" / "out.jsonl"
    proc = run("journal", "export", str(journal), "-o", str(nowhere))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert (
        proc.stderr
        == f"xce-resize: Usage error: -o {nowhere}: cannot write (No such file or directory)\n"
    )
    if Path("/dev/full").exists():  # a full disk: no part of an export is left
        proc = run("journal", "export", str(journal), "-o", "/dev/full")
        assert proc.returncode == 2 and "-o /dev/full: cannot write (No space left" in proc.stderr
    before = json.loads(scenario_usage(state))
    archive = tmp_path / "archive.jsonl"
    proc = run(
        "journal",
        "compact",
        str(journal),
        "--keep-days",
        "1",
        "--now",
        "1e9",
        "--archive",
        str(archive),
    )
    assert proc.returncode == 0 and f"removed {report['facts']} facts" in proc.stdout
    archived = sorted(
        (json.loads(x) for x in archive.read_text().splitlines()), key=lambda d: d["seq"]
    )
    assert archived == lines  # nothing lost
    proc = run("journal", "verify", str(journal), "--json")
    assert json.loads(proc.stdout)["facts"] == 0 and json.loads(proc.stdout)["ok"]
    assert json.loads(scenario_usage(state)) == before  # accounting survives compaction


def scenario_usage(state: Path) -> str:
    """The resize accounting of every finished job, read back from the journal."""
    code = (
        "import json, sys; from xce_resize_plugin.core import converters, accounting;"
        "from xce_resize_plugin.journal import Journal;"
        "j = Journal.open(sys.argv[1], readonly=True);"
        "ids = ['221', '222'];"
        "out = {i: accounting.usage_of_state(converters.decode_state(j.state(i)), 0).slot_seconds"
        " for i in ids if j.state(i)};"
        "print(json.dumps(out))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, str(state / "resize")],
        capture_output=True,
        text=True,
        check=True,
    )
    return proc.stdout


def test_compact_archives_by_default_into_the_journal_dir(tmp_path: Path) -> None:
    state = tmp_path / "state"
    run("scenario", "run", str(DATA / "scenarios" / "grow_limits.toml"), "--state-dir", str(state))
    exported = run("journal", "export", str(state / "resize")).stdout.splitlines()
    assert len(exported) > 10  # both jobs ended: every fact goes
    proc = run("journal", "compact", str(state / "resize"), "--keep-days", "0", "--now", "1e9")
    assert proc.returncode == 0, proc.stderr
    archives = list((state / "resize").glob("compacted-*.jsonl"))
    assert len(archives) == 1 and str(archives[0]) in proc.stdout
    archived = sorted(
        (json.loads(x) for x in archives[0].read_text().splitlines()), key=lambda d: d["seq"]
    )
    assert archived == [json.loads(line) for line in exported]  # every fact, as it was


def test_an_archive_on_a_full_disk_is_one_line_and_compacts_nothing(tmp_path: Path) -> None:
    """/dev/full: writing the archive fails with ENOSPC. Closing the file failed again
    and hid compaction's own error behind a traceback (exit 1)."""
    state = tmp_path / "state"
    run("scenario", "run", str(DATA / "scenarios" / "grow_limits.toml"), "--state-dir", str(state))
    before = run("journal", "export", str(state / "resize")).stdout
    proc = run(
        "journal", "compact", str(state / "resize"), "--keep-days", "0", "--now", "1e9",
        "--archive", "/dev/full",
    )  # fmt: skip
    assert (proc.returncode, proc.stdout) == (2, ""), proc.stderr
    assert proc.stderr == (
        "xce-resize: Journal error: /dev/full: cannot write the archive (No space left on "
        "device); "
        "nothing was compacted\n"
    )
    assert run("journal", "export", str(state / "resize")).stdout == before
    proc = run("journal", "compact", str(state / "resize"), "--keep-days", "-1")
    assert proc.returncode == 2 and "--keep-days must be zero or more, got -1" in proc.stderr


def test_with_stderr_closed_no_message_lands_among_the_answers(tmp_path: Path) -> None:
    """``journal export DIR 2>&-``: "exported N facts" was appended to the JSON lines
    (print(file=None) writes to stdout)."""
    state = tmp_path / "state"
    run("scenario", "run", str(DATA / "scenarios" / "grow_limits.toml"), "--state-dir", str(state))
    proc = subprocess.run(
        ["/bin/sh", "-c", '"$0" -m xce_resize_plugin journal export "$1" 2>&-', sys.executable,
         str(state / "resize")],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0
    lines = proc.stdout.splitlines()
    assert lines and all(json.loads(line)["seq"] for line in lines)


def test_an_output_named_by_a_link_keeps_the_link(tmp_path: Path) -> None:
    """The check that --json can be written made the link's target, then removed the
    link (it removed what it thought it had made), even when another option was
    refused."""
    link = tmp_path / "out.json"
    link.symlink_to(tmp_path / "target.json")
    proc = run(
        "simulate", "--synthetic", "lublin:jobs=5,procs=8", "--json", str(link),
        "--plot", str(tmp_path / "nodir" / "x.png"), "-q",
    )  # fmt: skip
    assert proc.returncode == 2 and "--plot" in proc.stderr
    assert link.is_symlink() and not (tmp_path / "target.json").exists()
    proc = run("simulate", "--synthetic", "lublin:jobs=5,procs=8", "--seed", "-1", "-q")
    assert proc.returncode in (0, 1), proc.stderr  # a negative seed is a seed


def test_journal_verify_reports_damage(tmp_path: Path) -> None:
    import lmdb

    state = tmp_path / "state"
    run("scenario", "run", str(DATA / "scenarios" / "grow_limits.toml"), "--state-dir", str(state))
    env = lmdb.open(str(state / "resize"), max_dbs=8)
    facts = env.open_db(b"facts")
    with env.begin(write=True, db=facts) as txn:
        key = (3).to_bytes(8, "big")
        value = bytearray(txn.get(key))
        value[-2] ^= 0x55  # one flipped bit pattern inside the payload
        txn.put(key, bytes(value))
    env.close()
    proc = run("journal", "verify", str(state / "resize"))
    assert proc.returncode == 1
    assert "fact 3: CRC mismatch" in proc.stdout and "1 problem" in proc.stdout


def test_journal_commands_on_what_is_no_journal_write_nothing(tmp_path: Path) -> None:
    """compact and export of a missing directory, an empty one, or another program's LMDB
    environment: exit 2 naming the data file, and no archive, output or mode change."""
    import lmdb

    foreign = tmp_path / "foreign"
    env = lmdb.open(str(foreign))
    with env.begin(write=True) as txn:
        txn.put(b"key", b"value")
    env.close()
    for path in (foreign, foreign / "data.mdb"):
        path.chmod(0o755 if path.is_dir() else 0o644)
    (tmp_path / "empty").mkdir()
    out = tmp_path / "out"
    for name in ("missing", "empty", "foreign"):
        journal = tmp_path / name
        before = sorted(journal.iterdir()) if journal.exists() else None
        modes = [p.stat().st_mode for p in before or ()]
        proc = run("journal", "compact", str(journal), "--keep-days", "0", "--now", "1e9")
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.startswith(f"xce-resize: Journal error: {journal / 'data.mdb'}: ")
        assert len(proc.stderr.splitlines()) == 1, proc.stderr
        proc = run("journal", "export", str(journal), "-o", str(out))
        assert proc.returncode == 2 and str(journal / "data.mdb") in proc.stderr
        assert (sorted(journal.iterdir()) if journal.exists() else None) == before
        assert [p.stat().st_mode for p in before or ()] == modes
        assert not out.exists()


def test_version() -> None:
    proc = run("--version")
    assert proc.returncode == 0 and "xce-resize" in proc.stdout


def test_scenario_refusals_are_reported(tmp_path: Path) -> None:
    path = tmp_path / "r.toml"
    path.write_text(
        """
[cluster]
hosts = { a = 2 }
[[jobs]]
user = "u"
tasks = 1
[[jobs]]
user = "u"
submit = 5
tasks = 3
"""
    )
    # Refused at t=5: the whole output still comes, then one line, exit 2.
    proc = run("scenario", "run", str(path), "--json")
    assert proc.returncode == 2
    doc = json.loads(proc.stdout)
    assert doc["rejected_jobs"][0]["job"] == "102" and doc["rejected_jobs"][0]["time"] == 5
    assert "102" not in doc["jobs"]
    assert proc.stderr.splitlines() == [
        f"xce-resize: {path}: job 102 refused at t=5s: SubmissionRejected: job 102 can never "
        "start: 3 task(s) on 2 slot(s)"
    ]
    text = run("scenario", "run", str(path))
    assert text.returncode == 2 and "job 102 refused on arrival" in text.stdout
    path.write_text(path.read_text().replace("submit = 5\n", ""))
    proc = run("scenario", "run", str(path))
    assert proc.returncode == 2
    assert f"{path}: jobs[1] (job 102): rejected" in proc.stderr


def test_scenario_refuses_a_used_state_dir(tmp_path: Path) -> None:
    state = tmp_path / "state"
    scenario = str(DATA / "scenarios" / "grow_limits.toml")
    assert run("scenario", "run", scenario, "--state-dir", str(state)).returncode == 0
    proc = run("scenario", "run", scenario, "--state-dir", str(state))
    assert proc.returncode == 2 and "is not empty" in proc.stderr


@pytest.mark.parametrize(
    "scenario",
    [
        DATA / "scenarios" / "grow_limits.toml",
        ROOT / "xce_resize_plugin" / "scenarios" / "demo.toml",
    ],
)
def test_a_recorded_scenario_replays_to_the_same_facts(scenario: Path, tmp_path: Path) -> None:
    out = tmp_path / "run.jsonl"
    proc = run("scenario", "run", str(scenario), "--record", str(out), "--json")
    assert proc.returncode == 0, proc.stderr
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    kinds = [rec["kind"] for rec in lines]
    assert kinds[0] == "header" and kinds.count("fact") > 10
    # every command of the scenario is in the recording, with its outcome
    commands = json.loads(proc.stdout)["commands"]
    assert kinds.count("request") == sum(1 for c in commands if c["exit"] != 2)
    proc = run("simulate", "--replay", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "identical" in proc.stdout


def test_a_tampered_scenario_recording_is_reported(tmp_path: Path) -> None:
    out = tmp_path / "run.jsonl"
    proc = run(
        "scenario", "run", str(DATA / "scenarios" / "grow_limits.toml"), "--record", str(out)
    )
    assert proc.returncode == 0, proc.stderr
    lines = out.read_text().splitlines()
    first_request = next(i for i, line in enumerate(lines) if '"kind":"request"' in line)
    out.write_text("\n".join(lines[:first_request] + lines[first_request + 1 :]) + "\n")
    proc = run("simulate", "--replay", str(out))
    assert proc.returncode == 1
    assert "DIFFERENT" in proc.stdout


def closed_pipe_run(
    argv: list[str], closed: str = "stdout", env: dict[str, str] | None = None
) -> tuple[int, str]:
    """Run ``argv`` (a command of this venv) with the reader of ``closed`` (stdout or
    stderr) gone before it writes a byte; its status and what the other stream got."""
    exe = str(Path(sys.executable).parent / argv[0])
    proc = subprocess.Popen(
        [exe, *argv[1:]], stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT, env=env
    )
    gone, kept = (proc.stdout, proc.stderr) if closed == "stdout" else (proc.stderr, proc.stdout)
    assert gone is not None and kept is not None
    gone.close()
    try:
        text = kept.read().decode()
        status = proc.wait(timeout=120)
    finally:
        kept.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return status, text


@pytest.mark.parametrize("argv", [["xce-resize", "demo"], ["bresize", "-h"]])
def test_a_closed_pipe_ends_the_command_quietly(argv: list[str]) -> None:
    """``xce-resize demo | head -0``: no BrokenPipeError traceback, SIGPIPE's status."""
    assert closed_pipe_run(argv) == (141, "")


@pytest.mark.parametrize("argv", [["jobs"], ["simulate", "no-such-trace.swf"]])
def test_a_closed_stderr_pipe_ends_an_error_quietly(argv: list[str]) -> None:
    """``xce-resize ... 2>&1 | head -0`` on an error: SIGPIPE's status, as bresize's,
    not 1 from a traceback swallowed at exit."""
    env = {**os.environ, "XCE_CONTROLLER_URL": "http://127.0.0.1:9"}
    assert closed_pipe_run(["xce-resize", *argv], "stderr", env) == (141, "")


def test_a_closed_stderr_loses_the_message_not_the_status() -> None:
    """``2>&-``: print() would have written the error to stdout, where scripts read."""
    exe = str(Path(sys.executable).parent / "xce-resize")
    env = {**os.environ, "XCE_CONTROLLER_URL": "http://127.0.0.1:9"}
    proc = subprocess.run(
        ["/bin/sh", "-c", '"$0" jobs 2>&-', exe], capture_output=True, text=True, env=env
    )
    assert (proc.returncode, proc.stdout, proc.stderr) == (255, "", "")


def test_host_failures_and_drains_replay_to_the_same_facts(tmp_path: Path) -> None:
    """Host commands are inputs of a recording ("host" lines, before their effects):
    a scenario with a failure and an evacuating drain, and a simulation with injected
    failures, replay identically (before, their replays diverged at the first
    failure)."""
    out = tmp_path / "scenario.jsonl"
    example = ROOT / "docs" / "examples" / "host_failure_and_drain.toml"
    assert run("scenario", "run", str(example), "--record", str(out)).returncode == 0
    hosts = [json.loads(line) for line in out.read_text().splitlines() if '"host"' in line]
    assert [(h["host"], h["state"]) for h in hosts if h["kind"] == "host"] == [
        ("hB", "down"),
        ("hD", "closed"),
        ("hB", "up"),
        ("hD", "open"),
    ]
    proc = run("simulate", "--replay", str(out))
    assert proc.returncode == 0 and "identical" in proc.stdout, proc.stdout + proc.stderr

    sim = tmp_path / "sim.jsonl"
    trace = DATA / "KTH-SP2-1996-2.1-cln-first200.swf.gz"
    args = ["--malleable-fraction", "0.5", "--host-failures", "200:1", "--quiet"]
    proc = run("simulate", str(trace), *args, "--record", str(sim))
    assert proc.returncode == 0, proc.stderr
    assert sim.read_text().count('"kind":"host"') > 10
    proc = run("simulate", "--replay", str(sim))
    assert proc.returncode == 0 and "identical" in proc.stdout, proc.stdout + proc.stderr


def test_scenario_inputs_that_were_tracebacks_are_one_line(tmp_path: Path) -> None:
    """A host state given as a list, an output that cannot be written, a state
    directory that is a file: one line naming what is wrong, exit 2. A job id with a
    '/' is refused (its directories were made outside the state directory), and a TOML
    date in [resize] is shown as text by --json (a traceback at the end of the run)."""
    base = "[cluster]\nhosts = { hA = 2 }\n[users]\nadmins = ['root']\n"
    listed = tmp_path / "list.toml"
    listed.write_text(
        base + "[[commands]]\nat = 1\nuser = 'root'\nhost = { name = 'hA', state = ['down'] }\n"
    )
    proc = run("scenario", "run", str(listed))
    assert proc.returncode == 2 and proc.stderr == (
        f"xce-resize: Configuration error: {listed}: commands[0].host.state: must be one of "
        "closed, down, open, up\n"
    )
    plain = tmp_path / "plain.toml"
    plain.write_text(base + "[[jobs]]\nuser = 'u'\ntasks = 1\nruntime = 5\n")
    proc = run("scenario", "run", str(plain), "--record", str(tmp_path / "no" / "x.rec"))
    assert proc.returncode == 2 and proc.stderr.startswith("xce-resize: Usage error: --record ")
    assert "cannot write (No such file or directory)" in proc.stderr
    (tmp_path / "afile").write_text("")
    proc = run("scenario", "run", str(plain), "--state-dir", str(tmp_path / "afile"))
    assert (
        proc.returncode == 2 and "--state-dir" in proc.stderr and "not a directory" in proc.stderr
    )
    escaping = tmp_path / "escape.toml"
    escaping.write_text(base + "[[jobs]]\nid = '../escaped'\nuser = 'u'\ntasks = 1\n")
    proc = run("scenario", "run", str(escaping), "--state-dir", str(tmp_path / "s"))
    assert proc.returncode == 2 and "job id '../escaped' is not one" in proc.stderr
    assert not (tmp_path / "escaped").exists()
    dated = tmp_path / "dated.toml"
    dated.write_text(
        base + "[[jobs]]\nid = '101'\nuser = 'u'\ntasks = '1,2'\nresizable = true\n"
        "alloc = { hA = 2 }\nruntime = 100\n[[commands]]\nat = 1\nuser = 'u'\n"
        "resize = { op = 'release', job = '101', count = 1979-05-27 }\n"
    )
    proc = run("scenario", "run", str(dated), "--json")
    assert "Traceback" not in proc.stderr, proc.stderr
    assert "1979-05-27" in json.dumps(json.loads(proc.stdout))


def test_an_export_that_fails_leaves_an_existing_file_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """-o naming a file that was there: a failed export deleted it (it was not the
    export's to delete), as it deletes one it made and cut short."""
    from xce_resize_plugin import journal
    from xce_resize_plugin.cli.main import _export_to

    def failing(directory: Path, out: object, **kwargs: object) -> int:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(journal, "export", failing)
    kept = tmp_path / "keep.txt"
    kept.write_text("mine")
    with pytest.raises(errors.UsageError, match="cannot write"):
        _export_to(tmp_path, kept)
    assert kept.exists()
    made = tmp_path / "new.jsonl"
    with pytest.raises(errors.UsageError, match="cannot write"):
        _export_to(tmp_path, made)
    assert not made.exists()


# -- standard output that cannot be written ------------------------------------------

FULL = Path("/dev/full")
needs_dev_full = pytest.mark.skipif(not FULL.exists(), reason="no /dev/full here")


def run_to(stdout: Any, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """``xce-resize ARGS > stdout``: stdout a file object, or None for ``>&-``."""
    code = "import sys; from xce_resize_plugin.cli.main import main; sys.exit(main())"
    if stdout is None:
        return subprocess.run(
            ["/bin/sh", "-c", 'c=$1; shift; "$0" -c "$c" "$@" >&-', sys.executable, code, *args],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=cwd, timeout=120,
        )  # fmt: skip
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        stdout=stdout, stderr=subprocess.PIPE, text=True, cwd=cwd, timeout=120,
    )  # fmt: skip


def scenario_state(tmp_path: Path) -> Path:
    """A journal whose two jobs have ended (every fact goes at --keep-days 0)."""
    state = tmp_path / "state"
    scenario = str(DATA / "scenarios" / "grow_limits.toml")
    assert run("scenario", "run", scenario, "--state-dir", str(state)).returncode == 0
    return state / "resize"


@needs_dev_full
def test_a_full_standard_output_is_one_line_and_its_own_status(tmp_path: Path) -> None:
    """``> /dev/full``: an OSError traceback, exit 1, which journal verify documents as
    "problems found"."""
    journal = str(scenario_state(tmp_path))
    for args in (
        ["journal", "export", journal],
        ["journal", "export", journal, "-o", "-"],
        ["journal", "verify", journal],
        ["journal", "verify", "--json", journal],
        ["demo"],
        ["demo", "--json"],
    ):
        with FULL.open("w") as full:
            proc = run_to(full, *args)
        assert (proc.returncode, proc.stderr) == (
            74,
            "xce-resize: standard output: cannot write (No space left on device)\n",
        ), args


def test_a_closed_standard_output_is_one_line_and_its_own_status() -> None:
    proc = run_to(None, "demo")
    assert (proc.returncode, proc.stderr) == (
        74,
        "xce-resize: standard output: cannot write (Bad file descriptor)\n",
    )


@needs_dev_full
def test_a_compaction_whose_summary_cannot_be_written_says_it_was_done(tmp_path: Path) -> None:
    """The facts were archived and removed, then printing the summary was a traceback:
    an administrator would have taken it for a failed compaction."""
    journal = scenario_state(tmp_path)
    facts = len(run("journal", "export", str(journal)).stdout.splitlines())
    archive = tmp_path / "archive.jsonl"
    with FULL.open("w") as full:
        proc = run_to(
            full, "journal", "compact", str(journal), "--keep-days", "0", "--archive", str(archive)
        )
    assert (proc.returncode, proc.stderr) == (
        74,
        "xce-resize: standard output: cannot write (No space left on device); the compaction "
        f"was done: removed {facts} facts of jobs finished more than 0 days ago (archived to "
        f"{archive})\n",
    )
    assert len(archive.read_text().splitlines()) == facts
    assert run("journal", "export", str(journal)).stdout == ""


def test_an_archive_of_dash_is_standard_output(tmp_path: Path) -> None:
    """``--archive -`` wrote a file named ``-`` in the current directory."""
    journal = scenario_state(tmp_path)
    exported = run("journal", "export", str(journal)).stdout
    proc = run("journal", "compact", str(journal), "--keep-days", "0", "--archive", "-",
               cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    key = lambda line: json.loads(line)["seq"]  # noqa: E731
    assert sorted(proc.stdout.splitlines(), key=key) == exported.splitlines()
    facts = len(exported.splitlines())
    assert proc.stderr == (
        f"removed {facts} facts of jobs finished more than 0 days ago "
        "(archived to standard output)\n"
    )
    assert not (tmp_path / "-").exists()
    assert run("journal", "export", str(journal)).stdout == ""


@needs_dev_full
def test_an_archive_on_a_full_standard_output_compacts_nothing(tmp_path: Path) -> None:
    journal = scenario_state(tmp_path)
    before = run("journal", "export", str(journal)).stdout
    with FULL.open("w") as full:
        proc = run_to(
            full, "journal", "compact", str(journal), "--keep-days", "0", "--archive", "-",
            cwd=tmp_path,
        )  # fmt: skip
    assert (proc.returncode, proc.stderr) == (
        2,
        "xce-resize: Journal error: standard output: cannot write the archive (No space left "
        "on device); nothing was compacted\n",
    )
    assert run("journal", "export", str(journal)).stdout == before
    assert not (tmp_path / "-").exists()


def test_an_oserror_not_of_standard_output_is_not_said_to_be(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Only a write to standard output is reported as one: another OSError (a bug:
    every file a command opens is named in its own message) keeps its traceback."""
    from xce_resize_plugin.cli import main as cli

    def failing(args: object, out: object) -> int:
        raise OSError(28, "No space left on device", "/elsewhere")

    monkeypatch.setattr(cli, "_dispatch", failing)
    with pytest.raises(OSError, match="/elsewhere"):
        cli.main(["demo"])


def test_dot_slash_dash_is_a_file_named_dash(tmp_path: Path) -> None:
    """``-`` is standard output; ``./-`` names a file called ``-``, as the docs say
    (the options were paths, and Path("./-") is Path("-"): both went to stdout)."""
    journal = str(scenario_state(tmp_path))
    work = tmp_path / "work"
    work.mkdir()
    exported = run("journal", "export", journal, "-o", "./-", cwd=work)
    assert (exported.returncode, exported.stdout) == (0, "")
    assert len((work / "-").read_text().splitlines()) == 16
    (work / "-").unlink()
    compacted = run("journal", "compact", journal, "--keep-days", "0", "--archive", "./-", cwd=work)
    assert compacted.returncode == 0, compacted.stderr
    assert compacted.stdout.startswith("removed 16 facts")
    assert len((work / "-").read_text().splitlines()) == 16


def test_a_long_notification_output_is_cut_in_the_timeline_and_said_so(tmp_path: Path) -> None:
    """The timeline shows a notification's first lines and how many more there are;
    ``--json`` has all of them (docs/scenarios.md, "The --json output")."""
    path = tmp_path / "talk.toml"
    path.write_text(
        "[cluster]\nhosts = { a = 2, b = 2 }\n\n"
        '[[jobs]]\nid = "101"\nuser = "alice"\ntasks = "1,4"\nresizable = true\n'
        'alloc = { a = 1 }\nruntime = 100\nnotify_cmd = "seq 1 8"\n\n'
        '[[commands]]\nat = 5\nuser = "alice"\nbresize = "request 1 101"\n'
    )
    proc = run("scenario", "run", str(path))
    assert proc.returncode == 0, proc.stderr
    shown = [line.strip() for line in proc.stdout.splitlines() if line.strip().startswith("|")]
    assert shown == [f"| {i}" for i in range(1, 6)] + ["| ... (3 more lines: see --json)"]
    doc = scenario_json(path)
    assert [n["stdout"] for n in doc["notifications"]] == ["".join(f"{i}\n" for i in range(1, 9))]
