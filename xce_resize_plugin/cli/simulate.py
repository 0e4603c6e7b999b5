"""``xce-resize simulate``: the command behind the subcommand (imported on use only).

Exit status: 0 when the runs completed and every check passed (for ``--replay``: the
replay produced the recorded starts and facts), 1 when a check failed or the replay
diverged, 2 for bad usage or input (the message names what).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from xce_resize_plugin.errors import ConfigError, UsageError
from xce_resize_plugin.simulation.comparison import Comparison, simulate
from xce_resize_plugin.simulation.progress import RunBars
from xce_resize_plugin.simulation.report import format_table
from xce_resize_plugin.simulation.simulate import (
    MODES,
    SimOptions,
    Workload,
    load_options,
    load_workload,
)

EXIT_OK, EXIT_PROBLEMS = 0, 1


def run(args: argparse.Namespace, out: TextIO) -> int:
    """Run ``simulate`` for parsed arguments; ``out`` is stdout."""
    if args.replay is not None:
        return _replay(args, out)
    for given, option in (
        (args.policy, "--policy"),
        (args.trust_policy_files, "--trust-policy-files"),
    ):
        if given:
            raise UsageError(
                f"{option} is for --replay: a run loads the policy files of its --config "
                "([resize] policy_files)"
            )
    options = _checked_options(args)
    began = time.monotonic()
    workload = _workload(args, options)
    progress = RunBars(MODES, quiet=args.quiet)
    try:
        if args.record is not None:
            comparison = _recorded(args, options, workload, progress)
        else:
            comparison = simulate(
                workload.source,
                options,
                workload=workload,
                progress=progress.update,
                parallel=False if args.sequential else None,
                job_rows=args.jobs_out is not None,
            )
    finally:
        progress.close()
    write_results(out, args.json, comparison.to_json(), lambda: format_table(comparison))
    if args.plot is not None:
        from xce_resize_plugin.simulation.plot import plot_comparison

        plot_comparison(comparison, args.plot)
    if args.jobs_out is not None:
        _write_jobs_out(args.jobs_out, comparison)
    r, e = comparison.rigid, comparison.elastic
    if not args.quiet:
        print(
            f"simulate: {time.monotonic() - began:.1f} s (rigid run {r.seconds:.1f} s, "
            f"{r.events / r.seconds if r.seconds else 0:,.0f} events/s; elastic run "
            f"{e.seconds:.1f} s, {e.events / e.seconds if e.seconds else 0:,.0f} events/s)",
            file=sys.stderr,
        )
    for problem in comparison.problems:
        print(f"xce-resize: check failed: {problem}", file=sys.stderr)
    return EXIT_PROBLEMS if comparison.problems else EXIT_OK


def _checked_options(args: argparse.Namespace) -> SimOptions:
    """Every check of the command line and the ``--config`` file that can be made
    before the runs, so that a mistake stops the command now, not after them; the
    options."""
    if args.trace is None and args.synthetic is None:
        raise UsageError("simulate needs a TRACE, --synthetic SPEC or --replay RECORDING")
    if args.trace is not None and args.synthetic is not None:
        raise UsageError("give either a TRACE or --synthetic SPEC, not both")
    if args.save_swf is not None and args.synthetic is None:
        raise UsageError("--save-swf writes a --synthetic workload; give --synthetic SPEC")
    if args.save_swf is not None:
        # As written: a .GZ name would be written plain (swf_write) and read as gzip.
        if not args.save_swf.name.endswith((".swf", ".swf.gz")):
            raise UsageError(f"--save-swf {args.save_swf}: the name must end in .swf or .swf.gz")
        check_output("--save-swf", args.save_swf)
    if args.json not in (None, "-"):
        check_output("--json", args.json)
    for option, path in (("--plot", args.plot), ("--record", args.record)):
        if path is not None:
            check_output(option, path)
    options = load_options(
        args.config,
        malleable_fraction=args.malleable_fraction,
        seed=args.seed,
        speedup=args.speedup,
        driver=args.driver,
        limit=args.limit,
        slots_per_host=args.slots_per_host,
        host_failures=args.host_failures,
    )
    if args.plot is not None:
        from xce_resize_plugin.simulation.plot import check_plot_path

        # matplotlib missing, or a format it cannot write: now, not after the runs.
        check_plot_path(args.plot)
    if args.jobs_out is not None:
        _check_jobs_out(args.jobs_out)
    return options


def write_results(
    out: TextIO, json_to: str | None, doc: dict[str, Any], table: Callable[[], str]
) -> None:
    """The table on ``out`` and the JSON document to ``json_to``, or only the JSON on
    ``out`` when ``json_to`` is ``-`` (as ``simulate`` and ``sweep`` take ``--json``)."""
    text = json.dumps(doc, indent=2) + "\n"
    if json_to == "-":
        out.write(text)
        return
    out.write(table())
    if json_to is not None:
        try:
            with open(json_to, "w", encoding="utf-8") as fh:
                fh.write(text)
        except OSError as exc:
            raise UsageError(f"--json {json_to}: cannot write ({exc})") from None


def check_output(option: str, path: str | Path) -> None:
    """Refuse an output the results could not be written to (a directory, a name in a
    directory that does not exist, or one where the file cannot be created or
    written: no permission, a read-only file system), before anything runs."""
    if str(path).rsplit("/", 1)[-1] in ("", "."):
        # Path() drops a last "/" or "/.": the check would try another name than the
        # writer opens (``--json`` is a str; the Path options are refused by argparse).
        raise UsageError(f"{option} {path}: names a directory (it ends in '/'), not a file")
    p = Path(path)
    if p.is_dir():
        raise UsageError(f"{option} {path}: is a directory")
    if not p.parent.is_dir():
        raise UsageError(f"{option} {path}: no directory {p.parent}")
    if p.exists() and not p.is_file():
        # A pipe or a device (/dev/stdout, a FIFO): opening it to try would hand its
        # reader an end of file before the results come.
        return
    try:
        if os.path.lexists(p):
            if p.exists():
                # Appending nothing leaves a file (or the file a link names) as it was.
                with open(p, "ab"):
                    pass
            elif not os.access(os.path.dirname(os.path.realpath(p)), os.W_OK):
                # A link to a file not made yet: its target's directory decides.
                raise PermissionError(13, "Permission denied")
            return
        # Made only to try, and removed: O_EXCL, so that what is removed is what this
        # call made, never a file another process made meanwhile.
        fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return  # made meanwhile by someone else: not ours to try or remove
    except OSError as exc:
        raise UsageError(f"{option} {path}: cannot write ({exc.strerror or exc})") from None
    os.close(fd)
    os.unlink(p)


def _workload(args: argparse.Namespace, options: SimOptions) -> Workload:
    """The trace's workload, or the synthetic one (written out with ``--save-swf``)."""
    if args.synthetic is None:
        return load_workload(args.trace, options)
    from xce_resize_plugin.simulation.simulate import workload_of
    from xce_resize_plugin.simulation.workloads import synthetic_trace

    try:
        trace = synthetic_trace(args.synthetic, options)
    except ConfigError as exc:
        raise UsageError(f"--synthetic {args.synthetic}: {exc.detail}") from None
    if args.save_swf is not None:
        from xce_resize_plugin.simulation.swf_write import write_swf

        try:
            write_swf(trace, args.save_swf)
        except OSError as exc:
            raise UsageError(f"--save-swf {args.save_swf}: cannot write ({exc})") from None
    return workload_of(trace, trace.source, options)


