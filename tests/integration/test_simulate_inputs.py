"""``xce-resize simulate`` (and ``sweep``) input errors: each is one line naming the
option, or the file and the key, exit 2, and found before any run (docs/simulation.md).

A fixture replaces the runs with a function that fails the test, so an error that
shows only after them (or a run that should not have started) is a failure here.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from xce_resize_plugin.cli import simulate as cli_simulate
from xce_resize_plugin.cli.main import main
from xce_resize_plugin.simulation import simulate as simulate_mod
from xce_resize_plugin.simulation import sweep as sweep_mod

DATA = Path(__file__).resolve().parents[1] / "data"
KTH = DATA / "KTH-SP2-1996-2.1-cln-first200.swf.gz"
PNG = b"\x89PNG\r\n\x1a\n"
linux_proc = pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="writes under /proc")


@pytest.fixture
def no_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> object:
        raise AssertionError("a run was made")

    monkeypatch.setattr(cli_simulate, "simulate", refuse)
    monkeypatch.setattr(simulate_mod, "run_mode", refuse)
    monkeypatch.setattr(sweep_mod, "run_one", refuse)


def refused(capsys: pytest.CaptureFixture[str], *argv: str | Path) -> str:
    """Run the command, which must stop with exit 2 and one line on stderr: the line."""
    assert main([str(a) for a in argv]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1, captured.err
    return lines[0]


def _sim(*args: str | Path) -> list[str | Path]:
    return ["simulate", KTH, "--limit", "20", "--sequential", "-q", *args]


def _sweep_file(tmp_path: Path, simulate_table: str) -> Path:
    path = tmp_path / "sweep.toml"
    path.write_text(
        f"[sweep]\nworkloads = ['{KTH}']\nmalleable_fractions = [0.5]\n"
        f"[simulate]\nlimit = 20\n{simulate_table}\n",
        encoding="utf-8",
    )
    return path


# -- --plot ------------------------------------------------------------------------------


@pytest.mark.usefixtures("no_runs")
def test_a_plot_format_matplotlib_lacks_is_refused_before_the_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("matplotlib")
    out = tmp_path / "out.xyz"
    line = refused(capsys, *_sim("--plot", out, "--json", tmp_path / "r.json"))
    assert line.startswith(f"xce-resize: Usage error: --plot {out}: matplotlib writes no 'xyz'")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.usefixtures("no_runs")
@pytest.mark.skipif(shutil.which("xelatex") is not None, reason="xelatex can write .pgf")
def test_a_plot_format_matplotlib_cannot_write_here_is_refused_before_the_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("matplotlib")
    out = tmp_path / "out.pgf"
    line = refused(capsys, *_sim("--plot", out))
    assert f"--plot {out}: matplotlib cannot write a 'pgf' image (" in line
    assert list(tmp_path.iterdir()) == []


def test_a_plot_name_without_a_suffix_is_written_as_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """matplotlib adds ``.png`` to a name without a suffix: the user's ``out`` would not
    exist afterwards. Both commands write exactly the name given, as a PNG."""
    pytest.importorskip("matplotlib")
    out = tmp_path / "out"
    assert main([str(a) for a in _sim("--plot", out)]) == 0
    config = _sweep_file(tmp_path, "")
    swept = tmp_path / "swept"
    argv = ["sweep", str(config), "--workers", "1", "--no-cache", "-q", "--plot", str(swept)]
    assert main(argv) == 0
    capsys.readouterr()
    assert out.read_bytes()[:8] == PNG and swept.read_bytes()[:8] == PNG
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "sweep.toml", "swept"]


# -- every other option --------------------------------------------------------------------


@pytest.mark.usefixtures("no_runs")
@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        # (A number that is no plain decimal, -1, nan, 1e309, is argparse's usage error:
        # tests/unit/test_decimal_text.py.)
        ("--slots-per-host", "0", "slots per host must be a positive integer, not 0"),
        ("--malleable-fraction", "1.5", "malleable fraction must be between 0 and 1"),
        ("--driver", "ñ", "unknown driver 'ñ'"),
        ("--speedup", "amdahl:2", "serial fraction must be between 0 and 1"),
        ("--speedup", "gust", "unknown speedup model 'gust'"),
        ("--speedup", "amdahl:cost=inf", "speedup option 'cost' must be finite"),
        # A ZeroDivisionError in the runs: hours x 3600 is no float.
        ("--host-failures", "1e305", "MTBF_HOURS must be between 1/3600"),
        # Failures and repairs that do not advance the clock: the run never ended.
        ("--host-failures", "1:1e-300", "REPAIR_HOURS must be between 1/3600"),
        ("--host-failures", "\uff11", "MTBF_HOURS must be a number, got '\uff11'"),  # fullwidth 1
        ("--host-failures", "nan", "MTBF_HOURS must be a number, got 'nan'"),
        ("--host-failures", "0", "MTBF_HOURS must be a positive finite number"),
    ],
)
def test_a_bad_option_value_names_the_option(
    option: str, value: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    line = refused(capsys, *_sim(option, value))
    assert line.startswith(f"xce-resize: Configuration error: {option}: {message}"), line


@pytest.mark.usefixtures("no_runs")
@pytest.mark.parametrize("workload", [[KTH], ["--synthetic", "lublin:jobs=3,procs=8"]])
@pytest.mark.parametrize("limit", ["0", "000"])
def test_a_limit_below_1_names_the_option(
    workload: list[str | Path], limit: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--limit 0`` said "the trace has no job to simulate", naming neither the option
    nor its value (-1 is argparse's: tests/unit/test_decimal_text.py)."""
    out = tmp_path / "out.json"
    line = refused(capsys, "simulate", *workload, "--limit", limit, "--json", out, "-q")
    said = "--limit: limit must be a positive integer, not 0"
    assert line == f"xce-resize: Configuration error: {said}"
    assert list(tmp_path.iterdir()) == []  # nothing written, not even tried


