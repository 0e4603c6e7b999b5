"""The Standard Workload Format reader (``.swf``, ``.swf.gz``): :func:`read_swf`.

The Parallel Workloads Archive's format, version 2.2: header lines start with ``;``
(``; MaxProcs: 100``), each data line has 18 whitespace-separated fields, ``-1`` means
unknown. The file is read as a stream (line by line through ``gzip`` when the name ends
in ``.gz`` or the data starts with the gzip magic bytes), so memory holds the cleaned
jobs, never the text. Fields used (1-based): 1 job, 2 submit, 3 wait, 4 run time,
5 allocated procs, 8 requested procs, 9 requested time, 11 status, 12 user.

Cleaning rule, applied to each data line in file order (each skipped line is counted
once, under the first rule it fails, so ``lines == jobs + skipped_runtime +
skipped_procs``):

1. run time (field 4) <= 0 or unknown → skipped, counted in ``skipped_runtime``: a job
   that did not run has no work to simulate;
2. ``procs`` = requested procs (field 8) when > 0, else allocated procs (field 5),
   counted in ``used_allocated_procs`` (the CTC trace has -1 requested everywhere); the
   request is what a scheduler sees, the allocation is the next best thing;
   both <= 0 → skipped, counted in ``skipped_procs``;
3. ``procs`` above the header's ``MaxProcs`` → capped at ``MaxProcs``, counted in
   ``capped_procs`` (a job the machine could never run would stall a simulation);
4. ``requested_time`` = field 9 when > 0, else ``None`` (counted in
   ``no_requested_time``); ``wait`` = field 3 when >= 0, ``status`` = field 11 when
   >= 0, else ``None``; ``user`` = field 12 as text (``"unknown"`` for -1);
   ``id`` = field 1 as text; ``kind`` = ``"rigid"``, ``min_procs``/``max_procs`` = ``None``
   (SWF has no malleability; :mod:`.malleable` converts a share of jobs);
5. with ``limit``, reading stops after ``limit`` kept jobs (in file order);
6. the kept jobs are ordered by submit time. The archive's cleaned logs are already in
   order: the order is verified while reading (one comparison a line) and a stable sort
   runs only when it is broken (``stats["resorted"] == 1``). Submit times are then made
   relative to the first kept job's submit, which the header keeps as
   ``submit_offset`` (add ``header.unix_start_time`` for wall-clock time).

A malformed data line (not 18 fields; a field, kept or skipped line alike, that is not
an ASCII decimal number, ``-1.5e3`` or ``-1``, where only infinities and NaN are left to
the time checks; a submit, run or requested time that is infinite or beyond the
simulated clock's range,
:data:`~xce_resize_plugin.controllers.sim.events.MAX_SECONDS`; a kept job's negative
submit time, SWF's -1 for "unknown", which cannot be replayed) and a kept job whose id
an earlier kept job has (the simulator runs jobs by id) raise :class:`TraceError`
naming the file and line number: a trace that does not parse is not silently
shortened. So does a header ``MaxProcs`` that is not a positive integer
(``; MaxProcs: 338 (batch partition)`` is one), since it sizes the machine.

What is read is bounded, so that a small hostile file (a gzip bomb) is refused in a
fraction of a second rather than taking the memory or minutes: a name that is not a
regular file (a FIFO, ``/dev/zero`` behind a ``.swf`` link), a line longer than
:data:`MAX_LINE_CHARS`, a header of more than :data:`MAX_HEADER_LINES` lines or
:data:`MAX_HEADER_CHARS` characters, more than :data:`MAX_EMPTY_LINES` blank or
comment lines raise :class:`TraceError` too.
"""

from __future__ import annotations

import functools
import gzip
import io
import itertools
import math
import os
import re
import zlib
from collections.abc import Iterator, Sequence
from contextlib import ExitStack
from typing import IO

import attrs

from xce_resize_plugin.controllers.input_files import open_regular
from xce_resize_plugin.controllers.sim.events import MAX_SECONDS
from xce_resize_plugin.core.decimal_text import is_decimal_number
from xce_resize_plugin.simulation.gc_pause import gc_paused
from xce_resize_plugin.simulation.trace_types import (
    Source,
    Trace,
    TraceError,
    TraceHeader,
    TraceJob,
    check_limit,
)

