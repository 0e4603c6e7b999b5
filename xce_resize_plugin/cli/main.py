"""``xce-resize``: the demo, scenarios and journal maintenance.

Library code raises; this module alone turns errors into messages and exit codes:
0 success, 1 a check found problems, 2 bad usage or input (the message names what),
74 standard output could not be written, 255 the controller refused the request or
could not be reached (as `bresize`).
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn, TextIO, cast

from xce_resize_plugin import __version__
from xce_resize_plugin.cli.argtypes import count, integer, number
from xce_resize_plugin.cli.streams import to_devnull
from xce_resize_plugin.errors import JournalError, ResizeError, Unreachable, UsageError

EXIT_OK, EXIT_PROBLEMS, EXIT_USAGE, EXIT_REJECTED = 0, 1, 2, 255
EXIT_PIPE = 128 + 13  # SIGPIPE
#: Standard output could not be written (a full disk, an I/O error): sysexits.h's
#: EX_IOERR, apart from 1 ("verify found problems") and 2 (nothing was done).
EXIT_OUTPUT = 74


class StdoutError(Exception):
    """Writing standard output failed (not a closed pipe: :func:`closed_pipe`).

    Not an OSError: the commands' own ``except OSError`` (about the files they read
    and write) must not take it for an error of theirs. ``done`` says what the command
    had done already (a compaction), which the failed output would have told.
    """

    def __init__(self, cause: OSError, done: str = "") -> None:
        super().__init__(cause)
        self.reason = cause.strerror or str(cause)
        self.done = done

    @property
    def text(self) -> str:
        line = f"standard output: cannot write ({self.reason})"
        return f"{line}; {self.done}" if self.done else line


class _Stdout:
    """``sys.stdout`` as the commands write to it: a failed write or flush is a
    :class:`StdoutError`, so that :func:`_run` tells it apart from every other OSError.
    ``None`` (started with ``>&-``) fails at the first write, not before: a command
    that writes nothing there runs."""

    def __init__(self, stream: TextIO | None) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        if self._stream is None:
            raise StdoutError(OSError(errno.EBADF, os.strerror(errno.EBADF)))
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            raise
        except OSError as exc:
            raise StdoutError(exc) from exc

    def flush(self) -> None:
        if self._stream is None:
            return
        try:
            self._stream.flush()
        except BrokenPipeError:
            raise
        except OSError as exc:
            raise StdoutError(exc) from exc

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def _pids_max(text: str) -> str | int:
    """``--task-pids-max``: as ``[worker] task_pids_max``."""
    from xce_resize_plugin.controllers.live.cgroups import parse_pids_max

    try:
        return parse_pids_max(int(text) if text.isdigit() else text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _request_deadline(text: str) -> float:
    """A request deadline on the command line: seconds, > 0 and at most an hour (as
    ``[controller] header_timeout``)."""
    from xce_resize_plugin.controllers.live.settings import MAX_REQUEST_TIMEOUT

    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value <= MAX_REQUEST_TIMEOUT:
        raise argparse.ArgumentTypeError(
            f"must be a number of seconds > 0 and <= {MAX_REQUEST_TIMEOUT:g}, got {text!r}"
        )
    return value


def output_file(text: str) -> Path:
    """An output file's name (``--record``, ``--plot`` ...). One whose last component is
    empty or ``.`` (``out.jsonl/``) names a directory, and ``Path`` would drop that
    (``Path("out.jsonl/")`` is ``out.jsonl``): the command would then check and write a
    file of another name than the one given."""
    if text.rsplit("/", 1)[-1] in ("", "."):
        raise argparse.ArgumentTypeError(f"{text!r} names a directory (it ends in '/'), not a file")
    return Path(text)


class _Parser(argparse.ArgumentParser):
    """argparse's parser, with a value an option does not take reported in one line
    (``xce-resize simulate: error: argument --limit: not a whole number of decimal
    digits: '-1'``, exit 2), as every other bad value is: the usage printed above it
    hid the one line that says what is wrong. Other usage errors (a missing argument,
    an unknown option) still show the usage."""

    def error(self, message: str) -> NoReturn:
        if message.startswith("argument "):
            self.exit(2, f"{self.prog}: error: {message}\n")
        super().error(message)


def _parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="xce-resize",
        description="Job resize for XCE: the demo, scenarios, trace simulations and sweeps, "
        "the live controller and its worker agents, client commands, journal maintenance.",
    )
    p.add_argument("-V", "--version", action="version", version=f"xce-resize {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    demo = sub.add_parser("demo", help="run the built-in scenario and show its timeline")
    demo.add_argument("--json", action="store_true", help="print the result as JSON")
    demo.add_argument(
        "--live",
        action="store_true",
        help="run a real controller, worker agents and task processes in a temporary "
        "directory (needs the live extra: pip install '.[live]' in a checkout)",
    )

    sc = sub.add_parser("scenario", help="run scenario files in simulated time")
    sc_sub = sc.add_subparsers(dest="action", required=True, metavar="ACTION")
    run = sc_sub.add_parser("run", help="run one TOML scenario")
    run.add_argument("file", type=Path)
    run.add_argument("--json", action="store_true", help="print the result as JSON")
    run.add_argument(
        "--state-dir", type=Path, help="keep the controller's and the plugin's state here"
    )
    run.add_argument(
        "--record",
        type=output_file,
        metavar="OUT",
        help="write a recording of the run (replay: xce-resize simulate --replay OUT)",
    )

    _simulate_parser(sub)
    _sweep_parser(sub)

    jr = sub.add_parser("journal", help="check, export and compact a resize journal")
    jr_sub = jr.add_subparsers(dest="action", required=True, metavar="ACTION")
    verify = jr_sub.add_parser("verify", help="check CRCs, structure and replay")
    verify.add_argument("dir", type=Path)
    verify.add_argument("--json", action="store_true")
    export = jr_sub.add_parser("export", help="write every fact as JSON lines")
    export.add_argument("dir", type=Path)
    export.add_argument(
        "-o",
        "--output",
        # A str, not a Path: Path("./-") is Path("-"), and ./- names a file called -.
        type=str,
        help="file to write (default, or -: stdout; a file named -: ./-)",
    )
    compact = jr_sub.add_parser(
        "compact", help="archive and drop finished jobs' history (controller stopped)"
    )
    compact.add_argument("dir", type=Path)
    compact.add_argument("--keep-days", type=number, required=True)
    compact.add_argument(
        "--archive",
        type=str,  # as --output: ./- is a file
        help="JSON-lines file the dropped facts are appended to before they are deleted "
        "(default: DIR/compacted-<time>.jsonl; -: standard output, the summary then goes "
        "to standard error)",
    )
    compact.add_argument("--now", type=number, help="the current time (default: the clock)")

    _controller_parser(sub)
    _worker_parser(sub)

    from xce_resize_plugin.cli.hosts import add_parsers as add_host_parsers
    from xce_resize_plugin.cli.jobs import add_parsers as add_client_parsers
    from xce_resize_plugin.cli.target import add_parsers as add_target_parsers

    add_client_parsers(sub)
    add_host_parsers(sub)
    add_target_parsers(sub)
    return p


def _controller_parser(sub: Any) -> None:
    """``controller``: the live controller's process."""
    ctl = sub.add_parser(
        "controller", help="run the live embedded controller (real processes, REST on loopback)"
    )
    ctl.add_argument("--config", type=Path, required=True, help="the TOML configuration")
    ctl.add_argument("--listen", help="HOST:PORT overriding [controller] listen")
    ctl.add_argument("--state-dir", type=Path, help="overrides [controller] state_dir")
    ctl.add_argument("--ready-file", type=Path, help="written (JSON) once the API serves")
    ctl.add_argument(
        "--record",
        type=output_file,
        metavar="FILE",
        help="record this run's inputs for `xce-resize simulate --replay FILE` "
        "(overrides [controller] record; a new file, an empty state directory)",
    )
    ctl.add_argument(
        "--log-format",
        choices=("text", "json"),
        default="text",
        help="the log on standard error: text lines (default) or one JSON object per line "
        "with request_id, job and user on lines about a request (docs/operations.md)",
    )
    ctl.add_argument(
        "--access-log",
        action="store_true",
        help="log one line per request: method, path, status, milliseconds",
    )


