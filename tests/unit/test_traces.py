"""Trace readers: SWF cleaning, the header, ElastiSim jobs, errors, and the real traces.

Tests on ``tests/data`` always run. Tests on the full traces use the ``real_traces``
fixture, which skips when ``<repo>/../shared/traces`` is absent (a fresh clone).
"""

from __future__ import annotations

import gzip
import io
import json
import math
import shutil
import time
from collections.abc import Mapping
from pathlib import Path

import pytest

from xce_resize_plugin.errors import ConfigError, ResizeError
from xce_resize_plugin.simulation.app_model import ExprError, ModelEvaluator, compile_expression
from xce_resize_plugin.simulation.traces import (
    DEFAULT_NODE_FLOPS,
    Trace,
    TraceError,
    TraceJob,
    read_elastisim,
    read_swf,
    read_trace,
)

DATA = Path(__file__).resolve().parents[1] / "data"
KTH_SAMPLE = DATA / "KTH-SP2-1996-2.1-cln-first200.swf.gz"
ELASTISIM_SAMPLE = DATA / "elastisim-sample"


@pytest.fixture
def real_traces() -> Path:
    """The shared real traces beside the repository, or skip."""
    traces = Path(__file__).resolve().parents[2].parent / "shared" / "traces"
    if not traces.is_dir():
        pytest.skip(f"real traces not present at {traces}")
    return traces


def swf_line(
    job: int,
    submit: int,
    *,
    wait: int = 10,
    run: float = 100,
    alloc: int = 4,
    req: int = 4,
    req_time: int = 600,
    status: int = 1,
    user: int = 7,
) -> str:
    fields = [job, submit, wait, run, alloc, -1, -1, req, req_time, -1, status, user]
    return " ".join(str(f) for f in fields) + " 1 -1 -1 -1 -1 -1\n"


def swf(*lines: str, header: str = "; Version: 2.2\n; MaxProcs: 64\n") -> io.StringIO:
    return io.StringIO(header + "".join(lines))


# ------------------------------------------------------------------------- SWF sample


def test_kth_sample_header() -> None:
    trace = read_swf(KTH_SAMPLE)
    h = trace.header
    assert h.format == "swf"
    assert h.version == "2.2"
    assert h.computer == "IBM SP2"
    assert h.installation == "Swedish Royal Institute of Technology (KTH)"
    assert h.acknowledge == "Lars Malinowsky"
    assert h.information == (
        "http://www.pdc.kth.se/",
        "http://www.cs.huji.ac.il/labs/parallel/workload/",
    )
    assert (h.max_procs, h.max_nodes, h.max_jobs, h.max_records) == (100, 100, 28490, 28476)
    assert h.unix_start_time == 843480031
    assert h.time_zone == 3600
    assert h.time_zone_string == "Europe/Stockholm"
    assert h.start_time == "Mon Sep 23 14:00:31 CEST 1996"
    assert h.notes[0] == "uses the EASY scheduler"
    # A continued Note keeps its continuation lines.
    assert h.notes[1].splitlines() == [
        "THIS IS A CLEANED VERSION OF THE LOG!",
        "The filter used to produce it was",
        "job<=14 (14 jobs removed)",
    ]
    assert h.get("preemption") == "No"
    assert h.get("nonexistent") is None
    assert h.submit_offset == 599850.0
    # "http:" in a continuation line is not a key.
    assert not h.get_all("http")


def test_kth_sample_jobs() -> None:
    trace = read_swf(KTH_SAMPLE)
    assert isinstance(trace, Trace)
    assert len(trace) == 200
    assert trace.stats["lines"] == 200
    assert trace.stats["jobs"] == 200
    first = trace.jobs[0]
    assert first == TraceJob(
        id="15",
        submit=0.0,
        runtime=3477.0,
        procs=4,
        requested_time=53940.0,
        user="12",
        kind="rigid",
        min_procs=None,
        max_procs=None,
        wait=192180.0,
        status=1,
    )
    assert trace.jobs[-1].id == "214"
    assert trace.jobs[-1].submit == 698561 - 599850
    submits = [j.submit for j in trace]
    assert submits == sorted(submits)
    assert all(1 <= j.procs <= 100 and j.runtime > 0 for j in trace)


def test_limit_is_a_prefix() -> None:
    full = read_swf(KTH_SAMPLE)
    part = read_swf(KTH_SAMPLE, limit=17)
    assert part.jobs == full.jobs[:17]
    assert part.stats["jobs"] == 17
    assert part.header == full.header
    assert len(read_swf(KTH_SAMPLE, limit=0)) == 0
    assert len(read_swf(KTH_SAMPLE, limit=10_000)) == 200


@pytest.mark.parametrize("limit", [-1, True])
def test_bad_limit(limit: int) -> None:
    with pytest.raises(TraceError, match="limit"):
        read_swf(KTH_SAMPLE, limit=limit)


def test_sources_plain_gzip_stream(tmp_path: Path) -> None:
    expected = read_swf(KTH_SAMPLE).jobs
    raw = KTH_SAMPLE.read_bytes()
    text = gzip.decompress(raw)
    plain = tmp_path / "kth.swf"
    plain.write_bytes(text)
    # gzip data under a plain name is found by its magic bytes.
    disguised = tmp_path / "kth-gz.swf"
    disguised.write_bytes(raw)
    assert read_swf(plain).jobs == expected
    assert read_swf(str(disguised)).jobs == expected
    assert read_swf(io.BytesIO(raw)).jobs == expected
    assert read_swf(io.BytesIO(text)).jobs == expected
    assert read_swf(io.StringIO(text.decode())).jobs == expected
    with KTH_SAMPLE.open("rb") as f:
        assert read_swf(f).jobs == expected
        assert not f.closed  # the caller's stream stays open


