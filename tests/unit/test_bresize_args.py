"""The ``bresize`` command-line grammar: LSF syntax, usage errors, LSF error codes."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from xce_resize_plugin.core.models import CancelRequest, GrowRequest, ReleaseRequest
from xce_resize_plugin.errors import (
    BadHost,
    BadJobId,
    BadReleaseHostSpec,
    BadSlots,
    NotifyCmdTooLong,
    ResizeError,
    UsageError,
)
from xce_resize_plugin.lsf.bresize_args import (
    MAX_NOTIFY_BYTES,
    MAX_TASKS,
    USAGE,
    Command,
    parse,
    parse_job_id,
    to_argv,
    to_request,
)

ROOT = Path(__file__).resolve().parents[2]


def usage_error(argv: list[str]) -> str:
    """Parse ``argv``, expect exactly UsageError, return its detail."""
    with pytest.raises(UsageError) as info:
        parse(argv)
    assert type(info.value) is UsageError
    assert info.value.code == "XCE_RESIZE_USAGE"
    assert info.value.detail is not None
    return info.value.detail


# --- valid command lines -------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["-h"], Command(op="help")),
        (["--help"], Command(op="help")),
        (["-V"], Command(op="version")),
        (["--version"], Command(op="version")),
        (["cancel", "221"], Command(op="cancel", job_id="221")),
        (["cancel", "221[3]"], Command(op="cancel", job_id="221[3]")),
        (["request", "4", "12"], Command(op="request", job_id="12", min_add=4, max_add=4)),
        (["request", "2,4", "12"], Command(op="request", job_id="12", min_add=2, max_add=4)),
        (["request", "3,3", "12"], Command(op="request", job_id="12", min_add=3, max_add=3)),
        (
            ["request", "-c", "-rncn", "1,8", "221[3]"],
            Command(
                op="request",
                job_id="221[3]",
                min_add=1,
                max_add=8,
                cancel_pending=True,
                no_notify=True,
            ),
        ),
        (
            ["request", "-rnc", "/bin/resize.sh --quiet", "-c", "2", "12"],
            Command(
                op="request",
                job_id="12",
                min_add=2,
                max_add=2,
                cancel_pending=True,
                notify_cmd="/bin/resize.sh --quiet",
            ),
        ),
        # The notify command is the next argument, even when it looks like an option.
        (
            ["request", "-rnc", "-c", "2", "12"],
            Command(op="request", job_id="12", min_add=2, max_add=2, notify_cmd="-c"),
        ),
        (["release", "hostB", "12"], Command(op="release", job_id="12", spec=("hostB",))),
        (["release", "2*hostB", "12"], Command(op="release", job_id="12", spec=("2*hostB",))),
        (["release", "all", "12"], Command(op="release", job_id="12", spec=("all",))),
        (
            ["release", "all ~hostB ~1*hostC", "12"],
            Command(op="release", job_id="12", spec=("all", "~hostB", "~1*hostC")),
        ),
        (
            ["release", "all", "~hostB", "~1*hostC", "12"],
            Command(op="release", job_id="12", spec=("all", "~hostB", "~1*hostC")),
        ),
        (
            ["release", "-c", "-rnc", "echo hi", "hostA", "2*hostB", "221[3]"],
            Command(
                op="release",
                job_id="221[3]",
                spec=("hostA", "2*hostB"),
                cancel_pending=True,
                notify_cmd="echo hi",
            ),
        ),
        (["release", "--", "hostB", "12"], Command(op="release", job_id="12", spec=("hostB",))),
    ],
)
def test_parse_valid(argv: list[str], expected: Command) -> None:
    assert parse(argv) == expected


def test_job_ids_are_normalised() -> None:
    assert parse(["cancel", "007"]).job_id == "7"
    assert parse(["cancel", "221[03]"]).job_id == "221[3]"
    assert parse_job_id("1") == "1"


def test_largest_counts_and_notify_command() -> None:
    cmd = parse(["request", f"1,{MAX_TASKS}", "12"])
    assert (cmd.min_add, cmd.max_add) == (1, MAX_TASKS)
    longest = "x" * (MAX_NOTIFY_BYTES - 1)
    assert parse(["request", "-rnc", longest, "1", "12"]).notify_cmd == longest


def test_usage_text_is_the_lsf_synopsis() -> None:
    for line in [
        "bresize release [-c] [-rnc resize_notification_cmd | -rncn]",
        "released_host_specification job_ID",
        "bresize request [-c] [-rnc resize_notification_cmd | -rncn]",
        "[min_task,]tasks job_ID",
        "bresize cancel job_ID",
        "bresize [-h | -V]",
    ]:
        assert line in USAGE
    assert all(len(line) <= 100 for line in USAGE.splitlines())


# --- usage errors --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "detail"),
    [
        ([], "missing subcommand"),
        (["grow", "4", "12"], "unknown subcommand 'grow'"),
        (["Request", "4", "12"], "unknown subcommand 'Request'"),
        (["-c", "request", "4", "12"], "options come after the subcommand: got '-c'"),
        (["-h", "-V"], "-h/-V stand alone"),
        (["-V", "request"], "-h/-V stand alone"),
        (["request", "-h", "4", "12"], "-h/-V stand alone"),
        (["cancel", "-V"], "-h/-V stand alone"),
        (["request", "-rnc", "x", "-rncn", "4", "12"], "-rnc and -rncn are mutually exclusive"),
        (["release", "-rncn", "-rnc", "x", "h", "12"], "-rnc and -rncn are mutually exclusive"),
        (["request", "-rnc"], "-rnc needs a command"),
        (["request", "-rnc", "", "4", "12"], "-rnc needs a command"),
        (["request", "-rnc", "  ", "4", "12"], "-rnc needs a command"),
        (["request", "-c", "-c", "4", "12"], "-c given more than once"),
        (["request", "-rnc", "a", "-rnc", "b", "4", "12"], "-rnc given more than once"),
        (["request", "-rncn", "-rncn", "4", "12"], "-rncn given more than once"),
        (["request", "-x", "4", "12"], "unknown option '-x' for bresize request"),
        (["release", "--rnc", "a", "h", "12"], "unknown option '--rnc' for bresize release"),
        (["request", "3,x", "12"], "request takes [min_task,]tasks: got '3,x'"),
        (["request", "-1", "12"], "request takes [min_task,]tasks: got '-1'"),
        (["request", "2,", "12"], "got '2,'"),
        (["request", ",2", "12"], "got ',2'"),
        (["request", "1,2,3", "12"], "got '1,2,3'"),
        (["request", "٣", "12"], "got '٣'"),
        (["request", "0", "12"], "tasks must be a positive integer: got '0'"),
        (["request", "0,2", "12"], "min_task must be a positive integer: got '0,2'"),
        (["request", "4,2", "12"], "min_task 4 is greater than tasks 2"),
        (["request", str(MAX_TASKS + 1), "12"], f"tasks must be at most {MAX_TASKS}"),
        (["request", "9" * 5000, "12"], f"tasks must be at most {MAX_TASKS}"),
        (["request"], "missing [min_task,]tasks and job ID"),
        (["request", "4"], "missing job ID"),
        (["request", "221[3]"], "missing [min_task,]tasks before job ID '221[3]'"),
        (["request", "2", "4", "12"], "got '2 4 12'"),
        (["request", "4", "-c", "12"], "options come before [min_task,]tasks: got '-c'"),
        (["request", "4", "12", "-rncn"], "got '-rncn' after it"),
        (["release"], "missing release specification and job ID"),
        (["release", "12"], "missing release specification before job ID '12'"),
        (["release", "hostB"], "missing job ID after release specification 'hostB'"),
        (["release", "", "12"], "empty release specification"),
        (["release", "  ", "", "12"], "empty release specification"),
        (["release", "hostB", "-c", "12"], "options come before the release specification"),
        (["cancel"], "missing job ID"),
        (["cancel", "-c", "12"], "bresize cancel takes no options: got '-c'"),
        (["cancel", "-rncn", "12"], "bresize cancel takes no options: got '-rncn'"),
        (["cancel", "12", "13"], "bresize cancel takes one job ID: got '12 13'"),
    ],
)
def test_usage_errors(argv: list[str], detail: str) -> None:
    assert detail in usage_error(argv)


# --- LSF errors ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "command",
    [
        "x" * MAX_NOTIFY_BYTES,
        "é" * (MAX_NOTIFY_BYTES // 2),  # 2048 characters, 4096 bytes
        "\udcff" * MAX_NOTIFY_BYTES,  # undecodable argv bytes count one each
        "\ud800" * (MAX_NOTIFY_BYTES // 3 + 1),  # not from argv; 3 bytes each, no crash
    ],
)
def test_notify_command_too_long(command: str) -> None:
    with pytest.raises(NotifyCmdTooLong) as info:
        parse(["release", "-rnc", command, "hostB", "12"])
    assert info.value.lsf_number == 356
    assert info.value.code == "LSBE_RESIZE_NOTIFY_CMD_LEN"
    assert "4096" in info.value.text


@pytest.mark.parametrize(
    "job_id",
    ["abc", "12a", "221[]", "221[3", "221[1-3]", "[3]", "0", "221[0]", "00", "1" * 21, "١٢"],
)
def test_bad_job_id(job_id: str) -> None:
    for argv in (["cancel", job_id], ["request", "4", job_id], ["release", "hostB", job_id]):
        with pytest.raises(BadJobId) as info:
            parse(argv)
        assert info.value.code == "LSBE_BAD_JOBID"
        assert info.value.detail is not None and repr(job_id) in info.value.detail


def test_usage_errors_come_before_lsf_errors() -> None:
    # A bad job ID and a too-long command do not hide a usage error.
    assert "min_task" in usage_error(["request", "-rnc", "x" * 5000, "4,2", "abc"])
    with pytest.raises(NotifyCmdTooLong):
        parse(["request", "-rnc", "x" * 5000, "4", "abc"])


# --- to_request ----------------------------------------------------------------------


def test_to_request() -> None:
    assert to_request(parse(["request", "-c", "-rnc", "n.sh", "2,4", "221[3]"])) == (
        "221[3]",
        GrowRequest(min_add=2, max_add=4, cancel_pending=True, notify_cmd="n.sh"),
    )
    assert to_request(parse(["release", "-rncn", "all", " ~hostB\t", "12"])) == (
        "12",
        ReleaseRequest(spec="all ~hostB", no_notify=True),
    )
    assert to_request(parse(["release", "all ~hostB ~1*hostC", "12"]))[1] == ReleaseRequest(
        spec="all ~hostB ~1*hostC"
    )
    assert to_request(parse(["cancel", "12"])) == ("12", CancelRequest())


@pytest.mark.parametrize(
    ("spec", "error"),
    [
        ("~hostB", BadReleaseHostSpec),
        ("hostB*2", BadReleaseHostSpec),
        ("0*hostB", BadSlots),
        ("-1*hostB", BadSlots),
        ("2*", BadHost),
        ("host!", BadHost),
    ],
)
def test_to_request_checks_the_release_spec(spec: str, error: type[ResizeError]) -> None:
    with pytest.raises(error) as info:
        to_request(parse(["release", spec, "12"]))
    assert type(info.value) is error
    assert info.value.detail is not None and spec in info.value.detail


def test_to_request_refuses_help_and_version() -> None:
    for argv in (["-h"], ["-V"]):
        with pytest.raises(UsageError):
            to_request(parse(argv))
    with pytest.raises(UsageError):
        to_request(Command(op="request", job_id="1"))


# --- properties ----------------------------------------------------------------------

counts = st.integers(1, MAX_TASKS)
job_ids = st.builds(
    lambda n, i: str(n) if i is None else f"{n}[{i}]",
    st.integers(1, 10**12),
    st.none() | st.integers(1, 10**6),
)
notify = st.none() | st.text(min_size=1, max_size=40).filter(lambda s: s.strip() != "")
hosts = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._-]{0,10}", fullmatch=True).filter(
    lambda h: h != "all"
)
host_specs = st.lists(st.tuples(st.none() | st.integers(1, 99), hosts), max_size=4)
spec_tokens = st.one_of(
    # all ~host ~N*host ...
    host_specs.map(lambda xs: ("all", *(f"~{h}" if n is None else f"~{n}*{h}" for n, h in xs))),
    # host N*host ...
    host_specs.filter(bool).map(lambda xs: tuple(h if n is None else f"{n}*{h}" for n, h in xs)),
)


@st.composite
def commands(draw: st.DrawFn) -> Command:
    kind = draw(st.sampled_from(["request", "release", "cancel", "help", "version"]))
    if kind == "help":
        return Command(op="help")
    if kind == "version":
        return Command(op="version")
    job_id = draw(job_ids)
    if kind == "cancel":
        return Command(op="cancel", job_id=job_id)
    notify_cmd = draw(notify)
    base = Command(
        op="release",
        job_id=job_id,
        cancel_pending=draw(st.booleans()),
        notify_cmd=notify_cmd,
        no_notify=notify_cmd is None and draw(st.booleans()),
    )
    if kind == "release":
        grace = draw(st.none() | st.integers(0, 99_999).map(float) | st.sampled_from([0.5, 2.25]))
        return base._replace(spec=draw(spec_tokens), grace=grace)
    high = draw(counts)
    return base._replace(op="request", min_add=draw(st.integers(1, high)), max_add=high)


@settings(max_examples=300, deadline=None)
@given(commands())
def test_parse_to_argv_round_trip(cmd: Command) -> None:
    assert parse(to_argv(cmd)) == cmd


@settings(max_examples=300, deadline=None)
@given(commands())
def test_generated_commands_make_requests(cmd: Command) -> None:
    if cmd.op in ("help", "version"):
        return
    try:
        job_id, request = to_request(cmd)
    except (BadReleaseHostSpec, BadSlots, BadHost):
        # Generated specs may name a host twice; anything else must convert.
        assert cmd.op == "release"
        return
    assert job_id == cmd.job_id
    if isinstance(request, ReleaseRequest):
        assert request.spec == " ".join(cmd.spec)


junk_words = st.sampled_from(
    ["request", "release", "cancel", "-c", "-rnc", "-rncn", "-h", "-V", "--", "all", "~h",
     "2*h", "h*2", "1,2", "2,1", "0", "-1", "12", "221[3]", "x", "", " "]
)  # fmt: skip


@settings(max_examples=500, deadline=None)
@given(st.lists(junk_words | st.text(max_size=6), max_size=7))
def test_junk_argv_raises_only_resize_errors(argv: list[str]) -> None:
    try:
        cmd = parse(argv)
    except ResizeError:
        return
    if cmd.op not in ("help", "version"):
        with contextlib.suppress(ResizeError):
            to_request(cmd)
    # Whatever parsed must print back to something that parses the same.
    assert parse(to_argv(cmd)) == cmd


# --- start-up cost -------------------------------------------------------------------

# bresize is installed as a script that imports only the command (scripts/bresize), so
# everything the command loads counts against its start-up; re alone is a third of it.
# Run without site (-S; the package from this checkout, the working directory): a
# development install's .pth files import re and more before any command does.
_PROBE = """
import sys
before = set(sys.modules)
import xce_resize_plugin.lsf.bresize_args, xce_resize_plugin.cli.bresize
new = set(sys.modules) - before
import json
print(json.dumps(sorted(m for m in new if m.split('.')[0] in
      ('attrs', 'attr', 'cattrs', 'pluggy', 'lmdb', 'argparse', 'urllib', 'json', 'http',
       'typing', 'dataclasses', 'inspect', 'importlib', 'pathlib', 're', 'enum')
      or m in ('xce_resize_plugin.core.models', 'xce_resize_plugin.core.releasespec'))))