def _worker_parser(sub: Any) -> None:
    """``worker``: one host's agent of the live controller."""
    wk = sub.add_parser("worker", help="run one host's worker agent for the live controller")
    wk.add_argument("--state-dir", type=Path, required=True, help="the controller's state_dir")
    wk.add_argument("--host", required=True, help="the host this agent stands for")
    wk.add_argument(
        "--header-timeout",
        type=_request_deadline,
        default=10.0,
        metavar="SECONDS",
        help="seconds a client has to send a request's headers (the controller passes "
        "its [controller] header_timeout; default 10)",
    )
    wk.add_argument(
        "--containment",
        choices=("auto", "cgroup", "proc"),
        default="auto",
        help="a cgroup per task (cgroup: or refuse to start), the /proc tracking alone "
        "(proc), or the first where it can (auto, the default); [worker] containment",
    )
    wk.add_argument(
        "--task-pids-max",
        type=_pids_max,
        metavar="N|N%|max",
        help="pids.max of each task's cgroup, where a pids controller is there "
        "([worker] task_pids_max; default 15%%)",
    )


def _simulate_parser(sub: Any) -> None:
    sim = sub.add_parser(
        "simulate",
        help="run a workload trace rigid and with malleable jobs, and compare",
        description="Run a workload trace (SWF .swf/.swf.gz, or ElastiSim jobs.json) twice "
        "through the embedded controller with the resize plugin: all jobs rigid (FCFS + "
        "EASY backfill), then with a share of them malleable, resized by a driver. "
        "Prints both runs side by side. See docs/simulation.md.",
    )
    sim.add_argument("trace", nargs="?", type=Path, help="the trace (not with --replay)")
    sim.add_argument(
        "--synthetic",
        metavar="SPEC",
        help="a synthetic workload instead of a trace: lublin:jobs=N,procs=P[,seed=S][,load=L] "
        "(the Lublin-Feitelson model; docs/simulation.md)",
    )
    sim.add_argument(
        "--save-swf",
        type=output_file,
        metavar="FILE",
        help="write the --synthetic workload as SWF (.swf, or .swf.gz compressed)",
    )
    sim.add_argument(
        "--malleable-fraction",
        type=number,
        metavar="F",
        help="share of jobs made malleable (0..1, default 0.2)",
    )
    sim.add_argument(
        "--seed",
        type=integer,
        metavar="N",
        help="seed of the malleable choice, and of a --synthetic workload whose spec has "
        "no seed= (0)",
    )
    sim.add_argument(
        "--speedup",
        metavar="MODEL",
        help="speedup model: amdahl[:SERIAL][:cost=S] or "
        "linear[:cost=S] (default amdahl:0.05:cost=10)",
    )
    sim.add_argument(
        "--driver",
        metavar="NAME",
        help="who asks for resizes: grow-shrink (default), grow-when-idle, shrink-for-queue, none",
    )
    sim.add_argument("--config", type=Path, metavar="FILE", help="TOML: [simulate], [resize]")
    sim.add_argument("--limit", type=count, metavar="N", help="only the first N jobs")
    sim.add_argument(
        "--host-failures",
        metavar="MTBF_HOURS[:REPAIR_HOURS]",
        help="inject seeded host failures in both runs: each host fails after an exponential "
        "time of mean MTBF_HOURS and is back REPAIR_HOURS later (default 1)",
    )
    sim.add_argument("--slots-per-host", type=count, metavar="N", help="slots per host (1)")
    _simulate_outputs(sim)