# --------------------------------------------------------------------- cleaning rules


def test_cleaning_rules_and_counters() -> None:
    trace = read_swf(
        swf(
            swf_line(1, 1000),
            swf_line(2, 1010, run=0),  # no run time
            swf_line(3, 1020, run=-1),  # unknown run time
            swf_line(4, 1030, req=-1, alloc=8),  # requested unknown -> allocated
            swf_line(5, 1040, req=-1, alloc=-1),  # no processors
            swf_line(6, 1050, req=0, alloc=0),  # no processors
            swf_line(7, 1060, req=100, alloc=100),  # above MaxProcs 64 -> capped
            swf_line(8, 1070, req_time=-1, wait=-1, status=-1, user=-1),
            swf_line(9, 1080, run=12.5),
        )
    )
    by_id = {j.id: j for j in trace}
    assert list(by_id) == ["1", "4", "7", "8", "9"]
    assert trace.stats == {
        "lines": 9,
        "jobs": 5,
        "skipped_runtime": 2,
        "skipped_procs": 2,
        "capped_procs": 1,
        "used_allocated_procs": 1,
        "no_requested_time": 1,
        "comment_lines": 0,
        "resorted": 0,
    }
    s = trace.stats
    assert s["lines"] == s["jobs"] + s["skipped_runtime"] + s["skipped_procs"]
    assert by_id["4"].procs == 8
    assert by_id["7"].procs == 64
    j8 = by_id["8"]
    assert (j8.requested_time, j8.wait, j8.status, j8.user) == (None, None, None, "unknown")
    assert by_id["9"].runtime == 12.5
    assert by_id["1"].submit == 0.0 and by_id["9"].submit == 80.0
    assert trace.header.submit_offset == 1000.0


def test_requested_procs_win_over_allocated() -> None:
    (job,) = read_swf(swf(swf_line(1, 0, req=16, alloc=32)))
    assert job.procs == 16


def test_no_max_procs_means_no_cap() -> None:
    trace = read_swf(swf(swf_line(1, 0, req=5000), header="; Version: 2.2\n"))
    assert trace.jobs[0].procs == 5000
    assert trace.stats["capped_procs"] == 0
    assert trace.header.max_procs is None


def test_skipped_first_line_moves_the_zero() -> None:
    trace = read_swf(swf(swf_line(1, 500, run=0), swf_line(2, 700), swf_line(3, 900)))
    assert [j.submit for j in trace] == [0.0, 200.0]
    assert trace.header.submit_offset == 700.0


def test_unsorted_input_is_sorted_stably() -> None:
    trace = read_swf(
        swf(
            swf_line(1, 100),
            swf_line(2, 50),
            swf_line(3, 100),
            swf_line(4, 20),
            swf_line(5, 50),
        )
    )
    assert [j.id for j in trace] == ["4", "2", "5", "1", "3"]
    assert [j.submit for j in trace] == [0.0, 30.0, 30.0, 80.0, 80.0]
    assert trace.stats["resorted"] == 1
    assert trace.header.submit_offset == 20.0


def test_blank_crlf_and_comment_lines() -> None:
    text = "; MaxProcs: 8\r\n\r\n" + swf_line(1, 0).replace("\n", "\r\n") + "\n   \n"
    text += "; a late comment\n" + swf_line(2, 5)
    trace = read_swf(io.StringIO(text))
    assert [j.id for j in trace] == ["1", "2"]
    assert trace.stats["comment_lines"] == 1
    assert trace.header.max_procs == 8


def test_empty_and_header_only() -> None:
    assert len(read_swf(io.StringIO(""))) == 0
    trace = read_swf(io.StringIO("; MaxProcs: 4\n"))
    assert len(trace) == 0
    assert trace.header.max_procs == 4
    assert trace.header.submit_offset == 0.0


def test_header_parsing_details() -> None:
    header = (
        "; Computer: IBM SP2\n"
        "; MaxNodes: 338 (batch partition; 512 total)\n"
        "; Information: http://a.example/\n"
        ";              http://b.example/\n"
        ";\n"
        "; Queue:  1 DSI\n"
        "; Queue:  2 astro\n"
        "; Partition:  1  DEFAULT\n"
        "; Note: first\n"
        ";       continued\n"
        "; Note: second\n"
        ";\n"
        ";       orphan text after a blank comment\n"
    )
    trace = read_swf(io.StringIO(header))
    h = trace.header
    assert h.max_nodes == 338
    assert h.information == ("http://a.example/", "http://b.example/")
    assert h.queues == ("1 DSI", "2 astro")
    assert h.partitions == ("1  DEFAULT",)
    assert h.notes == ("first\ncontinued", "second")
    assert h.get("COMPUTER") == "IBM SP2"
    assert [k for k, _ in h.fields] == [
        "Computer",
        "MaxNodes",
        "Information",
        "Queue",
        "Queue",
        "Partition",
        "Note",
        "Note",
    ]


# ------------------------------------------------------------------------------ errors


