"""The check a controller makes of its journal before it starts (:func:`require_intact`),
run in a child process.

The check reads every record through LMDB, which trusts its pages: a damaged page (a
node pointing past the end of the file) kills the process reading it with SIGBUS, and
the live controller died without a word. Walking the pages first
(:mod:`.page_walk`) would cost about three times the check itself on a large journal
(docs/performance.md), so the check runs in a child process instead: a child killed by
a signal is reported as damage, one line naming the data file, and the controller reads
only pages the child has read (docs/journal-format.md, "Refusing bad journals").

``python -m xce_resize_plugin.journal.start_check DIR`` is the child: it prints the
report, or the journal's error, as one JSON line.
"""

from __future__ import annotations

import json
import logging
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from xce_resize_plugin.errors import JournalError
from xce_resize_plugin.journal.records import DATA_FILE
from xce_resize_plugin.journal.verification import VerifyReport, verify

log = logging.getLogger(__name__)

#: Where the package is, for the child's imports (a checkout on PYTHONPATH or not).
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])
#: Seconds the check at start may take: a journal of gigabytes reads in a minute or
#: two; a check still running after this is waiting on something (a hung mount).
CHECK_TIMEOUT = 900.0
#: The child's program: argv[1] the package's directory (put first only when it is not
#: on the path already, so that a checkout's code is the one checked and an installed
#: package's site directory never comes before the standard library), argv[2] the
#: journal's.
_CHILD = (
    "import sys\n"
    "root = sys.argv[1]\n"
    "if root not in sys.path:\n"
    "    sys.path.insert(0, root)\n"
    "from xce_resize_plugin.journal.start_check import _main\n"
    "sys.exit(_main(sys.argv[2:]))\n"
)


def require_intact(path: Path | str) -> VerifyReport:
    """What a controller checks before it starts on the journal in ``path``.

    The pair of meta pages, every record's CRC (facts, live and finished states,
    history rows), the meta keys, and that the facts kept and compacted account for
    every sequence number; in one read transaction, so a controller still running on the
    directory does not disturb it. Not the page structure nor the index (``xce-resize
    journal verify`` checks those, offline); a damaged page that kills the reading
    process is reported as damage. Raises :class:`JournalError` naming the data file
    and the first problem; returns the report when there is none.
    """
    path = Path(path).absolute()
    data_file = path / DATA_FILE
    advice = (
        f"the controller does not start on it (`xce-resize journal verify {path}` lists "
        "every problem)"
    )
    answer = _in_child(path, data_file, advice)
    if "error" in answer:
        raise JournalError(str(answer["error"]))
    problems = tuple(str(problem) for problem in answer["problems"])
    if problems:
        more = " (and more)" if len(problems) > 1 else ""
        raise JournalError(f"{data_file}: damaged: {problems[0]}{more}; {advice}")
    facts, live, done, epoch, last_seq = (int(n) for n in answer["counts"])
    return VerifyReport(True, (), facts, live, done, epoch, last_seq)


def _in_child(path: Path, data_file: Path, advice: str) -> dict[str, Any]:
    """The child's answer; a child killed by SIGBUS or SIGSEGV is damage, and one that
    cannot be started at all leaves the check to this process."""
    executable = sys.executable
    if not executable or getattr(sys, "frozen", False):
        # An embedded or frozen interpreter: sys.executable is not a Python to run.
        return _answer(path)
    try:
        done = subprocess.run(
            # Isolated (-I): no PYTHON* variable, no user site, and neither the working
            # directory nor the script's on sys.path, so that no file lying there is
            # imported by a process running as root. The package's own directory is
            # added only if the interpreter would not find it (a checkout).
            [executable, "-I", "-c", _CHILD, _PACKAGE_ROOT, str(path)],
            capture_output=True,
            text=True,
            stdin=subprocess.DEVNULL,
            cwd="/",
            timeout=CHECK_TIMEOUT,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise JournalError(
            f"{data_file}: the check at start did not end within {CHECK_TIMEOUT:.0f} s "
            "(a hung file system?); the controller does not start on it"
        ) from None
    except OSError as exc:
        # No child may be started here (a sandbox, no process slot left): the check is
        # made in this process, as before there was a child, rather than refuse a start
        # the check would most likely allow; only a damaged page then kills the reader.
        log.warning("journal check at start made in-process (no child process: %s)", exc)
        return _answer(path)
    if done.returncode < 0:
        raise _killed(-done.returncode, data_file, advice)
    try:
        answer: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    except (IndexError, ValueError):
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise JournalError(
            f"{data_file}: the check at start failed (exit status {done.returncode}: {last})"
        ) from None
    return answer


def _killed(signum: int, data_file: Path, advice: str) -> JournalError:
    """The error for a child killed by signal ``signum``: a damaged page when reading
    it faulted (SIGBUS, SIGSEGV), else the check was stopped (an OOM kill, Ctrl-C, the
    service stopped), which says nothing about the journal."""
    try:
        name = signal.Signals(signum).name
    except ValueError:  # a real-time signal has no name
        name = f"signal {signum}"
    if signum in (signal.SIGBUS, signal.SIGSEGV):
        return JournalError(
            f"{data_file}: damaged: reading it killed the checking process ({name}): "
            f"a damaged page; {advice}"
        )
    return JournalError(
        f"{data_file}: the check at start was stopped ({name}); the controller does not "
        "start without it"
    )


def _answer(path: Path | str) -> dict[str, Any]:
    """verify's record checks of the journal in ``path``, as the child answers them."""
    try:
        report = verify(path, structure=False, references=False)
    except JournalError as exc:
        return {"error": exc.detail or str(exc)}
    counts = [report.facts, report.live, report.done, report.epoch, report.last_seq]
    return {"problems": list(report.problems), "counts": counts}


def _main(argv: list[str]) -> int:
    """The child: :func:`_answer` for the journal in ``argv[0]``, as one JSON line."""
    print(json.dumps(_answer(argv[0])))
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