def _simulate_outputs(sim: Any) -> None:
    """``simulate``'s options for what it writes and how it runs."""
    sim.add_argument("--json", metavar="OUT", help="write the results as JSON to OUT (- stdout)")
    sim.add_argument(
        "--plot",
        type=output_file,
        metavar="OUT.png",
        help="write a plot: PNG, or the format its suffix names (.pdf, .svg, ...); needs "
        "matplotlib",
    )
    sim.add_argument(
        "--record", type=output_file, metavar="OUT", help="record the elastic run's inputs"
    )
    sim.add_argument(
        "--jobs-out",
        type=output_file,
        metavar="FILE.csv[.gz]",
        help="write one CSV row per job and run (columns: docs/simulation.md)",
    )
    sim.add_argument(
        "--replay", type=Path, metavar="RECORDING", help="replay a recording; check its facts"
    )
    sim.add_argument(
        "--policy",
        type=Path,
        action="append",
        metavar="FILE",
        help="with --replay: load this site policy file (repeat for more) instead of those "
        "the recording names, which a replay never loads by itself",
    )
    sim.add_argument(
        "--trust-policy-files",
        action="store_true",
        help="with --replay: load the policy files the recording names (Python code: "
        "only for a recording you trust)",
    )
    sim.add_argument(
        "--sequential",
        action="store_true",
        help="one run after the other (default: in parallel when there are two cores)",
    )
    sim.add_argument(
        "-q",
        "--quiet",
        "--no-progress",
        dest="quiet",
        action="store_true",
        help="no progress bars and no timing line on stderr (bars are drawn only on a terminal)",
    )


