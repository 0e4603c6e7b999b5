"""The ElastiSim reader's other inputs: configuration.json, the SimGrid platform (speed
and radical), where referenced files are looked up, and :func:`elastisim_inputs`.

A configuration that is present but broken is an error naming the file, never a silent
fall-back to the default machine; an absent one gives the defaults.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from xce_resize_plugin.simulation import elastisim
from xce_resize_plugin.simulation.traces import DEFAULT_NODE_FLOPS, TraceError, read_elastisim

SAMPLE = Path(__file__).resolve().parents[1] / "data" / "elastisim-sample"

# 4e11 flops per node: the run time is 4e11 / node speed.
MODEL: dict[str, object] = {"phases": [{"tasks": [{"type": "cpu", "flops": 4e11}]}]}


def job(model: str = "model.json") -> dict[str, object]:
    return {"type": "rigid", "submit_time": 0, "num_nodes": 2, "application_model": model}


def project(
    directory: Path,
    *,
    platform: str | None = None,
    jobs: list[dict[str, object]] | None = None,
) -> Path:
    """A jobs.json with one job and its model; with ``platform`` (the XML text), a
    configuration.json naming platform.xml as ElastiSim's example does."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "jobs.json").write_text(json.dumps({"jobs": jobs or [job()]}))
    (directory / "model.json").write_text(json.dumps(MODEL))
    if platform is not None:
        (directory / "platform.xml").write_text(platform)
        (directory / "configuration.json").write_text(
            json.dumps({"platform_file": "data/input/platform.xml"})
        )
    return directory / "jobs.json"


def cluster(speed: str | None = "100Gf", radical: str | None = "0-7") -> str:
    attributes = "".join(
        f' {key}="{value}"'
        for key, value in (("speed", speed), ("radical", radical))
        if value is not None
    )
    return f'<platform version="4.1"><cluster id="c" prefix="n"{attributes}/></platform>'


# --------------------------------------------------------------------------- configuration


def test_absent_configuration_gives_defaults_but_a_broken_one_is_an_error(
    tmp_path: Path,
) -> None:
    path = project(tmp_path)
    trace = read_elastisim(path)
    assert trace.header.max_nodes is None
    assert trace.jobs[0].runtime == pytest.approx(4e11 / DEFAULT_NODE_FLOPS)
    (tmp_path / "configuration.json").write_text("{")
    with pytest.raises(TraceError, match="not valid JSON") as info:
        read_elastisim(path)
    assert info.value.source == str(tmp_path / "configuration.json")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{", "configuration is not valid JSON"),
        ("", "configuration is not valid JSON"),
        ("[]", "configuration is not a JSON object"),
        ('"platform.xml"', "configuration is not a JSON object"),
        ('{"jobs_file": "jobs.json"}', "configuration has no 'platform_file'"),
        ('{"platform_file": 3}', "platform_file must be a path, not 3"),
        ('{"platform_file": null}', "platform_file must be a path, not None"),
        ('{"platform_file": "missing.xml"}', "platform_file 'missing.xml' not found"),
        ('{"platform_file": ""}', "platform_file '' not found"),
        ('{"platform_file": "data/input/"}', "platform_file 'data/input/' not found"),
    ],
)
def test_broken_configuration_names_the_file(tmp_path: Path, text: str, message: str) -> None:
    path = project(tmp_path, platform=cluster())
    conf = tmp_path / "configuration.json"
    conf.write_text(text)
    with pytest.raises(TraceError) as info:
        read_elastisim(path)
    assert info.value.source == str(conf)
    assert message in str(info.value)
    assert f"{conf}: {message}" in str(info.value)