def test_wrong_field_count_names_file_and_line() -> None:
    data = swf(swf_line(1, 0), "1 2 3\n")
    data.name = "broken.swf"
    with pytest.raises(TraceError) as info:
        read_swf(data)
    err = info.value
    assert isinstance(err, ConfigError) and isinstance(err, ResizeError)
    assert err.source == "broken.swf"
    assert err.line == 4  # two header lines, then the data
    assert "broken.swf:4" in str(err)
    assert "3 fields" in str(err)


def test_non_numeric_field(tmp_path: Path) -> None:
    path = tmp_path / "bad.swf"
    path.write_text(swf_line(1, 0) + swf_line(2, 10).replace(" 100 ", " 1O0 ", 1))
    with pytest.raises(TraceError, match=r"bad\.swf:2: .*not a number"):
        read_swf(path)


@pytest.mark.parametrize(
    ("line", "says"),
    [
        (swf_line(2, 5).replace("2", "abc", 1), "field 1 (job number) 'abc'"),
        (swf_line(2, 5).replace("-1", "xyz", 1), "field 6 (average CPU time) 'xyz'"),
        (swf_line(2, 5).replace(" 7 ", " 1_0 ", 1), "field 12 (user id) '1_0'"),
        (swf_line(2, 5).replace(" 7 ", " \uff17 ", 1), "field 12 (user id) '\uff17'"),
        (swf_line(2, 5).replace(" 7 ", " 1e ", 1), "field 12 (user id) '1e'"),
        # A line the cleaning skips (run time 0) is still a line of the trace.
        (swf_line(2, 5, run=0).replace("-1", "junk", 1), "field 6 (average CPU time) 'junk'"),
    ],
)
def test_every_field_of_every_line_must_be_a_number(line: str, says: str) -> None:
    data = swf(swf_line(1, 0), line, swf_line(3, 9))
    data.name = "text.swf"
    with pytest.raises(TraceError) as info:
        read_swf(data)
    assert info.value.line == 4
    assert f"text.swf:4: malformed SWF data line ({says} is not a number)" in str(info.value)


def test_numbers_in_every_form_swf_writers_use_are_read() -> None:
    line = swf_line(2, 5).replace("-1", "-1.5e3", 1).replace(" 7 ", " +7 ", 1)
    trace = read_swf(swf(swf_line(1, 0), line.replace(" 600 ", " 600. ", 1)))
    assert [(j.user, j.requested_time) for j in trace] == [("7", 600), ("+7", 600.0)]


@pytest.mark.parametrize("submit", ["-1", "-5", "-0.5"])
def test_a_negative_submit_time_is_refused_not_made_the_start(submit: str) -> None:
    # Made the first job, -1 used to move every other job later by the trace's start.
    data = swf(swf_line(1, 1000), swf_line(2, 1010).replace(" 1010 ", f" {submit} ", 1))
    data.name = "neg.swf"
    with pytest.raises(TraceError) as info:
        read_swf(data)
    assert info.value.line == 4
    assert f"submit time {submit!r} is negative (SWF's -1: unknown)" in str(info.value)


def test_a_byte_order_mark_is_not_part_of_the_first_line(tmp_path: Path) -> None:
    path = tmp_path / "bom.swf"
    path.write_bytes(b"\xef\xbb\xbf" + (swf_line(1, 0) + swf_line(2, 5)).encode())
    assert [j.id for j in read_swf(path)] == ["1", "2"]


@pytest.mark.parametrize("damage", ["truncate", "scramble", "header"])
def test_corrupt_gzip(tmp_path: Path, damage: str) -> None:
    raw = bytearray(KTH_SAMPLE.read_bytes())
    if damage == "truncate":
        raw = raw[:500]
    elif damage == "scramble":
        raw[100:400] = bytes(range(256)) + bytes(44)
    else:
        raw[3] = 0xFF  # reserved flag bits set
    path = tmp_path / "bad.swf.gz"
    path.write_bytes(bytes(raw))
    with pytest.raises(TraceError, match="cannot read"):
        read_swf(path)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="cannot read"):
        read_swf(tmp_path / "nope.swf")


# ---------------------------------------------------------------------------- dispatch


def test_read_trace_dispatch(tmp_path: Path) -> None:
    assert read_trace(KTH_SAMPLE).header.format == "swf"
    plain = tmp_path / "x.SWF"
    plain.write_text(swf_line(1, 0))
    assert len(read_trace(plain)) == 1
    assert read_trace(ELASTISIM_SAMPLE / "jobs.json").header.format == "elastisim"
    assert len(read_trace(ELASTISIM_SAMPLE, limit=3)) == 3
    with pytest.raises(TraceError, match="unknown trace format"):
        read_trace(tmp_path / "x.csv")
    with pytest.raises(TraceError, match=r"jobs\.json"):
        read_trace(tmp_path)


# --------------------------------------------------------------------------- ElastiSim


def example_runtime(job: dict[str, object], nodes: int, flops: float) -> float:
    """Compute time of the example project's model, written out by hand."""
    args = job["arguments"]
    assert isinstance(args, dict)
    return float(args["iterations"] * args["flops"] / nodes ** args["alpha"] / flops)


