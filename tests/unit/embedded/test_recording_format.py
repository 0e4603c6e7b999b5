"""Reading recordings (the checks of every line), the live comparison, and the live
controller's ``record`` key. The recording of a real live run and its replay are tested
in tests/e2e/live/test_live_recording.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from xce_resize_plugin.controllers.live import settings as live_config
from xce_resize_plugin.core.models import (
    AutoresizeRequest,
    CancelRequest,
    DrainedRequest,
    GrowRequest,
    ReadyRequest,
    ReleaseRequest,
    ResizeRequest,
    TargetRequest,
)
from xce_resize_plugin.errors import ConfigError
from xce_resize_plugin.recording.format import (
    RecordingError,
    check_line,
    read_recording,
    request_from_json,
    request_json,
)
from xce_resize_plugin.recording.replay import (
    MAX_PROBLEMS,
    compare_live,
    one_per_task,
    replay,
    show_fact,
    timeless,
)

HEADER: dict[str, Any] = {
    "kind": "header",
    "format": "xce-resize-recording",
    "version": 1,
    "controller": "live",
    "hosts": [["h1", 2], ["h2", 2]],
    "config": {"stop_grace": 1.0},
    "user_slots": {},
    "protect_reservation": True,
    "lean_cycles": False,
    "t": 1000.0,
}
SUBMIT = {
    "kind": "submit",
    "t": 1000.5,
    "phase": "settled",
    "job": "101",
    "user": "alice",
    "tasks": [1, 3],
    "resizable": True,
    "alloc": [["h1", 1]],
}


def write(path: Path, *lines: dict[str, Any], header: dict[str, Any] | None = None) -> Path:
    path.write_text("".join(json.dumps(x) + "\n" for x in (header or HEADER, *lines)))
    return path


# -- line checks ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ({"kind": "task", "t": 1, "job": "1", "event": "started"}, "task: missing field 'task'"),
        (
            {"kind": "task", "t": 1, "job": "1", "task": 0, "event": "finished"},
            "task: event must be started | start_failed | exited, got 'finished'",
        ),
        ({"kind": "task", "t": "soon", "job": "1", "task": 0, "event": "started"}, "t must be"),
        (
            {"kind": "task", "t": 1, "job": "1", "task": True, "event": "started"},
            "task: task must be a task id (integer), got True",
        ),
        ({"kind": "submit", "t": 1, "job": "1", "user": "a", "tasks": [1]}, "tasks must be"),
        (
            {"kind": "request", "t": 1, "job": "1", "principal": {"name": "a"}, "request": {}},
            "request must be an object whose type is grow | release | cancel | target | modify",
        ),
        ({"kind": "ending", "t": 1, "job": "1", "tasks": ["1"], "grace": 1}, "tasks must be"),
        ({"kind": "end", "t": 1, "job": "1", "state": "KILLED"}, "state must be DONE | EXIT"),
        ({"kind": "fact", "seq": 1, "job": "1", "fact": {"at": 1}}, "fact must be"),
        ({"kind": "closed", "t": 1}, "closed: missing field 'clean'"),
        ({"kind": "tick", "t": 1}, "kind 'tick' is not part of a live recording"),
        ({"kind": "end", "t": 1, "job": "1", "state": "DONE", "phase": "later"}, "phase must"),
        ({"kind": "end", "t": 1, "job": "1", "state": "DONE", "phase": "sync"}, "only task"),
        ({"kind": "resize", "t": 1}, "unknown kind 'resize'"),
        ({"kind": "cycle", "t": float("nan")}, "cycle: t must be the controller's clock"),
        ({"kind": "cycle", "t": float("-inf")}, "cycle: t must be the controller's clock"),
        ({**SUBMIT, "notify_cmd": 5}, "submit: notify_cmd must be a string or null, got 5"),
        (
            {**SUBMIT, "ptile": "2"},
            "submit: ptile must be an integer from 1 to 2147483647 or null, got '2'",
        ),
        ({**SUBMIT, "env": ["A=1"]}, "submit: env must be an object of strings"),
        ({**SUBMIT, "estimate": "1"}, "submit: estimate must be seconds (a number >= 0) or null"),
        (
            {**SUBMIT, "grow_hosts": "bogus"},
            "submit: grow_hosts must be prefer-existing | new-only | any, got 'bogus'",
        ),
        # bool("false") is True: a string here would have made the job resizable.
        ({**SUBMIT, "resizable": "false"}, "submit: resizable must be true or false"),
        ({**SUBMIT, "autoresize": 1}, "submit: autoresize must be true or false"),
        ({**SUBMIT, "release_exited": None}, "submit: release_exited must be true or false"),
        ({**SUBMIT, "alloc": {"h1": 2}}, "submit: alloc must be null or a list of [host, tasks]"),
        ({**SUBMIT, "alloc": [["h1", "2"]]}, "submit: alloc must be null or a list"),
        ({**SUBMIT, "alloc": [["h1", 2, 3]]}, "submit: alloc must be null or a list"),
        ({**SUBMIT, "work": {"model": "amdahl"}}, "submit: work must be null or {model"),
        (
            {**SUBMIT, "work": {"model": "quadratic", "ref_procs": 2, "estimate": 60}},
            "submit: work must be null or {model: a speedup model, ref_procs (>= 1), estimate",
        ),
        (
            {**SUBMIT, "work": {"model": "linear", "ref_procs": 2, "estimate": float("nan")}},
            "submit: work must be",
        ),
        # Beyond 64 bits the journal cannot record it: "cannot be written to the
        # journal", naming neither the line nor the field.
        (
            {"kind": "notify", "t": 1, "job": "101", "attempt": 1, "status": 2**64},
            "notify: status must be a 64-bit integer or null, got 18446744073709551616",
        ),
        (
            {"kind": "task", "t": 1, "job": "101", "task": 2**63, "event": "exited"},
            "task: task must be a task id (integer), got 9223372036854775808",
        ),
    ],
)
def test_check_line_names_what_is_wrong(line: dict[str, Any], message: str) -> None:
    problem = check_line(line, "live")
    assert problem is not None and message in problem, problem


_WORK = {"model": "linear", "ref_procs": 2, "estimate": 60}


@pytest.mark.parametrize(
    ("line", "message"),
    [
        # Values no recorder writes were applied, and reported as a replay difference
        # (exit 1) or a raw Python error text, instead of a bad input (exit 2).
        ({**SUBMIT, "estimate": -1}, "submit: estimate must be seconds (a number >= 0) or null"),
        (
            {**SUBMIT, "tasks": [10**18, 10**18]},
            "submit: tasks must be [min, max] (integers, 1 <= min <= max <= 2147483647), "
            "got [1000000000000000000, 1000000000000000000]",
        ),
        ({**SUBMIT, "tasks": [3, 1]}, "submit: tasks must be [min, max]"),
        ({**SUBMIT, "tasks": [0, 1]}, "submit: tasks must be [min, max]"),
        (
            {**SUBMIT, "start_tasks": 10**9},
            "submit: start_tasks must be within the job's tasks 1,3, got 1000000000",
        ),
        ({**SUBMIT, "initial_tasks": 0}, "submit: initial_tasks must be within the job's tasks"),
        ({**SUBMIT, "alloc": [["h1", 4]]}, "submit: alloc must hold 1 to 3 tasks, got 4"),
        ({**SUBMIT, "alloc": [["h1", 0]]}, "submit: alloc must be null or a list of [host, tasks]"),
        ({**SUBMIT, "work": {**_WORK, "ref_procs": 0}}, "submit: work must be null or {model"),
        ({**SUBMIT, "work": {**_WORK, "estimate": 0}}, "submit: work must be null or {model"),
        ({**SUBMIT, "work": {**_WORK, "estimate": 1e11}}, "submit: work must be null or {model"),
        ({**SUBMIT, "grace": -1}, "submit: grace must be seconds (a number >= 0), got -1"),
        (
            {"kind": "cycle", "t": -5},
            "cycle: t must be the controller's clock (a number from 0 to 1e+10 s), got -5",
        ),
        ({"kind": "cycle", "t": 1e308}, "cycle: t must be the controller's clock (a number from"),
        ({"kind": "ending", "t": 1, "job": "1", "tasks": [1], "grace": -1}, "ending: grace must"),
        # A huge value is shown cut, so that the message stays one short line.
        ({**SUBMIT, "env": {"A": "x" * 10**6, "B": 1}}, "submit: env must be an object of strings"),
    ],
)
def test_check_line_refuses_values_out_of_range(line: dict[str, Any], message: str) -> None:
    problem = check_line(line, "live")
    assert problem is not None and problem.startswith(message), problem
    assert len(problem) < 300


def test_check_line_accepts_what_the_recorders_write() -> None:
    for line in (
        SUBMIT,
        {
            **SUBMIT,
            "resizable": True,
            "autoresize": True,
            "release_exited": False,
            "grow_hosts": "new-only",
            "alloc": [["h1", 2], ["h2", 1]],
            "work": {"model": "amdahl:0.1:cost=5", "ref_procs": 4, "estimate": 60.5},
        },
        {**SUBMIT, "alloc": None, "work": None},
        {"kind": "cycle", "t": 2.5},
        {"kind": "ending", "t": 1, "job": "1", "tasks": [0, 2], "grace": 0.5, "state": "EXIT"},
        {"kind": "task", "t": 1, "phase": "sync", "job": "1", "task": 3, "event": "start_failed"},
        {"kind": "fact", "seq": 4, "job": "1", "fact": {"type": "Committed", "version": 1}},
        {"kind": "started", "t": 1, "job": "1", "hosts": {"h1": 2}},
        {"kind": "closed", "t": 9, "clean": True},
    ):
        assert check_line(line, "live") is None, line
    assert check_line({"kind": "tick", "t": 1, "phase": "timeline", "i": 3}, "simulated") is None
    problem = check_line({"kind": "cycle", "t": 1}, "simulated")
    assert problem == "kind 'cycle' is not part of a simulated recording"


@pytest.mark.parametrize(
    "request_",
    [
        GrowRequest(min_add=1, max_add=2),
        GrowRequest(min_add=1, max_add=4, wait_ready=True, ready_timeout=30.0, if_version=3),
        ReleaseRequest(task_ids=(2, 3), grace=5.0),
        ReleaseRequest(count=1),
        CancelRequest(),
        TargetRequest(3, (2,)),
        TargetRequest(None, ()),
        AutoresizeRequest(True),
        DrainedRequest((2, 3)),
        ReadyRequest(4),
    ],
    ids=repr,
)
def test_every_request_a_recorder_writes_reads_back(
    tmp_path: Path, request_: ResizeRequest
) -> None:
    """A request line of each kind passes the reader's checks and gives back the same
    request (a recording of a Dask job, with ``drained`` and ``ready`` lines, or of an
    autoresize change, was refused as malformed)."""
    line = {
        "kind": "request",
        "t": 1001.0,
        "job": "101",
        "principal": {"name": "alice", "admin": False, "job_id": None},
        "request": request_json(request_),
        "result": "ok",
    }
    _, lines = read_recording(write(tmp_path / "r.jsonl", SUBMIT, line))
    assert request_from_json(lines[1]["request"]) == request_


def test_read_recording_names_file_and_line(tmp_path: Path) -> None:
    path = write(tmp_path / "r.jsonl", SUBMIT, {"kind": "task", "t": 1, "job": "101"})
    with pytest.raises(RecordingError, match=r"r\.jsonl:3: task: missing field 'task'"):
        read_recording(path)
    header, lines = read_recording(write(tmp_path / "ok.jsonl", SUBMIT))
    assert header["controller"] == "live" and lines[0]["_line"] == 2


def test_read_recording_refuses_a_cut_line_and_lines_after_closing(tmp_path: Path) -> None:
    path = write(tmp_path / "cut.jsonl", SUBMIT)
    path.write_text(path.read_text() + '{"kind": "cycle", "t": 10')
    with pytest.raises(RecordingError, match=r"cut\.jsonl:3: the last line is cut short"):
        read_recording(path)
    closed = {"kind": "closed", "t": 5, "clean": True}
    path = write(tmp_path / "after.jsonl", SUBMIT, closed, {"kind": "cycle", "t": 6})
    with pytest.raises(RecordingError, match=r"after\.jsonl:4: a line after the closing line"):
        read_recording(path)


def test_read_recording_refuses_a_line_nested_too_deeply(tmp_path: Path) -> None:
    path = write(tmp_path / "deep.jsonl", SUBMIT)
    path.write_text(
        path.read_text() + '{"kind": "cycle", "x": ' + "[" * 100000 + "]" * 100000 + "}\n"
    )
    with pytest.raises(RecordingError, match=r"deep\.jsonl:3: not JSON \(nested too deeply\)"):
        read_recording(path)


@pytest.mark.parametrize(
    ("second", "message"),
    [
        ({"i": 1}, r"n\.jsonl:3: cycle: r must be a whole number >= 0 .*got None"),
        ({"i": "x", "r": 0}, r"n\.jsonl:3: cycle: i must be a whole number >= 0 .*got 'x'"),
        ({"r": 0}, r"n\.jsonl:3: cycle: i must be a whole number >= 0 .*got None"),
        ({"i": 1, "r": -1}, r"n\.jsonl:3: cycle: r must be a whole number >= 0 .*got -1"),
    ],
)
def test_a_recording_that_numbers_its_instants_numbers_every_line(
    tmp_path: Path, second: dict[str, Any], message: str
) -> None:
    """Replay orders by instant and round: a line without them was a KeyError or a
    ValueError traceback."""
    first = {**SUBMIT, "i": 0, "r": 0}
    path = write(tmp_path / "n.jsonl", first, {"kind": "cycle", "t": 6, **second})
    with pytest.raises(RecordingError, match=message):
        read_recording(path)


def test_replay_reports_a_submit_line_the_plugin_refuses(tmp_path: Path) -> None:
    closed = {"kind": "closed", "t": 1002.0, "clean": True}
    bad = {**SUBMIT, "tasks": [5, 5], "alloc": None}  # more than the 4 slots of the cluster
    result = replay(write(tmp_path / "r.jsonl", bad, closed))
    assert result.problems[0].startswith("line 2: cannot apply: "), result.problems
    assert "can never start" in result.problems[0]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"controller": "real"}, "controller must be simulated or live, got 'real'"),
        ({"hosts": {"h1": 2}}, "hosts must be"),
        ({"t": "now"}, "t must be a number"),
        ({"version": 2}, "version 2, this reads 1"),
        # A traceback before (dict() of a list), outside the replay's own checks.
        ({"config": [1, 2]}, r"header: config must be an object, got \[1, 2\]"),
        ({"user_slots": "many"}, "header: user_slots must be an object, got 'many'"),
    ],
)
def test_read_recording_checks_the_header(
    tmp_path: Path, change: dict[str, Any], message: str
) -> None:
    path = write(tmp_path / "h.jsonl", SUBMIT, header={**HEADER, **change})
    with pytest.raises(RecordingError, match=message):
        read_recording(path)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"hosts": [["h1", 10**18]]},
            "h.jsonl:1: header: hosts[0] ('h1'): slots must be 1 to 1048576, got 10",
        ),
        ({"hosts": [["h1", 0]]}, "h.jsonl:1: header: hosts[0] ('h1'): slots must be 1 to"),
        ({"t": -1.0}, "h.jsonl:1: header: t must be a number from 0 to 1e+10, got -1.0"),
        ({"t": 1e300}, "h.jsonl:1: header: t must be a number from 0 to 1e+10"),
        ({"user_slots": {"ann": -1}}, "h.jsonl:1: header: user_slots.ann must be an integer >= 0"),
    ],
)
def test_read_recording_refuses_a_header_out_of_range(
    tmp_path: Path, change: dict[str, Any], message: str
) -> None:
    path = write(tmp_path / "h.jsonl", SUBMIT, header={**HEADER, **change})
    with pytest.raises(RecordingError) as caught:
        read_recording(path)
    assert caught.value.detail.startswith(f"{tmp_path}/{message}"), caught.value.detail


def test_read_recording_refuses_more_hosts_than_the_simulator_takes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """2,000,000 hosts took 8 s and 1.3 GB before the first line was replayed; the cap
    is the simulator's, lowered here to keep the test small."""
    from xce_resize_plugin.recording import format as recording_format
    from xce_resize_plugin.simulation.simulate import MAX_HOSTS

    assert recording_format.MAX_HOSTS == MAX_HOSTS  # one cap, held in two layers
    monkeypatch.setattr(recording_format, "MAX_HOSTS", 2)
    hosts = [["h1", 1], ["h2", 1], ["h3", 1]]
    path = write(tmp_path / "h.jsonl", SUBMIT, header={**HEADER, "hosts": hosts})
    with pytest.raises(
        RecordingError,
        match=r"h.jsonl:1: header: hosts: 3 hosts, more than the simulator takes \(2\)",
    ):
        read_recording(path)