# SWF 2.2 data lines have exactly this many fields.
_SWF_FIELDS = 18
#: The longest line read, in characters (64 KiB): a data line of 18 numbers is under
#: 200, a header comment a few hundred. A longer line (an endless ``/dev/zero``-like
#: stream, gigabytes without a line end in a ``.gz``) is refused once this much of it
#: is read, not held whole in memory (docs/simulation.md, "Limits on inputs").
MAX_LINE_CHARS = 64 << 10
#: The most header lines (``;`` lines before the first job) and their characters in
#: all: the archive's headers have some tens of lines and a few KiB. A gzip of a
#: million ``;`` lines is a few KB and would otherwise take gigabytes as header fields.
MAX_HEADER_LINES = 10_000
MAX_HEADER_CHARS = 1 << 20
#: The most lines without a job (blank, or ``;`` after the header) a trace may have:
#: the archive's logs have none to a few. Each costs a turn of the reading loop, so a
#: gzip of gigabytes of blank lines (a few MB) read for minutes before saying "no job";
#: a million of them take a fraction of a second.
MAX_EMPTY_LINES = 1_000_000
_GZIP_MAGIC = b"\x1f\x8b"
# A header key line is ";" + at most two blanks + an identifier + ":". Continuation
# lines are indented further (";              http://..."), which keeps "http:" in a
# continued value from being read as a key.
_HEADER_KEY = re.compile(r";[ \t]{0,2}([A-Za-z][A-Za-z0-9_]*):[ \t]*(.*)$")
_LEADING_INT = re.compile(r"\s*([-+]?\d+)")
# A count, optionally followed by a comment after a blank ("338 (batch partition)").
_COUNT = re.compile(r"\s*\+?\d+(?:\s.*)?", re.DOTALL)
# One SWF number in ASCII (core.decimal_text's number, written possessive: Python's
# float() also takes "1_0" and other scripts' digits).
_NUMBER = r"[-+]?+(?:[0-9]++(?:\.[0-9]*+)?+|\.[0-9]++)(?:[eE][-+]?+[0-9]++)?+"
# A data line of 18 such numbers, checked in one C call (possessive: no backtracking;
# about 1.3 us a line). A line it refuses is looked at field by field (_odd_fields).
_DATA_LINE = re.compile(rf"[ \t]*+(?:{_NUMBER}[ \t]++){{{_SWF_FIELDS - 1}}}+{_NUMBER}\s*+")
# Infinities and NaN as float() writes them: kept to the checks that name the field's
# meaning (an infinite run time is "beyond", a NaN requested time is unknown).
_NOT_FINITE = re.compile(r"[-+]?(?:nan|inf|infinity)", re.IGNORECASE)
#: The fields (0-based) that may be written as an infinity or NaN: the times the checks
#: name (submit, run, requested). Any other such field is no SWF number.
_TIME_FIELDS = frozenset({1, 3, 8})
#: The counts read as integers (allocated and requested processors, status), and the
#: form int() reads them in (the job number is one too: _check_kept).
_WHOLE_FIELDS = (7, 4, 10)
_WHOLE = re.compile(r"[-+]?[0-9]+")
#: What the reader counts (``trace.stats``).
Stats = dict[str, int]
#: The SWF fields by number (1-based), as a refused line's message names them.
_FIELD_NAMES = (
    "job number",
    "submit time",
    "wait time",
    "run time",
    "allocated processors",
    "average CPU time",
    "used memory",
    "requested processors",
    "requested time",
    "requested memory",
    "status",
    "user id",
    "group id",
    "executable number",
    "queue number",
    "partition number",
    "preceding job number",
    "think time",
)


def _source_name(source: Source) -> str:
    if isinstance(source, str | os.PathLike):
        return os.fspath(source)
    name = getattr(source, "name", None)
    return name if isinstance(name, str) else "<stream>"