def test_elastisim_sample() -> None:
    trace = read_elastisim(ELASTISIM_SAMPLE / "jobs.json")
    raw = json.loads((ELASTISIM_SAMPLE / "jobs.json").read_text())["jobs"]
    assert len(trace) == 36
    assert trace.stats == {
        "jobs": 36,
        "rigid": 15,
        "moldable": 13,
        "malleable": 6,
        "evolving": 1,
        "adaptive": 1,
        "default_model": 0,
        "capped_procs": 0,
        "resorted": 0,
    }
    h = trace.header
    assert (h.format, h.max_nodes, h.max_procs, h.computer) == ("elastisim", 128, 128, "Crossbar")
    assert h.submit_offset == raw[0]["submit_time"]
    for index, (job, src) in enumerate(zip(trace, raw, strict=True)):
        assert job.id == str(index)
        assert job.submit == src["submit_time"] - raw[0]["submit_time"]
        assert job.user == "elastisim"
        assert job.requested_time is None and job.wait is None and job.status is None
        if src["type"] == "rigid":
            assert job.kind == "rigid"
            assert job.procs == job.min_procs == job.max_procs == src["num_nodes"]
        else:
            expected = "moldable" if src["type"] == "moldable" else "malleable"
            assert job.kind == expected
            assert (job.min_procs, job.max_procs) == (src["num_nodes_min"], src["num_nodes_max"])
            assert job.procs == src["num_nodes_max"]
        # The 100 Gf node speed comes from crossbar.xml.
        assert job.runtime == pytest.approx(example_runtime(src, job.procs, 1e11), rel=1e-12)
    kinds = {src["type"]: job.kind for job, src in zip(trace, raw, strict=True)}
    assert kinds["evolving"] == kinds["adaptive"] == "malleable"


def test_elastisim_node_speed_and_default_model(tmp_path: Path) -> None:
    with_model = read_elastisim(ELASTISIM_SAMPLE / "jobs.json")
    faster = read_elastisim(ELASTISIM_SAMPLE / "jobs.json", node_flops=2e11)
    for a, b in zip(with_model, faster, strict=True):
        assert b.runtime == pytest.approx(a.runtime / 2)
    # jobs.json alone: no model file, no platform -> the example's model, 1e11 flop/s.
    shutil.copy(ELASTISIM_SAMPLE / "jobs.json", tmp_path / "jobs.json")
    alone = read_elastisim(tmp_path / "jobs.json")
    assert alone.stats["default_model"] == 36
    assert alone.header.max_nodes is None
    assert DEFAULT_NODE_FLOPS == 1e11
    for a, b in zip(with_model, alone, strict=True):
        assert b.runtime == pytest.approx(a.runtime, rel=1e-12)
    with pytest.raises(TraceError, match="node_flops"):
        read_elastisim(tmp_path / "jobs.json", node_flops=0)


def write_project(
    tmp_path: Path, jobs: list[dict[str, object]], model: Mapping[str, object] | None = None
) -> Path:
    (tmp_path / "jobs.json").write_text(json.dumps({"jobs": jobs}))
    if model is not None:
        (tmp_path / "model.json").write_text(json.dumps(model))
    return tmp_path / "jobs.json"


def rigid(submit: int = 0, nodes: int = 4, **extra: object) -> dict[str, object]:
    job: dict[str, object] = {
        "type": "rigid",
        "submit_time": submit,
        "num_nodes": nodes,
        "application_model": "model.json",
        "arguments": {"iterations": 2, "flops": 1e12, "alpha": 1.0},
    }
    job.update(extra)
    return job


def test_elastisim_model_task_types(tmp_path: Path) -> None:
    model = {
        "on_init": [{"type": "busy_wait", "delay": 5}],
        "on_reconfiguration": {"tasks": [{"type": "busy_wait", "delay": 1000}]},
        "phases": [
            {
                "iterations": "iterations",
                "tasks": [
                    {"type": "cpu", "flops": "flops", "computation_pattern": "total"},
                    {"type": "pfs_write", "bytes": 1e12, "pattern": "total"},
                    {"type": "gpu", "flops": 1e15, "computation_pattern": "uniform"},
                    {
                        "type": "sequence",
                        "iterations": 3,
                        "tasks": [
                            {"type": "idle", "delay": 2},
                            {"type": "cpu", "flops": [1e11, "2*1e11"], "iterations": 2},
                        ],
                    },
                ],
            },
            {"tasks": [{"type": "cpu", "flops": 1e11, "computation_pattern": "uniform"}]},
        ],
    }
    path = write_project(tmp_path, [rigid(nodes=4)], model)
    (job,) = read_elastisim(path, node_flops=1e11)
    # on_init 5 + 2 x (1e12/4/1e11 + 3 x (2 + 2 x 2)) + 1 x 1 = 5 + 2 x 20.5 + 1
    assert job.runtime == pytest.approx(47.0)


def test_elastisim_walltime_submit_order_and_limit(tmp_path: Path) -> None:
    path = write_project(
        tmp_path,
        [rigid(100, walltime=3600), rigid(40), rigid(100, walltime=0)],
        {"phases": [{"tasks": [{"type": "busy_wait", "delay": 60}]}]},
    )
    trace = read_elastisim(path)
    assert [j.id for j in trace] == ["1", "0", "2"]
    assert [j.submit for j in trace] == [0.0, 60.0, 60.0]
    assert trace.stats["resorted"] == 1
    assert trace.jobs[1].requested_time == 3600.0
    assert trace.jobs[2].requested_time is None
    assert [j.id for j in read_elastisim(path, limit=2)] == ["1", "0"]