def _sweep_parser(sub: Any) -> None:
    sw = sub.add_parser(
        "sweep",
        help="run a grid of simulations (workloads x malleable fractions x seeds x drivers)",
        description="Run every cell of the grid a TOML file names through the simulation "
        "of `xce-resize simulate` (both runs), on the local cores or a Dask cluster, cache "
        "finished cells, and print the mean and 95% confidence interval across seeds of "
        "each metric. See docs/simulation.md.",
    )
    sw.add_argument("config", type=Path, help="the sweep file ([sweep], [simulate], [resize])")
    sw.add_argument(
        "--workers", type=count, metavar="N", help="local worker processes (default: all cores)"
    )
    sw.add_argument(
        "--dask",
        metavar="SCHEDULER_ADDRESS",
        help="run the cells on this Dask cluster (e.g. tcp://host:8786; the dask extra)",
    )
    sw.add_argument(
        "--cache",
        type=Path,
        metavar="DIR",
        help="finished cells are kept here (default: $XDG_CACHE_HOME/xce-resize/sweep, "
        "else ~/.cache/xce-resize/sweep)",
    )
    sw.add_argument("--no-cache", action="store_true", help="run every cell, keep nothing")
    sw.add_argument("--json", metavar="OUT", help="write the results as JSON to OUT (- stdout)")
    sw.add_argument(
        "--plot",
        type=output_file,
        metavar="OUT.png",
        help="metrics vs malleable fraction (matplotlib)",
    )
    sw.add_argument(
        "-q", "--quiet", action="store_true", help="no progress bar and no timing line on stderr"
    )


def main(argv: Sequence[str] | None = None) -> int:
    if sys.stderr is None:
        # Started with stderr closed (2>&-): print(file=sys.stderr) would write to
        # stdout, into the answers and JSON a script reads there. Messages are lost.
        sys.stderr = open(os.devnull, "w")  # noqa: SIM115 (for the process's life)
    args = _parser().parse_args(argv)
    try:
        return _run(args)
    except BrokenPipeError:
        # The reader of our output or of our messages went away (``xce-resize ... |
        # head``, ``2>&1 | head -0``), also while a message was printed below.
        return closed_pipe()