def _open_text(source: Source, name: str, stack: ExitStack) -> IO[str]:
    """A text stream over ``source``, gunzipped when it is gzip (by name or magic)."""
    if isinstance(source, io.TextIOBase):
        return source  # type: ignore[return-value]  # TextIOBase is IO[str] in practice
    if isinstance(source, str | os.PathLike):
        # A regular file only: a FIFO would block, a device (/dev/zero) never end.
        binary: IO[bytes] = stack.enter_context(open_regular(source))
        gz = name.lower().endswith(".gz")
        if gz and binary.peek(2)[:2] != _GZIP_MAGIC:  # type: ignore[attr-defined]
            # Said here, so that a "Not a gzipped file" while reading is data after
            # the last gzip member (read_swf says so).
            raise gzip.BadGzipFile("not gzip data, though the name ends in .gz")
    else:
        binary = source  # type: ignore[assignment]  # not text: a binary stream
        gz = False
    if not gz:
        peek = getattr(binary, "peek", None)
        if peek is not None:
            head = peek(2)[:2]
        elif binary.seekable():
            pos = binary.tell()
            head = binary.read(2)
            binary.seek(pos)
        elif isinstance(binary, io.RawIOBase):
            # A pipe-like raw stream: a buffer gives it the peek the check needs.
            buffered = io.BufferedReader(binary)
            stack.callback(buffered.detach)  # keeps the caller's stream open
            binary = buffered  # a binary stream too
            head = buffered.peek(2)[:2]
        else:
            head = b""  # cannot look ahead: treat as plain text
        gz = head == _GZIP_MAGIC
    if gz:
        gzf = gzip.GzipFile(fileobj=binary, mode="rb")
        stack.callback(gzf.close)  # closes the decompressor only, not ``binary``
        binary = gzf  # type: ignore[assignment]  # GzipFile is a binary stream
    # errors="replace": a stray non-UTF-8 byte in a header comment must not stop the
    # read; in a data line it fails the number conversion and is reported there.
    # utf-8-sig: a byte-order mark (some editors write one) is not part of line 1.
    text = io.TextIOWrapper(binary, encoding="utf-8-sig", errors="replace", newline=None)
    # Detach rather than close: closing the wrapper would close a caller's stream.
    stack.callback(text.detach)
    return text


def _leading_int(value: str | None) -> int | None:
    if value is None:
        return None
    m = _LEADING_INT.match(value)
    return int(m.group(1)) if m else None


def _parse_header(lines: Sequence[str]) -> TraceHeader:
    """Build the header from the leading ``;`` lines (without line ends)."""
    fields: list[list[str]] = []
    for line in lines:
        m = _HEADER_KEY.match(line)
        if m:
            fields.append([m.group(1), m.group(2).rstrip()])
            continue
        rest = line[1:].strip()
        if not rest:
            # A bare ";" ends a value: the next indented line starts nothing new.
            fields.append(["", ""])
        elif fields and fields[-1][0]:
            prev = fields[-1]
            prev[1] = f"{prev[1]}\n{rest}" if prev[1] else rest
        else:
            fields.append(["", rest])
    pairs = tuple((k, v) for k, v in fields if k)
    h = TraceHeader(format="swf", fields=pairs)

    def first(key: str) -> str | None:
        return h.get(key)

    info: list[str] = []
    for v in h.get_all("Information"):
        info.extend(v.split("\n"))
    return attrs.evolve(
        h,
        version=first("Version"),
        computer=first("Computer"),
        installation=first("Installation"),
        acknowledge=first("Acknowledge"),
        information=tuple(info),
        conversion=first("Conversion"),
        max_jobs=_leading_int(first("MaxJobs")),
        max_records=_leading_int(first("MaxRecords")),
        max_nodes=_leading_int(first("MaxNodes")),
        max_procs=_leading_int(first("MaxProcs")),
        unix_start_time=_leading_int(first("UnixStartTime")),
        time_zone=_leading_int(first("TimeZone")),
        time_zone_string=first("TimeZoneString"),
        start_time=first("StartTime"),
        end_time=first("EndTime"),
        notes=h.get_all("Note"),
        queues=h.get_all("Queue"),
        partitions=h.get_all("Partition"),
    )