def test_elastisim_caps_at_platform(tmp_path: Path) -> None:
    for name in ("configuration.json", "crossbar.xml"):
        shutil.copy(ELASTISIM_SAMPLE / name, tmp_path / name)
    job = rigid(nodes=4)
    del job["num_nodes"]
    job.update(type="malleable", num_nodes_min=100, num_nodes_max=200)
    path = write_project(tmp_path, [job], {"phases": [{"tasks": [{"type": "idle", "delay": 9}]}]})
    trace = read_elastisim(path)
    assert (trace.jobs[0].min_procs, trace.jobs[0].procs, trace.jobs[0].max_procs) == (
        100,
        128,
        128,
    )
    assert trace.stats["capped_procs"] == 1


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"type": None}, "missing required key 'type'"),
        ({"submit_time": None}, "missing required key 'submit_time'"),
        ({"application_model": None}, "missing required key 'application_model'"),
        ({"num_nodes": None}, "missing required key 'num_nodes'"),
        ({"type": "elastic"}, "unknown type 'elastic'"),
        ({"num_nodes": 0}, "num_nodes must be a positive integer"),
        ({"num_nodes": 2.5}, "num_nodes must be a positive integer"),
        ({"submit_time": -5}, "submit_time must be a non-negative number"),
        ({"submit_time": "soon"}, "submit_time must be a non-negative number"),
        ({"arguments": [1, 2]}, "arguments must be an object"),
        ({"application_model": 3}, "application_model must be a path"),
        ({"type": "moldable"}, "missing required key 'num_nodes_min'"),
        (
            {"type": "moldable", "num_nodes_min": 8, "num_nodes_max": 4},
            "num_nodes_min 8 > num_nodes_max 4",
        ),
        ({"arguments": {"flops": 1e12, "alpha": 1}}, "unknown variable 'iterations'"),
    ],
)
def test_elastisim_bad_job_names_index(
    tmp_path: Path, change: dict[str, object], message: str
) -> None:
    bad = rigid()
    for key, value in change.items():
        if value is None:
            del bad[key]
        else:
            bad[key] = value
    path = write_project(tmp_path, [rigid(), bad])  # no model file: the default model
    with pytest.raises(TraceError) as info:
        read_elastisim(path)
    assert info.value.job_index == 1
    assert "job 1" in str(info.value)
    assert message in str(info.value)


def test_elastisim_bad_files(tmp_path: Path) -> None:
    path = tmp_path / "jobs.json"
    path.write_text("{not json")
    with pytest.raises(TraceError, match="not valid JSON"):
        read_elastisim(path)
    path.write_text("[]")
    with pytest.raises(TraceError, match="'jobs' list"):
        read_elastisim(path)
    path = write_project(tmp_path, [rigid()], {"phases": [{"tasks": [{"type": "pfs_read"}]}]})
    with pytest.raises(TraceError, match="no compute time"):
        read_elastisim(path)
    (tmp_path / "model.json").write_text("{oops")
    with pytest.raises(TraceError, match="cannot read application model"):
        read_elastisim(path)
    with pytest.raises(TraceError, match="cannot read"):
        read_elastisim(tmp_path / "missing.json")


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("1 + 2 * 3", 7.0),
        ("(1 + 2) * 3", 9.0),
        ("2 ^ 3 ^ 2", 512.0),
        ("-2 ^ 2", -4.0),
        ("- -3", 3.0),
        ("7 % 4", 3.0),
        ("1e3 / 8", 125.0),
        (".5 + x", 2.5),
        ("flops/num_nodes^alpha", 1e12 / 16**0.5),
        ("  42  ", 42.0),
    ],
)
def test_expressions(text: str, value: float) -> None:
    env = {"x": 2.0, "flops": 1e12, "num_nodes": 16.0, "alpha": 0.5}
    assert compile_expression(text)(env) == pytest.approx(value)


@pytest.mark.parametrize("text", ["", "1 +", "(1", "1 2", "a ? b : c", "1 )", "#"])
def test_bad_expressions(text: str) -> None:
    with pytest.raises(ExprError):
        compile_expression(text)({"a": 1.0, "b": 2.0, "c": 3.0})


# ------------------------------------------------------------------------ real traces


def timed_read(path: Path) -> tuple[Trace, float]:
    t0 = time.perf_counter()
    trace = read_trace(path)
    return trace, time.perf_counter() - t0


def test_real_kth(real_traces: Path) -> None:
    trace, seconds = timed_read(real_traces / "KTH-SP2-1996-2.1-cln.swf.gz")
    print(f"KTH: {seconds:.2f} s, {trace.stats}")
    s = trace.stats
    # 28,476 records: 8 with run time <= 0 and 1 with no processors are dropped.
    assert (s["lines"], s["jobs"], s["skipped_runtime"], s["skipped_procs"]) == (
        28476,
        28467,
        8,
        1,
    )
    assert s["lines"] == s["jobs"] + s["skipped_runtime"] + s["skipped_procs"]
    assert s["capped_procs"] == s["resorted"] == 0
    assert trace.header.max_procs == 100
    assert trace.header.acknowledge == "Lars Malinowsky"
    # The sample in tests/data is this trace's first 200 jobs.
    assert read_swf(KTH_SAMPLE).jobs == trace.jobs[:200]