def _run(args: argparse.Namespace) -> int:
    out = _Stdout(sys.stdout)
    try:
        status = _dispatch(args, cast(TextIO, out))
        out.flush()  # a closed pipe or a full disk shows here, inside the try, not at exit
        return status
    except StdoutError as exc:
        _complain(exc.text)
        to_devnull(sys.stdout)
        return EXIT_OUTPUT
    except ResizeError as exc:
        _complain(exc.text)
        from xce_resize_plugin.rest.client import RemoteError

        # As bresize: the controller refused, or could not be reached.
        return EXIT_REJECTED if isinstance(exc, RemoteError | Unreachable) else EXIT_USAGE
    except KeyboardInterrupt:
        _complain("interrupted")
        return 130
    except MemoryError:
        # A workload, a grid or an input larger than this machine's memory (or the
        # process's `ulimit -v`): one line, as for every input the command cannot take,
        # not a traceback. Nothing was written: outputs are written at the end.
        _complain("out of memory (the input or the run is too large for this machine)")
        return EXIT_PROBLEMS


def _complain(text: str) -> None:
    """``xce-resize: text`` on stderr."""
    print(f"xce-resize: {text}", file=sys.stderr)


def closed_pipe() -> int:
    """Exit quietly, with the status a shell shows for a C program killed by SIGPIPE."""
    # Python flushes the streams again at exit; pointed at /dev/null, that cannot fail.
    devnull = os.open(os.devnull, os.O_WRONLY)
    for stream in (sys.stdout, sys.stderr):
        if stream is not None:
            os.dup2(devnull, stream.fileno())
    return EXIT_PIPE


def _dispatch(args: argparse.Namespace, out: TextIO) -> int:
    if args.command == "demo":
        if args.live:
            from xce_resize_plugin.cli.live_demo import main as run_live_demo

            return run_live_demo(out)
        from xce_resize_plugin.scenarios.demo import main as run_demo

        return run_demo(out, as_json=args.json)
    if args.command == "scenario":
        return _scenario(args, out)
    if args.command == "simulate":
        from xce_resize_plugin.cli.simulate import run as run_simulate

        return run_simulate(args, out)
    if args.command == "sweep":
        from xce_resize_plugin.cli.sweep import run as run_sweep

        return run_sweep(args, out)
    if args.command == "controller":
        from xce_resize_plugin.controllers.live import server
        from xce_resize_plugin.recording.live_recorder import record_live_run

        return server.run(
            args.config,
            listen=args.listen,
            state_dir=args.state_dir,
            ready_file=args.ready_file,
            record=args.record,
            attach=record_live_run,
            log_format=args.log_format,
            access_log=args.access_log,
        )
    if args.command == "worker":
        from xce_resize_plugin.controllers.live import cgroups, worker_server

        pids_max = args.task_pids_max
        return worker_server.serve(
            args.state_dir.resolve(),
            args.host,
            args.header_timeout,
            args.containment,
            cgroups.DEFAULT_PIDS_MAX if pids_max is None else pids_max,
        )
    if args.command in CLIENT_COMMANDS:
        return _client(args, out)
    return _journal(args, out)


#: The commands that ask a controller (``XCE_CONTROLLER_URL``).
CLIENT_COMMANDS = frozenset(
    ("hosts", "host", "target", "grow", "release", "submit", "jobs", "history", "kill", "modify")
)


def _client(args: argparse.Namespace, out: TextIO) -> int:
    """A client command. An answer that is JSON but not of the shape a controller
    gives (the URL names another service) is one line, not a traceback."""
    if args.command in ("hosts", "host"):
        from xce_resize_plugin.cli.hosts import run
    elif args.command in ("target", "grow", "release"):
        from xce_resize_plugin.cli.target import run
    else:
        from xce_resize_plugin.cli.jobs import run
    # Each command checks the answer it shows (cli/answers.py): an answer of another
    # shape is one line; anything else raised here is a bug, with its traceback.
    return run(args, out)