@linux_proc
@pytest.mark.usefixtures("no_runs")
@pytest.mark.parametrize(
    ("option", "name"),
    [
        ("--json", "out.json"),
        ("--plot", "out.png"),
        ("--record", "rec.jsonl"),
        ("--jobs-out", "jobs.csv"),
        ("--save-swf", "jobs.swf"),
    ],
)
def test_an_output_that_cannot_be_created_is_refused_before_the_runs(
    option: str, name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """/proc is a directory in which no file can be made, even by root (for whom a
    read-only directory's mode is no obstacle): the write failed after the runs."""
    if option == "--plot":
        pytest.importorskip("matplotlib")
    target = f"/proc/xce-resize-test-{name}"
    argv: list[str | Path] = _sim(option, target)
    if option == "--save-swf":
        argv = ["simulate", "--synthetic", "lublin:jobs=10,procs=8", option, target]
    line = refused(capsys, *argv)
    assert line.startswith(f"xce-resize: Usage error: {option} {target}: cannot write ("), line


@pytest.mark.usefixtures("no_runs")
@pytest.mark.parametrize(
    ("argv", "option"),
    [
        (_sim("--json", "{d}/out.json/"), "--json"),
        (_sim("--plot", "{d}/out.png/"), "--plot"),
        (_sim("--record", "{d}/rec.jsonl/"), "--record"),
        (_sim("--jobs-out", "{d}/jobs.csv/."), "--jobs-out"),
        (
            ["simulate", "--synthetic", "lublin:jobs=9,procs=8", "--save-swf", "{d}/j.swf/"],
            "--save-swf",
        ),
        (["sweep", "{d}/s.toml", "--json", "{d}/out.json/"], "--json"),
        (["sweep", "{d}/s.toml", "--plot", "{d}/out.png/"], "--plot"),
        (["scenario", "run", "{d}/s.toml", "--record", "{d}/rec.jsonl/"], "--record"),
    ],
)
def test_an_output_name_ending_in_a_slash_is_refused_before_anything_runs(
    tmp_path: Path, argv: list[str | Path], option: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """``Path("out.json/")`` is ``out.json``: the early check tried another name than
    the one given, and the runs went on to fail at the end (``--json``) or wrote a
    file of another name (``--record``, ``--plot``, ``--jobs-out``)."""
    args = [str(a).replace("{d}", str(tmp_path)) for a in argv]
    try:
        code = main(args)
    except SystemExit as exc:  # argparse's one line for an option's value
        code = int(exc.code or 0)
    captured = capsys.readouterr()
    assert code == 2, captured.err
    assert captured.out == "" and captured.err.count("\n") == 1, captured.err
    assert option in captured.err and "names a directory (it ends in '/')" in captured.err
    assert list(tmp_path.iterdir()) == []


def test_a_fifo_output_is_not_tried_before_the_runs(tmp_path: Path) -> None:
    """Trying a FIFO by opening it would give its reader an end of file before the
    results, and the real write would then wait for a reader forever."""
    fifo = tmp_path / "results"
    os.mkfifo(fifo)
    got: list[bytes] = []

    def read() -> None:
        with open(fifo, "rb") as fh:
            got.append(fh.read())

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    argv = [sys.executable, "-m", "xce_resize_plugin", *map(str, _sim("--json", fifo))]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    finally:
        if reader.is_alive():  # unblock a reader that still waits for a writer
            with open(fifo, "wb"):
                pass
    reader.join(5)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(got[0])["options"]["limit"] == 20


@pytest.mark.usefixtures("no_runs")
@pytest.mark.parametrize(
    "extra",
    [["--json", "out.json"], ["--limit", "5"], ["--host-failures", "5"], ["--sequential"]],
)
def test_replay_refuses_the_options_it_would_ignore(
    extra: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    line = refused(capsys, "simulate", "--replay", "run.jsonl", *extra)
    assert line.startswith(f"xce-resize: Usage error: --replay takes no {extra[0]}"), line


# -- the configuration file and the sweep file ----------------------------------------------


@pytest.mark.usefixtures("no_runs")
@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('host_failures = "soon"', "[simulate] host_failures: MTBF_HOURS must be a number"),
        ('host_failures = "1e305"', "[simulate] host_failures: MTBF_HOURS must be between"),
        ('speedup = "gust"', "[simulate] speedup: unknown speedup model 'gust'"),
        ('speedup = "amdahl:x"', "[simulate] speedup: speedup option 's' is not a number"),
        ("slots_per_host = 0", "[simulate] slots_per_host: slots per host must be"),
        ("malleable_fraction = 2", "[simulate] malleable_fraction: malleable fraction must"),
        ('driver = "fast"', "[simulate] driver: unknown driver 'fast'"),
        ("grow_cooldown = -1", "[simulate] grow_cooldown: grow_cooldown must be"),
        ("max_factor = inf", "[simulate] max_factor: max factor must be"),
        # Checked although --limit 20 overrides it.
        ("limit = -1", "[simulate] limit: limit must be a positive integer"),
        ("limit = 0", "[simulate] limit: limit must be a positive integer, not 0"),
        # As --seed reads it: a seed of the file can be given on the command line.
        ("seed = 99999999999999999999", "[simulate] seed: seed must have at most 19 digits"),
        ("[resize]\nbogus = 1", "[resize]: unknown key 'bogus'"),
        ('[resize]\npolicy_files = ["nope.py"]', "policy file "),
    ],
)
def test_a_bad_config_value_names_the_file_and_the_key(
    tmp_path: Path, line: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "sim.toml"
    table = "" if line.startswith("[") else "[simulate]\n"
    config.write_text(f"{table}{line}\n", encoding="utf-8")
    got = refused(capsys, *_sim("--config", config))
    assert got.startswith(f"xce-resize: Configuration error: {config}: {message}"), got


@pytest.mark.usefixtures("no_runs")
@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('host_failures = "soon"', "[simulate] host_failures: MTBF_HOURS must be a number"),
        ('speedup = "gust"', "[simulate] speedup: unknown speedup model 'gust'"),
        ("slots_per_host = 0", "[simulate] slots_per_host: slots per host must be"),
    ],
)
def test_a_bad_sweep_simulate_value_names_the_file_and_the_key(
    tmp_path: Path, line: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    config = _sweep_file(tmp_path, line)
    got = refused(capsys, "sweep", config, "--no-cache", "--workers", "1")
    assert got.startswith(f"xce-resize: Configuration error: {config}: {message}"), got
    assert "--host-failures" not in got


def test_the_json_shows_the_host_failures_simulated(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(a) for a in _sim("--host-failures", "2.0000004", "--json", "-")]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["options"]["host_failures"] == "2.0000004:1"


@pytest.mark.parametrize(
    ("line", "spec"), [("200", "200:1"), ("0.5", "0.5:1"), ('"200:2"', "200:2")]
)
def test_host_failures_in_a_config_file_may_be_a_number(
    tmp_path: Path, line: str, spec: str
) -> None:
    from xce_resize_plugin.simulation.simulate import load_options

    config = tmp_path / "sim.toml"
    config.write_text(f"[simulate]\nhost_failures = {line}\n", encoding="utf-8")
    failures = load_options(config).host_failures
    assert failures is not None and failures.spec() == spec


@pytest.mark.usefixtures("no_runs")
@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("host_failures = nan", "[simulate] host_failures: MTBF_HOURS must be a number"),
        ("host_failures = true", "[simulate] host_failures must be str or int or float"),
        ("host_failures = -3", "[simulate] host_failures: MTBF_HOURS must be a positive"),
    ],
)
def test_a_bad_numeric_host_failures_names_the_file_and_the_key(
    tmp_path: Path, line: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "sim.toml"
    config.write_text(f"[simulate]\n{line}\n", encoding="utf-8")
    got = refused(capsys, *_sim("--config", config))
    assert got.startswith(f"xce-resize: Configuration error: {config}: {message}"), got


# -- --replay: the policy files a recording names ------------------------------------------


def _recording_naming(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[Path, Path]:
    """A real recording whose header names ``evil.py`` beside it (as one received in a
    tarball would), and the marker file that policy file makes when it runs."""
    rec = tmp_path / "run.jsonl"
    assert main([str(a) for a in _sim("--record", rec)]) == 0
    capsys.readouterr()
    marker = tmp_path / "PWNED"
    (tmp_path / "evil.py").write_text(
        f"import pathlib\npathlib.Path({str(marker)!r}).write_text('ran')\n"
    )
    lines = rec.read_text(encoding="utf-8").splitlines()
    header = json.loads(lines[0])
    header["config"]["policy_files"] = ["evil.py"]  # relative: beside the recording
    rec.write_text("\n".join([json.dumps(header), *lines[1:]]) + "\n", encoding="utf-8")
    return rec, marker


def test_a_replay_loads_no_policy_file_the_recording_names(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A recording is data: replaying one ran the Python files its header names."""
    rec, marker = _recording_naming(tmp_path, capsys)
    line = refused(capsys, "simulate", "--replay", rec, "-q")
    assert line.startswith(f"xce-resize: Recording error: {rec}: its controller ran the policy"), (
        line
    )
    assert "evil.py" in line and "--policy FILE" in line and "--trust-policy-files" in line
    assert not marker.exists()


@pytest.mark.parametrize("opt_in", [["--trust-policy-files"], ["--policy", "{d}/evil.py"]])
def test_a_replay_loads_the_policy_files_the_user_names(
    tmp_path: Path, opt_in: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    rec, marker = _recording_naming(tmp_path, capsys)
    extra = [a.replace("{d}", str(tmp_path)) for a in opt_in]
    assert main(["simulate", "--replay", str(rec), "-q", *extra]) == 0
    assert capsys.readouterr().out.splitlines()[0].endswith("identical")
    assert marker.read_text() == "ran"


@pytest.mark.usefixtures("no_runs")
@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["simulate", "--replay", "r.jsonl", "--policy", "p.py", "--trust-policy-files"],
            "Usage error: give either --policy FILE or --trust-policy-files, not both",
        ),
        ([*_sim("--policy", "p.py")], "Usage error: --policy is for --replay"),
        ([*_sim("--trust-policy-files")], "Usage error: --trust-policy-files is for --replay"),
    ],
)
def test_policy_options_are_refused_where_they_mean_nothing(
    argv: list[str | Path], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert refused(capsys, *argv).startswith(f"xce-resize: {message}")


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("estimate", -1, "submit: estimate must be seconds (a number >= 0) or null, got -1"),
        ("start_tasks", 10**9, "submit: start_tasks must be within the job's tasks"),
        ("t", -5, "submit: t must be the controller's clock (a number from 0 to 1e+10 s)"),
    ],
)
def test_a_replay_refuses_a_value_out_of_range_naming_file_line_and_field(
    tmp_path: Path, field: str, value: int, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """It was applied, and the replay said DIFFERENT (exit 1): a bad input is exit 2."""
    rec = tmp_path / "run.jsonl"
    assert main([str(a) for a in _sim("--record", rec)]) == 0
    capsys.readouterr()
    lines = rec.read_text(encoding="utf-8").splitlines()
    n = next(i for i, line in enumerate(lines) if json.loads(line)["kind"] == "submit")
    lines[n] = json.dumps({**json.loads(lines[n]), field: value})
    rec.write_text("\n".join(lines) + "\n", encoding="utf-8")
    line = refused(capsys, "simulate", "--replay", rec, "-q")
    assert line.startswith(f"xce-resize: Recording error: {rec}:{n + 1}: {message}"), line


# -- what is read: no endless line, no device, no FIFO --------------------------------------


def _huge(tmp_path: Path, command: str) -> list[str | Path]:
    """A ``--replay`` recording or a ``scenario run`` file over the (lowered) limit."""
    if command == "replay":
        path = tmp_path / "r.jsonl"
        header = {"kind": "header", "format": "xce-resize-recording", "version": 1, "hosts": []}
        path.write_text(json.dumps(header) + "\n" + "x" * 300 + "\n", encoding="utf-8")
        return ["simulate", "--replay", path, "-q"]
    path = tmp_path / "s.toml"
    path.write_text("[cluster]\nhosts = { a = 2 }\n" + "# x\n" * 100, encoding="utf-8")
    return ["scenario", "run", path]


@pytest.mark.parametrize(
    ("command", "message"),
    [
        ("replay", "r.jsonl:2: a line longer than 200 characters (no recorder writes one)"),
        ("scenario", "s.toml: cannot read: the file is larger than 200 bytes, the most it may be"),
    ],
)
def test_a_line_or_file_beyond_the_limit_is_refused(
    tmp_path: Path,
    command: str,
    message: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """An endless line (a file without line breaks) was read into memory whole: a
    MemoryError traceback. The limits are lowered here to keep the test small."""
    from xce_resize_plugin.recording import format as recording_format
    from xce_resize_plugin.scenarios import files as scenario_files

    monkeypatch.setattr(recording_format, "MAX_LINE_CHARS", 200)
    monkeypatch.setattr(scenario_files, "MAX_SCENARIO_BYTES", 200)
    line = refused(capsys, *_huge(tmp_path, command))
    assert line.endswith(f"{tmp_path}/{message}"), line


@linux_proc
@pytest.mark.parametrize("kind", ["device", "fifo"])
@pytest.mark.parametrize("command", ["replay", "scenario"])
def test_a_device_or_fifo_behind_the_name_is_refused_at_once(
    tmp_path: Path, kind: str, command: str
) -> None:
    """``/dev/zero`` behind a ``.jsonl`` or ``.toml`` name was read until memory ran
    out; a FIFO without a writer blocked for ever (a subprocess: a hang fails the test
    by its timeout, not the whole session)."""
    name = tmp_path / ("r.jsonl" if command == "replay" else "s.toml")
    if kind == "device":
        name.symlink_to("/dev/zero")
    else:
        os.mkfifo(name)
    argv = (
        ["simulate", "--replay", name, "-q"] if command == "replay" else ["scenario", "run", name]
    )
    proc = subprocess.run(
        [sys.executable, "-m", "xce_resize_plugin", *map(str, argv)],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert proc.returncode == 2 and proc.stdout == "", proc.stderr
    assert proc.stderr.count("\n") == 1, proc.stderr
    what = "a device" if kind == "device" else "a FIFO"
    assert f"{name}: cannot read" in proc.stderr and f"{what}, not a regular file" in proc.stderr


def test_a_recording_line_nested_too_deeply_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "r.jsonl"
    path.write_text("[" * 100_000 + "]" * 100_000 + "\n", encoding="utf-8")
    line = refused(capsys, "simulate", "--replay", path)
    assert line == f"xce-resize: Recording error: {path}:1: not JSON (nested too deeply)"


def test_a_recording_names_the_configs_policy_files_absolute(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``simulate --config`` takes a relative policy file from the configuration's
    directory; its recording names it absolute, so that ``--trust-policy-files``
    loads the same file wherever the recording is replayed from."""
    conf, elsewhere = tmp_path / "conf", tmp_path / "elsewhere"
    conf.mkdir()
    elsewhere.mkdir()
    marker = tmp_path / "ran"
    (conf / "site.py").write_text(
        f"import pathlib\npathlib.Path({str(marker)!r}).write_text('ran')\n"
    )
    (conf / "c.toml").write_text('[resize]\npolicy_files = ["site.py"]\n')
    rec = elsewhere / "run.jsonl"
    assert main([str(a) for a in _sim("--config", conf / "c.toml", "--record", rec)]) == 0
    header = json.loads(rec.read_text(encoding="utf-8").splitlines()[0])
    assert header["config"]["policy_files"] == [str(conf / "site.py")]
    marker.unlink()
    capsys.readouterr()
    assert main(["simulate", "--replay", str(rec), "-q", "--trust-policy-files"]) == 0
    assert capsys.readouterr().out.splitlines()[0].endswith("identical")
    assert marker.read_text() == "ran"