def test_real_ctc_uses_allocated_procs(real_traces: Path) -> None:
    trace, seconds = timed_read(real_traces / "CTC-SP2-1996-3.1-cln.swf.gz")
    print(f"CTC: {seconds:.2f} s, {trace.stats}")
    s = trace.stats
    assert (s["lines"], s["jobs"], s["skipped_runtime"]) == (77222, 77205, 17)
    assert s["used_allocated_procs"] == s["jobs"]  # requested procs are -1 everywhere
    assert trace.jobs[0].procs == 306  # field 5 of the first line
    assert max(j.procs for j in trace) <= 338


@pytest.mark.slow
def test_real_hpc2n_parses_everything(real_traces: Path) -> None:
    trace, seconds = timed_read(real_traces / "HPC2N-2002-2.2-cln.swf.gz")
    print(f"HPC2N: {seconds:.2f} s, {trace.stats}")
    assert trace.stats["lines"] == trace.stats["jobs"] == len(trace) == 202871
    assert trace.stats["used_allocated_procs"] == trace.stats["no_requested_time"] == 0
    assert trace.header.max_procs == 240
    # A third of the procs are odd: requested sizes are taken as they are.
    assert sum(j.procs % 2 for j in trace) > 0.3 * len(trace)


def test_real_nasa_has_no_estimates(real_traces: Path) -> None:
    trace, _ = timed_read(real_traces / "NASA-iPSC-1993-3.1-cln.swf.gz")
    assert (trace.stats["lines"], trace.stats["skipped_runtime"]) == (18239, 173)
    assert all(j.requested_time is None and j.wait is None for j in trace)


def test_real_elastisim_example(real_traces: Path) -> None:
    trace, _ = timed_read(real_traces / "elastisim" / "example-project" / "jobs.json")
    s = trace.stats
    assert (s["jobs"], s["rigid"], s["moldable"], s["malleable"]) == (500, 238, 163, 74)
    assert (s["evolving"], s["adaptive"], s["default_model"]) == (19, 6, 0)
    assert sum(j.kind == "malleable" for j in trace) == 74 + 19 + 6
    assert all(2 <= j.min_procs <= j.procs <= j.max_procs <= 16 for j in trace)  # type: ignore[operator]
    sample = read_elastisim(ELASTISIM_SAMPLE / "jobs.json")
    assert sample.jobs == trace.jobs[:36]


@pytest.mark.parametrize(
    ("model", "message"),
    [
        ({"phases": [{"tasks": [{"type": "cpu", "flops": "1/0"}]}]}, "flops '1/0'"),
        ({"phases": [{"tasks": [{"type": "cpu", "flops": "10^400"}]}]}, "flops '10^400'"),
        ({"phases": [{"tasks": [{"type": "cpu", "flops": "(-8)^0.5"}]}]}, "flops '(-8)^0.5'"),
        ({"phases": [{"tasks": [{"type": "cpu", "flops": "nope"}]}]}, "unknown variable 'nope'"),
        ({"phases": [{"tasks": [{"type": "cpu", "flops": True}]}]}, "flops is a boolean"),
        ({"phases": [{"tasks": [{"type": "cpu", "flops": {}}]}]}, "must be a number or an"),
        ({"phases": [{"iterations": [3], "tasks": []}]}, "phase iterations must be a number"),
        ({"phases": {"tasks": []}}, "no 'phases' list"),
        ({"phases": [7]}, "a phase is not an object"),
        ({"phases": [{"tasks": {"type": "cpu"}}]}, "'tasks' is not a list"),
        ({"phases": [{"tasks": ["cpu"]}]}, "a task is not an object"),
    ],
)
def test_elastisim_bad_models(tmp_path: Path, model: dict[str, object], message: str) -> None:
    path = write_project(tmp_path, [rigid()], model)
    with pytest.raises(TraceError, match="cannot derive a run time") as info:
        read_elastisim(path)
    assert message in str(info.value)
    assert info.value.job_index == 0


def test_elastisim_bad_structure(tmp_path: Path) -> None:
    path = write_project(tmp_path, [rigid(), "job"])  # type: ignore[list-item]
    with pytest.raises(TraceError, match="job 1: a job must be an object"):
        read_elastisim(path)
    path = write_project(tmp_path, [rigid()])
    (tmp_path / "model.json").write_text("[1, 2]")
    with pytest.raises(TraceError, match="application model is not an object"):
        read_elastisim(path)


def test_elastisim_platform_files(tmp_path: Path) -> None:
    model = {"phases": [{"tasks": [{"type": "cpu", "flops": 4e11}]}]}
    path = write_project(tmp_path, [rigid()], model)
    conf = tmp_path / "configuration.json"
    # A configuration that is there but unusable is an error naming it, not the defaults.
    for text in ("{broken", "[]", '{"platform_file": "missing.xml"}', '{"platform_file": 3}'):
        conf.write_text(text)
        with pytest.raises(TraceError, match=r"configuration\.json: "):
            read_elastisim(path)
    conf.write_text('{"platform_file": "data/input/platform.xml"}')
    platform = tmp_path / "platform.xml"
    platform.write_text("<platform><zone id='z'/></platform>")  # no cluster
    assert read_elastisim(path).header.max_nodes is None
    platform.write_text(
        "<platform><cluster id='c' radical='0-3,8,10-11' speed='2Gf,1Gf'/></platform>"
    )
    trace = read_elastisim(path)
    assert (trace.header.max_nodes, trace.header.computer) == (7, "c")
    assert trace.jobs[0].runtime == 200.0  # 4e11 flops at 2 Gf
    platform.write_text("<platform><cluster id='c' radical='0-3' speed='fast'/></platform>")
    with pytest.raises(TraceError, match=r"platform\.xml: cluster speed 'fast'"):
        read_elastisim(path)
    platform.write_text("<platform><cluster id='c' radical='a-b' speed='1Gf'/></platform>")
    with pytest.raises(TraceError, match=r"platform\.xml: cluster radical 'a-b'"):
        read_elastisim(path)
    platform.write_text("<platform><cluster")
    with pytest.raises(TraceError, match=r"platform\.xml: cannot read platform"):
        read_elastisim(path)