def _export_to(journal_dir: Path, output: Path) -> int:
    """``journal export -o FILE``: the facts exported, or a usage error naming the file
    (a missing directory, a full disk) with no part of an export left behind."""
    from xce_resize_plugin import journal

    existed = output.exists()
    try:
        # UTF-8 whatever the locale: the export's lines are UTF-8 JSON.
        with output.open("w", encoding="utf-8") as fh:
            return journal.export(journal_dir, fh, checked=True)
    except OSError as exc:
        if not existed and output.is_file():
            with contextlib.suppress(OSError):
                output.unlink()  # made here and cut short: not an export
        raise UsageError(f"-o {output}: cannot write ({exc.strerror or exc})") from None


def _scenario(args: argparse.Namespace, out: TextIO) -> int:
    from xce_resize_plugin.scenarios import files as scenario_file
    from xce_resize_plugin.scenarios import runner as scenario
    from xce_resize_plugin.scenarios.timeline import render as render_timeline

    spec = scenario_file.load(args.file)
    if args.state_dir is not None and args.state_dir.exists() and not args.state_dir.is_dir():
        raise UsageError(f"--state-dir {args.state_dir}: not a directory")
    with contextlib.ExitStack() as stack:
        try:
            record = (
                stack.enter_context(open(args.record, "w", encoding="utf-8"))
                if args.record is not None
                else None
            )
        except OSError as exc:
            raise UsageError(
                f"--record {args.record}: cannot write ({exc.strerror or exc})"
            ) from None
        state_dir = args.state_dir
        if state_dir is None:
            state_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="xce-resize-")))
        result = scenario.run(spec, state_dir, record)
    if args.json:
        # default=str: a [resize] value TOML can write but JSON cannot (a date) is shown
        # as text, as the controller's state keeps it, not a traceback at the end.
        json.dump(result.to_json(), out, indent=2, sort_keys=False, default=str)
        out.write("\n")
    else:
        out.write(render_timeline(result))
    for line in result.problems:
        print(f"xce-resize: invariant problem: {line}", file=sys.stderr)
    # A job the controller refused on arrival means the file does not describe the run its
    # author meant: as a refusal at time 0 does, it fails the run (after the output).
    for t, job_id, reason in result.rejected:
        print(
            f"xce-resize: {args.file}: job {job_id} refused at t={t:g}s: {reason}", file=sys.stderr
        )
    if result.problems:
        return EXIT_PROBLEMS
    return EXIT_USAGE if result.rejected else EXIT_OK


def _journal_verify(args: argparse.Namespace, out: TextIO) -> int:
    """``journal verify``: the report, as text or JSON; exit 1 when it found problems."""
    from xce_resize_plugin import journal
    from xce_resize_plugin.core import audit

    report = journal.verify(args.dir)
    problems = list(report.problems)
    if report.ok:
        problems += audit.replay_problems(args.dir)
    # Not counted (damaged meta pages or page structure): the counts are unknown,
    # and 0 would look like an empty journal.
    counts = (report.facts, report.live, report.done, report.epoch, report.last_seq)
    facts, live, done, epoch, last_seq = counts if report.counted else (None,) * 5
    doc: dict[str, Any] = {
        "ok": not problems,
        "problems": problems,
        "facts": facts,
        "live": live,
        "done": done,
        "epoch": epoch,
        "last_seq": last_seq,
    }
    if args.json:
        json.dump(doc, out, indent=2)
        out.write("\n")
    else:
        state = "OK" if not problems else f"{len(problems)} problem(s)"
        summary = (
            f"{facts} facts, {live} live jobs, {done} finished, epoch {epoch}, last seq {last_seq}"
            if report.counted
            else "counts unknown (the records were not read)"
        )
        out.write(f"{args.dir}: {state} — {summary}\n")
        for line in problems:
            out.write(f"  {line}\n")
    return EXIT_OK if not problems else EXIT_PROBLEMS