def test_configuration_present_but_unreadable(tmp_path: Path) -> None:
    path = project(tmp_path, platform=cluster())
    conf = tmp_path / "configuration.json"
    conf.write_bytes(b'{"platform_file": "platform.xml", "x": "\xff"}')
    with pytest.raises(TraceError, match="not UTF-8") as info:
        read_elastisim(path)
    assert info.value.source == str(conf)
    # A directory or a dangling link of that name is a broken configuration, not none.
    conf.unlink()
    conf.mkdir()
    with pytest.raises(TraceError, match="cannot read configuration") as info:
        read_elastisim(path)
    assert info.value.source == str(conf)
    conf.rmdir()
    conf.symlink_to(tmp_path / "gone.json")
    with pytest.raises(TraceError, match="cannot read configuration") as info:
        read_elastisim(path)
    assert info.value.source == str(conf)


# --------------------------------------------------------------------------- speed


@pytest.mark.parametrize(
    ("speed", "flops"),
    [
        ("200gigaflops", 2e11),
        ("0.5teraflops", 5e11),
        ("4e2kiloflops", 4e5),
        ("250megaflops", 2.5e8),
        ("3zetaflops", 3e21),
        ("1Zf", 1e21),
        ("2Yf", 2e24),
        ("+2Gf", 2e9),
    ],
)
def test_speeds_simgrid_accepts(tmp_path: Path, speed: str, flops: float) -> None:
    trace = read_elastisim(project(tmp_path, platform=cluster(speed=speed)))
    assert trace.jobs[0].runtime == pytest.approx(4e11 / flops, rel=1e-12, abs=0)


@pytest.mark.parametrize(
    "speed",
    [
        "10GF",  # SimGrid's units are case-sensitive
        "100gf",
        "1MF",
        "100GFlops",
        "100Gflops",  # symbol prefix with the spelled-out unit
        "100gigaf",
        "100 Gf",  # SimGrid reads the unit right after the number
        "100Gf ",
        "fast",
        "",
        "0x10Gf",
        "1.2.3Gf",
        "nanGf",
        "-5Gf",
        "0Gf",
        "1e400Gf",
        "2Gf,1GF",  # every pstate must parse
        "2Gf,",
    ],
)
def test_speeds_simgrid_refuses_name_the_platform(tmp_path: Path, speed: str) -> None:
    path = project(tmp_path, platform=cluster(speed=speed))
    with pytest.raises(TraceError) as info:
        read_elastisim(path)
    assert info.value.source == str(tmp_path / "platform.xml")
    assert f"cluster speed {speed!r}" in str(info.value)


def test_pstates_take_the_first_trimmed(tmp_path: Path) -> None:
    trace = read_elastisim(project(tmp_path, platform=cluster(speed="2Gf, 1kiloflops ,5f")))
    assert trace.jobs[0].runtime == pytest.approx(200.0)
    (tmp_path / "platform.xml").write_text(cluster(speed="2Gf, 1 kf"))
    with pytest.raises(TraceError, match=r"cluster speed '2Gf, 1 kf': '1 kf' is not"):
        read_elastisim(tmp_path / "jobs.json")


@pytest.mark.parametrize(("missing", "attribute"), [("speed", "speed"), ("radical", "radical")])
def test_cluster_without_speed_or_radical(tmp_path: Path, missing: str, attribute: str) -> None:
    text = cluster(**{missing: None})
    path = project(tmp_path, platform=text)
    with pytest.raises(TraceError, match=f"the first <cluster> has no {attribute}") as info:
        read_elastisim(path)
    assert info.value.source == str(tmp_path / "platform.xml")


# --------------------------------------------------------------------------- radical