# -- the live comparison ----------------------------------------------------------------


def fact(kind: str, at: float, **fields: Any) -> dict[str, Any]:
    return {"job_id": "101", "at": at, **fields, "type": kind}


RUN = [
    ("101", fact("JobTracked", 1.0, tasks=[[0, "h1"]], started_at=0.5)),
    ("101", fact("GrowPlaced", 2.0, tasks=[[1, "h1"], [2, "h2"]])),
    ("101", fact("Committed", 3.0, version=1)),
    ("102", fact("ReleaseAccepted", 4.0, tasks=[[1, "h2"]])),
]


def test_timeless_and_show_fact() -> None:
    assert timeless(RUN[0][1]) == {"job_id": "101", "tasks": [[0, "h1"]], "type": "JobTracked"}
    assert show_fact(RUN[1][1]) == "GrowPlaced tasks=[1@h1, 2@h2]"
    assert show_fact(RUN[2][1]) == "Committed version=1"


def test_compare_live_ignores_times_only() -> None:
    later = [(job, {**f, "at": f["at"] + 0.01}) for job, f in RUN]
    starts = [("101", {"h1": 1}), ("102", {"h2": 2})]
    assert compare_live(starts, starts, RUN, later) == []


def test_compare_live_lists_the_first_difference_of_each_job() -> None:
    other = list(RUN)
    other[1] = ("101", fact("GrowPlaced", 2.0, tasks=[[1, "h1"], [2, "h1"]]))
    other[3] = ("102", fact("ReleaseAccepted", 4.0, tasks=[[2, "h2"]]))
    problems = compare_live([], [], RUN, other)
    assert problems == [
        "job 101 fact 2: live GrowPlaced tasks=[1@h1, 2@h2]; replay GrowPlaced tasks=[1@h1, 2@h1]",
        "job 102 fact 1: live ReleaseAccepted tasks=[1@h2]; replay ReleaseAccepted tasks=[2@h2]",
    ]