def _journal(args: argparse.Namespace, out: TextIO) -> int:
    from xce_resize_plugin import journal

    if args.action == "verify":
        return _journal_verify(args, out)
    if args.action == "export":
        # Before LMDB reads a page (a damaged one kills the process) and before an
        # output file is made.
        journal.require_readable(args.dir, "nothing was exported")
        if args.output is None or args.output == "-":  # "-": as --archive -
            n = journal.export(args.dir, out, checked=True)
            out.flush()  # the count only once the facts are out: a full disk says so
        else:
            journal.Journal.require(args.dir)  # no output file for what is no journal
            n = _export_to(args.dir, Path(args.output))
        print(f"exported {n} facts", file=sys.stderr)
        return EXIT_OK
    return _compact(args, out)


def _compact(args: argparse.Namespace, out: TextIO) -> int:
    """``journal compact``: the archive is a file, or standard output for ``-`` (the
    summary then goes to standard error, as ``journal export``'s count does)."""
    from xce_resize_plugin import journal

    if not args.keep_days >= 0:
        raise UsageError(f"--keep-days must be zero or more, got {args.keep_days:g}")
    now = args.now if args.now is not None else time.time()
    if args.archive is None:
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(time.time()))
        args.archive = str(args.dir / f"compacted-{stamp}.jsonl")
    journal.require_readable(args.dir, "nothing was compacted")  # before LMDB reads it
    journal.Journal.require(args.dir)  # no archive file for what is no journal
    if args.archive == "-":
        removed = _compact_to(args.dir, args.keep_days, now, out)
        print(_compacted(removed, args.keep_days, "standard output"), file=sys.stderr)
        return EXIT_OK
    try:
        with Path(args.archive).open("a", encoding="utf-8") as archive:
            removed = journal.compact(args.dir, args.keep_days, now, archive, checked=True)
    except OSError as exc:
        # A full or failing disk under the archive: compaction syncs the archive
        # before it deletes anything, so a write that fails fails before the deletion
        # (closing the file then fails again, and would hide compaction's own error).
        raise JournalError(
            f"{args.archive}: cannot write the archive ({exc.strerror or exc}); "
            "nothing was compacted"
        ) from None
    summary = _compacted(removed, args.keep_days, str(args.archive))
    try:
        out.write(summary + "\n")
        out.flush()
    except StdoutError as exc:
        # The facts are gone and archived: the failed summary must not read as a
        # failed compaction (docs/admin-guide.md, "Exit statuses of xce-resize").
        exc.done = f"the compaction was done: {summary}"
        raise
    return EXIT_OK


def _compact_to(directory: Path, keep_days: float, now: float, out: TextIO) -> int:
    """Compaction with standard output as the archive: a write that fails (a full
    disk, a reader gone) fails before the deletion commits, so nothing is removed."""
    from xce_resize_plugin import journal

    try:
        return journal.compact(directory, keep_days, now, out, checked=True)
    except StdoutError as exc:
        to_devnull(sys.stdout)
        raise JournalError(
            f"standard output: cannot write the archive ({exc.reason}); nothing was compacted"
        ) from None
    except JournalError as exc:
        cause = exc.__cause__
        # Compaction's own words when it could not flush or sync the archive (a closed
        # pipe; an fsync's EIO): said of standard output, not of a file.
        if isinstance(cause, OSError) and (exc.detail or "").startswith("the archive"):
            to_devnull(sys.stdout)
            raise JournalError(
                f"standard output: cannot write the archive ({cause.strerror or cause}); "
                "nothing was compacted"
            ) from None
        raise


def _compacted(removed: int, keep_days: float, archive: str) -> str:
    return (
        f"removed {removed} facts of jobs finished more than {keep_days:g} days ago "
        f"(archived to {archive})"
    )


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