@gc_paused
def read_swf(source: Source, *, limit: int | None = None) -> Trace:
    """Read an SWF trace (plain or gzip) with the cleaning rule of the module docstring.

    ``source`` is a path, a binary stream (gzip detected by magic bytes) or a text
    stream. ``limit`` keeps at most that many cleaned jobs (the first in the file).
    ``trace.stats`` counts ``lines`` (data lines read), ``jobs`` (kept),
    ``skipped_runtime``, ``skipped_procs``, ``capped_procs``, ``used_allocated_procs``,
    ``no_requested_time``, ``comment_lines`` (``;`` lines after the header) and
    ``resorted`` (1 when the file was not in submit order).
    """
    name = _source_name(source)
    check_limit(limit, name)
    stats = {
        "lines": 0,
        "jobs": 0,
        "skipped_runtime": 0,
        "skipped_procs": 0,
        "capped_procs": 0,
        "used_allocated_procs": 0,
        "no_requested_time": 0,
        "comment_lines": 0,
        "resorted": 0,
    }
    jobs: list[TraceJob] = []
    with ExitStack() as stack:
        try:
            f = _open_text(source, name, stack)
            header, first_line, lineno = _read_swf_header(f, name)
            _check_max_procs(header, name)
            base = _read_swf_jobs(f, first_line, lineno, header, name, limit, stats, jobs)
        except gzip.BadGzipFile as exc:
            if str(exc).startswith("Not a gzipped file"):  # the first member was gzip
                why = f"trailing data after the gzip stream is not gzip ({exc})"
                raise TraceError(f"cannot read: {why}", source=name) from exc
            raise TraceError(f"cannot read: {exc}", source=name) from exc
        except (OSError, EOFError, zlib.error) as exc:  # BadGzipFile is an OSError
            raise TraceError(f"cannot read: {exc}", source=name) from exc
    if stats["resorted"]:
        jobs.sort(key=_submit_key)  # stable: equal submits keep file order
        # Submits were made relative to the first kept line; after the sort an earlier
        # job comes first (negative), and it becomes the new zero.
        shift = jobs[0].submit
        if shift != 0.0:
            jobs = [attrs.evolve(j, submit=j.submit - shift) for j in jobs]
            base += shift
    return Trace(attrs.evolve(header, submit_offset=base), jobs, stats, name)


def _submit_key(job: TraceJob) -> float:
    return job.submit


def _lines(f: IO[str]) -> Iterator[str]:
    """``f``'s lines, each read with a bound (:data:`MAX_LINE_CHARS`): a longer one
    comes as pieces, the first of which :func:`_too_long` refuses. (``iter`` over a
    ``partial``: the loop stays in C, as ``for line in f`` does.)"""
    return iter(functools.partial(f.readline, MAX_LINE_CHARS + 1), "")


def _check_length(name: str, lineno: int, line: str) -> None:
    """Refuse a piece :func:`_lines` cut from a line longer than the limit."""
    if len(line) > MAX_LINE_CHARS and not line.endswith("\n"):
        why = f"a line longer than {MAX_LINE_CHARS:,} characters"
        raise TraceError(why, source=name, line=lineno)


def _too_many_empty(name: str, lineno: int) -> TraceError:
    why = f"more than {MAX_EMPTY_LINES:,} blank or comment lines: not an SWF trace"
    return TraceError(why, source=name, line=lineno)


def _no_job(name: str, lineno: int, parts: Sequence[str], empty: int, stats: Stats) -> int:
    """Count a blank or comment line of the data (``empty`` so far, this one not yet);
    refuse one beyond :data:`MAX_EMPTY_LINES`."""
    if empty >= MAX_EMPTY_LINES:
        raise _too_many_empty(name, lineno)
    if parts:
        stats["comment_lines"] += 1
    return empty + 1