def test_starts_and_stops_batched_otherwise_are_the_same_run() -> None:
    """A live run whose agents reported a grow's starts one by one (or a recording made
    before the facts of several tasks) and a replay that reported them all at once
    agree; a different task, status or order does not."""
    apart = [
        ("101", fact("TaskStarted", 2.0, task_id=1)),
        ("101", fact("TaskStarted", 2.1, task_id=2)),
        ("101", fact("TaskStopped", 3.0, task_id=3, status=143)),
        ("101", fact("TaskStopped", 3.0, task_id=4, status=143)),
    ]
    together = [
        ("101", fact("TasksStarted", 2.0, task_ids=[1, 2])),
        ("101", fact("TasksStopped", 3.0, task_ids=[3, 4], status=143)),
    ]
    assert compare_live([], [], apart, together) == []
    assert [timeless(f) for _, f in one_per_task(together)] == [timeless(f) for _, f in apart]
    for changed in (
        [("101", fact("TasksStarted", 2.0, task_ids=[2, 1])), together[1]],
        [together[0], ("101", fact("TasksStopped", 3.0, task_ids=[3, 4], status=137))],
        [together[0], ("101", fact("TasksStopped", 3.0, task_ids=[3, 5], status=143))],
    ):
        assert compare_live([], [], apart, changed) != []