@pytest.mark.parametrize(
    ("radical", "message"),
    [
        ("5-1,0-9", "'5-1' is a descending range"),
        ("0-3,9-8", "'9-8' is a descending range"),
        ("-1-3", "is not a number or a range"),
        ("0--3", "is not a number or a range"),
        ("-2", "is not a number or a range"),
        ("0-3,", "'' is not a number or a range"),
        (",", "'' is not a number or a range"),
        ("", "'' is not a number or a range"),
        ("1-2-3", "is not a number or a range"),
        ("a-b", "is not a number or a range"),
        ("0-3,2-5", "node 2 is named twice"),
        ("3,3", "node 3 is named twice"),
        ("99999999999", "is above SimGrid's"),
        ("0-" + "9" * 5000, "is above SimGrid's"),
    ],
)
def test_bad_radicals_name_the_platform_and_radical(
    tmp_path: Path, radical: str, message: str
) -> None:
    path = project(tmp_path, platform=cluster(radical=radical))
    with pytest.raises(TraceError) as info:
        read_elastisim(path)
    assert info.value.source == str(tmp_path / "platform.xml")
    text = str(info.value)
    assert f"cluster radical {radical!r}" in text and message in text


def test_radical_ranges_in_any_order(tmp_path: Path) -> None:
    path = project(tmp_path, platform=cluster(radical="10-11, 8 ,0 - 3"))
    assert read_elastisim(path).header.max_nodes == 7
    (tmp_path / "platform.xml").write_text(cluster(radical="10-11,0-3,3"))
    with pytest.raises(TraceError, match="node 3 is named twice"):
        read_elastisim(path)


# --------------------------------------------------------------------------- lookup


def test_lookup_does_not_depend_on_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """References are read relative to the referring file, then by name beside it; a
    file at the same relative path under the working directory is not a candidate."""
    path = project(tmp_path / "proj", jobs=[job("data/input/model.json")], platform=cluster())
    decoy = tmp_path / "cwd" / "data" / "input"
    decoy.mkdir(parents=True)
    (decoy / "model.json").write_text(
        json.dumps({"phases": [{"tasks": [{"type": "idle", "delay": 1}]}]})
    )
    (decoy / "platform.xml").write_text(cluster(speed="1Gf", radical="0-1"))
    expected = read_elastisim(path)
    assert (expected.jobs[0].runtime, expected.header.max_nodes) == (4.0, 8)
    monkeypatch.chdir(tmp_path / "cwd")
    trace = read_elastisim(path)
    assert (trace.jobs[0].runtime, trace.header.max_nodes) == (4.0, 8)
    # From inside the project, given relative to it: the same files.
    monkeypatch.chdir(tmp_path / "proj")
    assert read_elastisim("jobs.json").jobs == expected.jobs


def test_lookup_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Relative to the referring file's directory before by name; an absolute path as
    given before by name; the working directory's file of that relative path never."""
    sub_model = {"phases": [{"tasks": [{"type": "idle", "delay": 7}]}]}
    other_model = {"phases": [{"tasks": [{"type": "idle", "delay": 9}]}]}
    path = project(tmp_path / "proj", jobs=[job("sub/model.json")])
    (tmp_path / "proj" / "sub").mkdir()
    (tmp_path / "proj" / "sub" / "model.json").write_text(json.dumps(sub_model))
    (tmp_path / "sub").mkdir()
    decoy = {"phases": [{"tasks": [{"type": "idle", "delay": 5}]}]}
    (tmp_path / "sub" / "model.json").write_text(json.dumps(decoy))
    monkeypatch.chdir(tmp_path)
    assert read_elastisim(path).jobs[0].runtime == 7.0
    other = tmp_path / "elsewhere" / "model.json"
    other.parent.mkdir()
    other.write_text(json.dumps(other_model))
    project(tmp_path / "proj", jobs=[job(str(other))])
    assert read_elastisim(path).jobs[0].runtime == 9.0
    other.unlink()  # the absolute path is gone: the file of that name beside jobs.json
    assert read_elastisim(path).jobs[0].runtime == 4e11 / DEFAULT_NODE_FLOPS


# --------------------------------------------------------------------------- inputs


def test_inputs_of_the_sample() -> None:
    assert elastisim.elastisim_inputs(SAMPLE / "jobs.json") == [
        SAMPLE / "jobs.json",
        SAMPLE / "configuration.json",
        SAMPLE / "crossbar.xml",
        SAMPLE / "application_model.json",
    ]