def _read_swf_header(f: IO[str], name: str) -> tuple[TraceHeader, str | None, int]:
    """Consume the leading ``;`` and blank lines; return the header and the first data
    line. At most :data:`MAX_HEADER_LINES` header lines of :data:`MAX_HEADER_CHARS`."""
    header_lines: list[str] = []
    chars = 0
    blank = 0
    lineno = 0
    for lineno, raw in enumerate(_lines(f), 1):  # lineno is returned
        _check_length(name, lineno, raw)
        line = raw.rstrip("\r\n")
        if line.startswith(";"):
            header_lines.append(line)
            chars += len(line)
            if len(header_lines) > MAX_HEADER_LINES or chars > MAX_HEADER_CHARS:
                why = (
                    f"the header (the ';' lines before the first job) is longer than "
                    f"{MAX_HEADER_LINES:,} lines or {MAX_HEADER_CHARS:,} characters"
                )
                raise TraceError(why, source=name, line=lineno)
        elif line.strip():
            return _parse_header(header_lines), line, lineno
        else:
            blank += 1
            if blank > MAX_EMPTY_LINES:
                raise _too_many_empty(name, lineno)
    return _parse_header(header_lines), None, lineno


def _check_max_procs(header: TraceHeader, name: str) -> None:
    """A ``MaxProcs`` header line sizes the machine: it must be a positive integer."""
    raw = header.get("MaxProcs")
    if raw is None:
        return
    if not _COUNT.fullmatch(raw) or not header.max_procs or header.max_procs < 1:
        raise TraceError(f"header MaxProcs {raw!r} is not a positive integer", source=name)


def _bad_line(name: str, lineno: int, line: str, why: str) -> TraceError:
    shown = line.strip()
    if len(shown) > 120:
        shown = shown[:117] + "..."
    return TraceError(f"malformed SWF data line ({why}): {shown!r}", source=name, line=lineno)


def _beyond(name: str, lineno: int, line: str, parts: Sequence[str]) -> TraceError:
    """The error for a line whose submit, run or requested time is beyond MAX_SECONDS."""
    what, index = next(
        (what, index)
        for what, index in (("submit time", 1), ("run time", 3), ("requested time", 8))
        if abs(float(parts[index])) > MAX_SECONDS
    )
    value = parts[index]
    shown = repr(value) if len(value) <= 24 else f"of {len(value):,} digits"
    why = f"{what} {shown} is beyond {MAX_SECONDS:.0e} s"
    return _bad_line(name, lineno, line, why)


def _odd_fields(name: str, lineno: int, line: str, parts: Sequence[str]) -> None:
    """A line the one-call check refused: :class:`TraceError` naming the first field
    that is not an SWF number, unless the only odd ones are infinities or NaN (the
    time checks name those, or take a NaN requested time as unknown)."""
    if len(parts) != _SWF_FIELDS:
        raise _bad_line(name, lineno, line, f"{len(parts)} fields, SWF has {_SWF_FIELDS}")
    for number, (part, what) in enumerate(zip(parts, _FIELD_NAMES, strict=True), 1):
        if is_decimal_number(part):
            continue
        if number - 1 in _TIME_FIELDS and _NOT_FINITE.fullmatch(part) is not None:
            continue
        raise _bad_line(name, lineno, line, f"field {number} ({what}) {part!r} is not a number")


def _not_whole(name: str, lineno: int, line: str, parts: Sequence[str]) -> TraceError:
    """The error for a kept line whose count (processors, status) ``int()`` refused:
    every field is a number by then, so it is one with a fraction or an exponent."""
    for index in _WHOLE_FIELDS:  # in the order the reader converts them
        try:
            int(parts[index])
        except ValueError:
            break
    else:
        raise AssertionError("_not_whole: every count reads")
    what = f"field {index + 1} ({_FIELD_NAMES[index]})"
    if _WHOLE.fullmatch(parts[index]):  # digits int() will not read: thousands of them
        return _bad_line(name, lineno, line, f"{what} has {len(parts[index]):,} digits")
    return _bad_line(name, lineno, line, f"{what} {parts[index]!r} is not a whole number")