def test_compare_live_missing_and_extra_facts_and_starts() -> None:
    extra = [*RUN, ("103", fact("JobTracked", 9.0, tasks=[[0, "h2"]]))]
    problems = compare_live([("101", {"h1": 1})], [("101", {"h2": 1})], extra, RUN[:2])
    assert problems == [
        "job 101: started on h1 1 live, on h2 1 in the replay",
        "job 101: 3 facts live, 2 in the replay; fact 3 not replayed: Committed version=1",
        "job 102: 1 facts live, 0 in the replay; fact 1 not replayed: ReleaseAccepted tasks=[1@h2]",
        "job 103: 1 facts live, 0 in the replay; fact 1 not replayed: JobTracked tasks=[0@h2]",
    ]
    problems = compare_live([], [("101", {"h1": 1})], RUN[:2], RUN)
    assert problems == [
        "job 101: started on h1 1 in the replay, not live",
        "job 101: 2 facts live, 3 in the replay; fact 3 only in the replay: Committed version=1",
        "job 102: 0 facts live, 1 in the replay; fact 1 only in the replay: "
        "ReleaseAccepted tasks=[1@h2]",
    ]


def test_compare_live_as_prefix_after_a_crash() -> None:
    """A crashed run's recording stops early: the replay may go further, not elsewhere."""
    assert compare_live([], [("101", {"h1": 1})], RUN[:2], RUN, prefix=True) == []
    changed = [RUN[0], ("101", fact("GrowPlaced", 2.0, tasks=[[1, "h2"]]))]
    assert len(compare_live([], [], changed, RUN, prefix=True)) == 1