def test_inputs_list_models_once_in_order_of_first_mention(tmp_path: Path) -> None:
    refs = ["m2.json", "missing.json", "sub/m1.json", "m2.json", "data/input/m3.json", "m1.json"]
    path = project(tmp_path, jobs=[job(ref) for ref in refs])
    (tmp_path / "sub").mkdir()
    for name in ("m2.json", "sub/m1.json", "m3.json", "m1.json"):
        (tmp_path / name).write_text(json.dumps(MODEL))
    assert elastisim.elastisim_inputs(str(path)) == [
        path,
        tmp_path / "m2.json",
        tmp_path / "sub" / "m1.json",
        tmp_path / "m3.json",
        tmp_path / "m1.json",
    ]


def test_inputs_are_what_the_reader_reads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Recorded: every file the reader opens, in order, from a working directory holding
    decoys at the references' relative paths."""
    root = tmp_path / "proj"
    shutil.copytree(SAMPLE, root)
    decoys = tmp_path / "cwd" / "data" / "input"
    decoys.mkdir(parents=True)
    for name in ("crossbar.xml", "application_model.json"):
        shutil.copy(SAMPLE / name, decoys / name)
    monkeypatch.chdir(tmp_path / "cwd")
    read: list[Path] = []
    read_capped = elastisim.read_capped

    def recording_read(path: Path, limit: int, what: str = "the file") -> bytes:
        read.append(Path(path))
        return read_capped(path, limit, what)

    monkeypatch.setattr(elastisim, "read_capped", recording_read)
    read_elastisim(root / "jobs.json")
    monkeypatch.undo()
    monkeypatch.chdir(tmp_path / "cwd")
    assert elastisim.elastisim_inputs(root / "jobs.json") == read
    assert all(p.is_relative_to(root) for p in read) and len(read) == 4


def test_inputs_refuse_a_broken_configuration(tmp_path: Path) -> None:
    path = project(tmp_path, platform=cluster())
    assert elastisim.elastisim_inputs(path) == [
        path,
        tmp_path / "configuration.json",
        tmp_path / "platform.xml",
        tmp_path / "model.json",
    ]
    (tmp_path / "configuration.json").write_text('{"platform_file": "nowhere.xml"}')
    with pytest.raises(TraceError, match=r"'nowhere\.xml' not found") as info:
        elastisim.elastisim_inputs(path)
    assert info.value.source == str(tmp_path / "configuration.json")


# --------------------------------------------------------------------------- bounded reads


@pytest.mark.parametrize("which", ["jobs.json", "model.json", "configuration.json", "platform.xml"])
def test_every_file_of_a_project_is_read_with_a_bound(
    tmp_path: Path, which: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each file an ElastiSim project names was read whole (``/dev/zero`` behind the
    name never ended, a FIFO blocked): a regular file of bounded size, or an error
    naming it (docs/simulation.md, "Limits on inputs"; the limits lowered here)."""
    path = project(tmp_path, platform=cluster())
    target = tmp_path / which
    # Every file fits but the one made longer than the limit.
    limit = max(p.stat().st_size for p in tmp_path.iterdir()) + 50
    monkeypatch.setattr(elastisim, "MAX_JSON_BYTES", limit)
    monkeypatch.setattr(elastisim, "MAX_JOBS_FILE_BYTES", limit)
    target.write_text(target.read_text() + " " * limit)
    with pytest.raises(TraceError, match=f"larger than {limit:,} bytes") as info:
        read_elastisim(path)
    assert info.value.source == str(target)
    # The job file is read whatever it is (the others are looked up as files first).
    path.unlink()
    path.symlink_to("/dev/zero")
    with pytest.raises(TraceError, match="a device, not a regular file") as info:
        read_elastisim(path)
    assert info.value.source == str(path)