"""


def _heavy_modules() -> list[str]:
    out = subprocess.run(
        [sys.executable, "-S", "-c", _PROBE], cwd=ROOT, capture_output=True, text=True, check=True
    )
    heavy: list[str] = json.loads(out.stdout)
    return heavy


def test_import_is_light() -> None:
    assert _heavy_modules() == []


# --- the command logic (lsf/bresize_run.py) -------------------------------------------------


def test_bad_release_spec_is_refused_before_contacting_the_controller() -> None:
    from xce_resize_plugin.lsf import bresize_run

    sent: list[object] = []
    out = bresize_run.run(["release", "hostB*2", "12"], sent.append)
    assert (out.exit, out.code) == (255, "LSBE_RESIZE_RELEASE_HOSTSPEC")
    assert sent == []
    out = bresize_run.run(["release", "2*hostB", "12"], sent.append)
    assert out.exit == 0 and len(sent) == 1


def test_usage_error_exit_2_and_help_version() -> None:
    from xce_resize_plugin.lsf import bresize_run

    sent: list[object] = []
    out = bresize_run.run(["request", "-rnc", "x", "-rncn", "1", "12"], sent.append)
    assert out.exit == 2 and "mutually exclusive" in out.message and "Usage:" in out.message
    assert bresize_run.run(["-V"], sent.append).stdout.startswith("xce_resize_plugin bresize")
    assert "bresize request" in bresize_run.run(["-h"], sent.append).stdout
    assert sent == []


# --- --grace, an XCE extension ---------------------------------------------------------


def test_grace_is_a_release_option_that_leaves_lsf_lines_alone() -> None:
    cmd = parse(["release", "-c", "--grace", "30", "2*hostB", "12"])
    assert cmd == Command(
        op="release", job_id="12", spec=("2*hostB",), cancel_pending=True, grace=30.0
    )
    assert parse(["release", "--grace", "2.5", "all", "12"]).grace == 2.5
    assert parse(["release", "all", "12"]).grace is None
    _, request = to_request(cmd)
    assert isinstance(request, ReleaseRequest) and request.grace == 30.0
    from xce_resize_plugin.cli.bresize import request_body

    assert request_body(cmd)[2] == {
        "spec": "2*hostB",
        "cancel_pending": True,
        "no_notify": False,
        "grace": 30.0,
    }
    assert "grace" not in (request_body(parse(["release", "all", "12"]))[2] or {})


@pytest.mark.parametrize(
    ("argv", "detail"),
    [
        (["release", "--grace", "-1", "all", "12"], "--grace takes a number of seconds"),
        (["release", "--grace", "1e3", "all", "12"], "--grace takes a number of seconds"),
        (["release", "--grace"], "--grace takes a number of seconds"),
        (["release", "--grace", "1", "--grace", "2", "all", "12"], "given more than once"),
        (["release", "all", "--grace", "1", "12"], "options come before"),
        (["request", "--grace", "1", "2", "12"], "unknown option '--grace'"),
    ],
)
def test_grace_usage_errors(argv: list[str], detail: str) -> None:
    with pytest.raises(UsageError, match=detail):
        parse(argv)


@settings(max_examples=300, deadline=None)
@given(
    st.integers(0, 999_999_998),
    st.none() | st.from_regex(r"[0-9]{1,9}", fullmatch=True),
)
def test_every_grace_the_grammar_reads_prints_back(whole: int, decimals: str | None) -> None:
    """``to_argv`` gives back what ``parse`` reads back, for every ``--grace`` the
    grammar accepts (up to 9 digits, up to 9 decimals): ``1234567`` and ``2.123456789``
    too, which a 6-digit ``%g`` printed as ``1.23457e+06`` (refused) or ``2.12346``."""
    text = f"{whole}" if decimals is None else f"{whole}.{decimals}"
    cmd = parse(["release", "--grace", text, "all", "12"])
    assert parse(to_argv(cmd)) == cmd


def test_a_notification_command_that_is_not_utf8_is_a_usage_error() -> None:
    """argv bytes that are not UTF-8 reach Python as lone surrogates, which no JSON
    body carries: refused here (exit 2), not by the controller as a "lone surrogate"."""
    latin1 = b"echo caf\xe9".decode("utf-8", "surrogateescape")
    with pytest.raises(UsageError, match="-rnc: the command is not UTF-8 text"):
        parse(["request", "-rnc", latin1, "2", "12"])
    assert parse(["request", "-rnc", "echo café", "2", "12"]).notify_cmd == "echo café"