def test_compare_live_caps_the_list() -> None:
    many = [(str(n), fact("JobEnded", 1.0)) for n in range(MAX_PROBLEMS + 7)]
    problems = compare_live([], [], many, [])
    assert len(problems) == MAX_PROBLEMS + 1 and problems[-1] == "... and 7 more"


def test_replay_of_a_live_recording_without_facts_compares_nothing(tmp_path: Path) -> None:
    """A controller that died before any fact and before its closing line: the replay
    cannot claim it matched."""
    result = replay(write(tmp_path / "r.jsonl", SUBMIT, {"kind": "cycle", "t": 1001.0}))
    assert result.controller == "live" and result.starts == 1
    assert not result.ok
    assert "nothing to compare" in result.problems[0]
    # Compared as a prefix (the run stopped early): the replay's start is no difference.
    assert not any("started" in p for p in result.problems), result.problems


def test_replay_of_a_live_recording_reports_a_line_it_cannot_apply(tmp_path: Path) -> None:
    closed = {"kind": "closed", "t": 1002.0, "clean": True}
    ghost = {"kind": "end", "t": 1001.0, "phase": "settled", "job": "999", "state": "DONE"}
    result = replay(write(tmp_path / "r.jsonl", SUBMIT, ghost, closed))
    assert result.problems[0].startswith("line 3: cannot apply: UnknownJob")
    # The start the replay made but the recording does not have is a difference too.
    assert "job 101: started on h1 1 in the replay, not live" in result.problems


# -- the record key ---------------------------------------------------------------------


def _config(tmp_path: Path, record: Any) -> live_config.LiveConfig:
    data = {
        "controller": {"state_dir": "state", **({} if record is None else {"record": record})},
        "cluster": {"hosts": {"h1": 1}},
    }
    return live_config.parse(data, tmp_path / "c.toml")


def test_record_key(tmp_path: Path) -> None:
    assert _config(tmp_path, None).record is None
    assert _config(tmp_path, "runs/one.jsonl").record == (tmp_path / "runs/one.jsonl").resolve()
    assert _config(tmp_path, "/abs/r.jsonl").record == Path("/abs/r.jsonl")
    for bad in (3, "", ["a"]):
        with pytest.raises(ConfigError, match=r"c\.toml: controller\.record: must be a file name"):
            _config(tmp_path, bad)