def _check_kept(
    name: str,
    lineno: int,
    line: str,
    parts: Sequence[str],
    times: tuple[float, float, float],
    seen: dict[str, int],
) -> None:
    """A kept line's submit, run and requested ``times`` are finite and within
    :data:`MAX_SECONDS`, and its job id is on no earlier kept line (``seen``: each id's
    line, this one's added)."""
    submit, runtime, req_time = times
    if not math.isfinite(submit):
        if _NOT_FINITE.fullmatch(parts[1]) is None:  # digits float() overflows on
            raise _beyond(name, lineno, line, parts)
        raise _bad_line(name, lineno, line, "submit time is not finite")
    if runtime > MAX_SECONDS or req_time > MAX_SECONDS or abs(submit) > MAX_SECONDS:
        raise _beyond(name, lineno, line, parts)
    if submit < 0:
        # SWF's -1 is "unknown": a job without an arrival cannot be replayed, and made
        # the first it would move every other job later by the trace's start.
        why = f"submit time {parts[1]!r} is negative (SWF's -1: unknown)"
        raise _bad_line(name, lineno, line, why)
    job = parts[0]
    # Every field is an ASCII number by now, so isdigit() is "ASCII digits only".
    if not job.isdigit():
        why = f"field 1 (job number) {job!r} is not a whole number"
        raise _bad_line(name, lineno, line, why)
    # By value: "0100" and "100" are the same job number.
    number = job.lstrip("0") or "0"
    if seen.setdefault(number, lineno) != lineno:
        raise TraceError(
            f"job id {parts[0]!r} is already on line {seen[number]}", source=name, line=lineno
        )


def _read_swf_jobs(
    f: IO[str],
    first_line: str | None,
    first_lineno: int,
    header: TraceHeader,
    name: str,
    limit: int | None,
    stats: Stats,
    jobs: list[TraceJob],
) -> float:
    """The hot loop: one ``split`` and a few conversions a line, appending to ``jobs``.
    Returns the raw submit time of the first kept job (0.0 when none is kept). What
    the cleaning skips or adjusts is counted in ``stats`` as it happens (the rare
    paths); ``lines`` is then the kept jobs plus the skipped lines."""
    if first_line is None or limit == 0:
        return 0.0
    max_procs = header.max_procs if header.max_procs and header.max_procs > 0 else None
    base: float | None = None
    prev = -math.inf
    kept = 0
    # One str per user instead of one per job; -1 (unknown) reads "unknown".
    users: dict[str, str] = {"-1": "unknown"}
    seen: dict[str, int] = {}  # each kept job id's line (_check_kept)
    append = jobs.append
    # chain + enumerate stay in C: a generator here costs a frame switch a line.
    cap, empty = MAX_LINE_CHARS, 0  # empty: blank and comment lines (_no_job)
    for lineno, line in enumerate(itertools.chain((first_line,), _lines(f)), first_lineno):
        if len(line) > cap:
            _check_length(name, lineno, line)
        parts = line.split()
        if not parts or parts[0].startswith(";"):
            empty = _no_job(name, lineno, parts, empty, stats)
            continue
        if _DATA_LINE.fullmatch(line) is None:
            _odd_fields(name, lineno, line, parts)
        try:
            runtime = float(parts[3])
            if not runtime > 0:  # also catches NaN
                stats["skipped_runtime"] += 1
                continue
            procs, allocated = int(parts[7]), int(parts[4])  # both: every count is whole
            if procs <= 0:
                procs = allocated
                if procs <= 0:
                    stats["skipped_procs"] += 1
                    continue
                stats["used_allocated_procs"] += 1
            submit = float(parts[1])
            wait = float(parts[2])
            req_time = float(parts[8])
            status = int(parts[10])
        except ValueError:
            raise _not_whole(name, lineno, line, parts) from None
        _check_kept(name, lineno, line, parts, (submit, runtime, req_time), seen)
        if max_procs is not None and procs > max_procs:
            procs = max_procs
            stats["capped_procs"] += 1
        if not req_time > 0:  # NaN too: unknown, as -1
            stats["no_requested_time"] += 1
        if base is None:
            base = submit
        if submit < prev:
            stats["resorted"] = 1
        prev = submit
        u = users.setdefault(parts[11], parts[11])
        req = req_time if req_time > 0 else None
        waited = wait if wait >= 0 else None
        code = status if status >= 0 else None
        append(
            TraceJob(
                parts[0], submit - base, runtime, procs, req, u, "rigid", None, None, waited, code
            )
        )
        kept += 1
        if limit is not None and kept >= limit:
            break
    stats["jobs"] = kept
    stats["lines"] = kept + stats["skipped_runtime"] + stats["skipped_procs"]
    return 0.0 if base is None else base