class _NoPeek(io.RawIOBase):
    """A binary stream that can neither peek nor seek, like a pipe."""

    def __init__(self, data: bytes) -> None:
        self._data = io.BytesIO(data)

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        chunk = self._data.read(len(buffer))
        buffer[: len(chunk)] = chunk
        return len(chunk)


def test_unseekable_streams() -> None:
    raw = KTH_SAMPLE.read_bytes()
    expected = read_swf(KTH_SAMPLE).jobs
    assert read_swf(_NoPeek(raw)).jobs == expected  # type: ignore[arg-type]
    assert read_swf(_NoPeek(gzip.decompress(raw))).jobs == expected  # type: ignore[arg-type]


def test_trace_repr_and_long_bad_line() -> None:
    trace = read_swf(KTH_SAMPLE, limit=2)
    assert repr(trace).startswith(f"Trace({str(KTH_SAMPLE)!r}, 2 jobs, stats=")
    with pytest.raises(TraceError, match=r"\.\.\.'$"):
        read_swf(io.StringIO("x " * 200))
    with pytest.raises(TraceError, match="submit time is not finite"):
        read_swf(io.StringIO(swf_line(1, 0).replace(" 0 ", " nan ", 1)))


# ------------------------------------------------------------- hostile or nonsense input


@pytest.mark.parametrize(
    ("line", "says"),
    [
        (swf_line(2, 5, run=math.inf), "run time 'inf'"),
        (swf_line(2, 5, run=1e300), "run time '1e+300'"),
        (swf_line(2, 5, run=2e10), "run time '20000000000.0'"),
        (swf_line(2, 5).replace(" 600 ", " inf ", 1), "requested time 'inf'"),
        (swf_line(2, 5).replace(" 600 ", " 1e300 ", 1), "requested time '1e300'"),
        (swf_line(2, 5).replace(" 5 ", " 1e300 ", 1), "submit time '1e300'"),
        (swf_line(2, 5).replace(" 5 ", " -1e300 ", 1), "submit time '-1e300'"),
    ],
)
def test_times_that_are_infinite_or_beyond_any_machine_name_the_line(line: str, says: str) -> None:
    data = swf(swf_line(1, 0), line)
    data.name = "odd.swf"
    with pytest.raises(TraceError) as info:
        read_swf(data)
    assert info.value.line == 4
    assert "odd.swf:4" in str(info.value) and says in str(info.value)


def test_large_but_possible_times_are_kept() -> None:
    # 2^31 - 1 s, the "unlimited" request of some logs, and an absolute Unix submit time.
    trace = read_swf(swf(swf_line(1, 1_700_000_000, req_time=2**31 - 1, run=9e9)))
    assert (trace.jobs[0].requested_time, trace.jobs[0].runtime) == (2**31 - 1, 9e9)


def test_a_repeated_job_id_names_both_lines() -> None:
    data = swf(swf_line(1, 0), swf_line(2, 5), swf_line(1, 9))
    data.name = "dup.swf"
    with pytest.raises(TraceError) as info:
        read_swf(data)
    assert info.value.line == 5
    assert "dup.swf:5: job id '1' is already on line 3" in str(info.value)
    # A skipped line does not hold its id: the job that runs is the one kept.
    trace = read_swf(swf(swf_line(1, 0, run=0), swf_line(1, 5)))
    assert [j.id for j in trace] == ["1"]


@pytest.mark.parametrize("value", ["-1", "0", "abc", "1e3", "2.5", ""])
def test_a_max_procs_that_is_not_a_positive_integer_is_an_error(value: str) -> None:
    data = swf(swf_line(1, 0), header=f"; Version: 2.2\n; MaxProcs: {value}\n")
    data.name = "odd.swf"
    with pytest.raises(TraceError, match=r"odd\.swf: header MaxProcs .* is not a positive integer"):
        read_swf(data)


def test_max_procs_may_carry_a_comment() -> None:
    trace = read_swf(swf(swf_line(1, 0), header="; MaxProcs: 338 (batch partition)\n"))
    assert trace.header.max_procs == 338


BIG_INT = 10**400  # json reads it as an int that no float can hold


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"submit_time": math.nan}, "submit_time must be"),
        ({"submit_time": math.inf}, "submit_time must be"),
        ({"submit_time": 1e300}, "submit_time must be"),
        ({"submit_time": BIG_INT}, "submit_time must be"),
        ({"walltime": math.inf}, "walltime must be"),
        ({"walltime": BIG_INT}, "walltime must be"),
        ({"num_gpus_per_node": BIG_INT}, "num_gpus_per_node"),
        ({"arguments": {"iterations": 2, "flops": BIG_INT, "alpha": 1}}, "argument 'flops'"),
        ({"arguments": {"iterations": 2, "flops": 1e300, "alpha": 1}}, "run time above"),
    ],
)
def test_elastisim_numbers_beyond_reason_name_the_job(
    tmp_path: Path, change: dict[str, object], message: str
) -> None:
    path = write_project(tmp_path, [rigid(), rigid(**change)])
    with pytest.raises(TraceError) as info:
        read_elastisim(path)
    assert info.value.job_index == 1 and message in str(info.value)