def _recorded(args: argparse.Namespace, options: Any, workload: Any, progress: RunBars) -> Any:
    """Both runs one after the other, the elastic one recorded."""
    from xce_resize_plugin.simulation.simulate import run_mode

    update = progress.update
    rows = args.jobs_out is not None
    rigid = run_mode(workload, options, "rigid", progress=update, job_rows=rows)
    elastic = run_mode(
        workload, options, "elastic", progress=update, record=args.record, job_rows=rows
    )
    return Comparison(workload, options, rigid, elastic)


def _check_jobs_out(path: Path) -> None:
    """Refuse a ``--jobs-out`` name the runs could not be written to, before running."""
    if not (path.name.endswith(".csv") or path.name.endswith(".csv.gz")):
        raise UsageError(f"--jobs-out {path}: the name must end in .csv or .csv.gz")
    check_output("--jobs-out", path)


def _write_jobs_out(path: Path, comparison: Comparison) -> None:
    from xce_resize_plugin.simulation.jobs_csv import write_jobs_csv

    try:
        write_jobs_csv(path, (comparison.rigid.jobs, comparison.elastic.jobs))
    except OSError as exc:
        raise UsageError(f"--jobs-out {path}: cannot write ({exc.strerror or exc})") from None


#: What ``--replay`` does not take: the recording holds the jobs, the cluster and the
#: plugin's section, and the replay writes only its comparison (-q is accepted).
_NOT_WITH_REPLAY = (
    ("trace", "a TRACE"),
    ("synthetic", "--synthetic"),
    ("save_swf", "--save-swf"),
    ("malleable_fraction", "--malleable-fraction"),
    ("seed", "--seed"),
    ("speedup", "--speedup"),
    ("driver", "--driver"),
    ("config", "--config"),
    ("limit", "--limit"),
    ("host_failures", "--host-failures"),
    ("slots_per_host", "--slots-per-host"),
    ("json", "--json"),
    ("plot", "--plot"),
    ("record", "--record"),
    ("jobs_out", "--jobs-out"),
)


def _replay(args: argparse.Namespace, out: TextIO) -> int:
    from xce_resize_plugin.recording.replay import PolicyChoice, replay

    if args.trace is not None:
        raise UsageError("--replay takes no TRACE: the recording holds the jobs")
    for dest, option in _NOT_WITH_REPLAY:
        if getattr(args, dest) is not None:
            raise UsageError(
                f"--replay takes no {option}: the recording holds the run, "
                "and the replay only compares"
            )
    if args.sequential:
        raise UsageError("--replay takes no --sequential: a replay is one run")
    if args.policy and args.trust_policy_files:
        raise UsageError(
            "give either --policy FILE or --trust-policy-files, not both: --policy loads "
            "the files given instead of the recorded ones"
        )
    policies = PolicyChoice(tuple(args.policy or ()), args.trust_policy_files)
    from xce_resize_plugin.simulation.run_log import format_kinds, tally_warnings

    # The plugin's warnings again, one per job (as the run made them): counted, as
    # simulate counts them, and shown once per kind under the comparison.
    with tally_warnings() as tally:
        result = replay(args.replay, policies=policies)
    state = "identical" if result.ok else "DIFFERENT"
    out.write(
        f"replayed {result.inputs:,} inputs of {args.replay}: {result.starts:,} job starts and "
        f"{result.facts:,} resize facts, {state}\n"
    )
    for problem in result.problems:
        out.write(f"  {problem}\n")
    title = "plugin warnings in the replay (how many, and the first of each kind):"
    out.writelines(f"{line}\n" for line in format_kinds(title, tally.summaries()))
    return EXIT_OK if result.ok else EXIT_PROBLEMS