def test_elastisim_nan_walltime_is_no_request(tmp_path: Path) -> None:
    trace = read_elastisim(write_project(tmp_path, [rigid(walltime=math.nan)]))
    assert trace.jobs[0].requested_time is None


def test_elastisim_files_nested_too_deeply(tmp_path: Path) -> None:
    path = tmp_path / "jobs.json"
    path.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(TraceError, match="not valid JSON"):
        read_elastisim(path)
    # Sequences in sequences: each is read, but walking them overflows the stack.
    deep = '{"type": "cpu", "flops": 1e12}'
    for _ in range(450):
        deep = '{"type": "sequence", "tasks": [' + deep + "]}"
    path = write_project(tmp_path, [rigid()])
    (tmp_path / "model.json").write_text('{"phases": [{"tasks": [' + deep + "]}]}")
    with pytest.raises(TraceError, match="cannot derive a run time"):
        read_elastisim(path)
    (tmp_path / "model.json").write_text('{"phases": ' + "[" * 100_000 + "]" * 100_000 + "}")
    with pytest.raises(TraceError, match="cannot read application model"):
        read_elastisim(path)


@pytest.mark.parametrize(
    "text", ["(" * 5000 + "1" + ")" * 5000, "-" * 5000 + "1", "+".join(["1"] * 5000)]
)
def test_expressions_nested_too_deeply(text: str) -> None:
    evaluator = ModelEvaluator(1.0)
    with pytest.raises(ExprError):
        evaluator.value(text, {}, "flops")


@pytest.mark.parametrize("raw", [BIG_INT, math.inf, math.nan], ids=["big-int", "inf", "nan"])
def test_model_numbers_must_be_finite(raw: float) -> None:
    with pytest.raises(ExprError, match="flops"):
        ModelEvaluator(1.0).value(raw, {}, "flops")


@pytest.mark.parametrize(
    ("line", "says"),
    [
        (swf_line(2, 5).replace("2", "nan", 1), "field 1 (job number) 'nan' is not a number"),
        (swf_line(2, 5).replace(" -1\n", " inf\n"), "field 18 (think time) 'inf' is not a number"),
        (
            swf_line(2, 5).replace("2", "99.5", 1),
            "field 1 (job number) '99.5' is not a whole number",
        ),
        (swf_line(2, 5).replace("2", "1e3", 1), "field 1 (job number) '1e3' is not a whole number"),
        (
            swf_line(2, 5, req=4).replace(" 4 600 ", " 4.5 600 ", 1),
            "field 8 (requested processors) '4.5' is not a whole number",
        ),
        (
            swf_line(2, 5, req=4).replace(" 4 600 ", " 1e9 600 ", 1),
            "field 8 (requested processors) '1e9' is not a whole number",
        ),
        (
            swf_line(2, 5, status=1).replace(" 600 -1 1 ", " 600 -1 1.0 ", 1),
            "field 11 (status) '1.0' is not a whole number",
        ),
        (
            swf_line(2, 5, req=4).replace(" 4 600 ", " " + "4" * 5000 + " 600 ", 1),
            "field 8 (requested processors) has 5,000 digits",
        ),
        # Read although the request is used: every count is whole.
        (
            swf_line(2, 5, alloc=4).replace(" 100 4 ", " 100 4.5 ", 1),
            "field 5 (allocated processors) '4.5' is not a whole number",
        ),
        # The first field the reader converts is named (the request, then the
        # allocation, then the status), not another odd one of the line.
        (
            swf_line(2, 5, req=4, status=1).replace(" 4 600 -1 1 ", " 4.5 600 -1 1.0 ", 1),
            "field 8 (requested processors) '4.5' is not a whole number",
        ),
    ],
)
def test_counts_are_whole_numbers_and_only_times_may_be_infinite(line: str, says: str) -> None:
    data = swf(swf_line(1, 0), line)
    data.name = "t.swf"
    with pytest.raises(TraceError) as info:
        read_swf(data)
    assert info.value.line == 4
    assert f"t.swf:4: malformed SWF data line ({says})" in str(info.value)


def test_a_job_number_of_thousands_of_digits_is_read_by_value() -> None:
    long = "0" + "1" * 4400
    trace = read_swf(swf(swf_line(1, 0).replace("1", long, 1)))
    assert [j.id for j in trace] == [long]
    twice = swf(swf_line(1, 0).replace("1", long, 1), swf_line(2, 1).replace("2", long[1:], 1))
    with pytest.raises(TraceError, match="is already on line 3"):
        read_swf(twice)


def test_a_job_number_written_twice_in_two_forms_is_caught() -> None:
    data = swf(swf_line(100, 0), swf_line(1, 2).replace("1", "0100", 1))
    with pytest.raises(TraceError, match="job id '0100' is already on line 3"):
        read_swf(data)


def test_a_nan_requested_time_is_counted_as_unknown() -> None:
    trace = read_swf(swf(swf_line(1, 0, req_time=600).replace(" 600 ", " nan ", 1)))
    assert [j.requested_time for j in trace] == [None]
    assert trace.stats["no_requested_time"] == 1
