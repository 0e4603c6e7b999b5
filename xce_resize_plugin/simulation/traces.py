"""Readers for real workload traces: the Standard Workload Format and ElastiSim jobs.

Pure parsing: no simulation, no randomness, no global state. Every reader returns a
:class:`Trace` — the header (:class:`TraceHeader`), the cleaned jobs (:class:`TraceJob`,
sorted by submit time, submit times relative to the first job) and counters of what the
cleaning did (``trace.stats``). :func:`read_trace` picks the reader by file name.

SWF (``.swf``, ``.swf.gz``) — :func:`read_swf`
================================================

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

A malformed data line (not 18 fields, a field that is not a number) raises
:class:`TraceError` naming the file and line number: a trace that does not parse is
not silently shortened.

ElastiSim (``jobs.json``) — :func:`read_elastisim`
===================================================

ElastiSim's job file: ``{"jobs": [{"type", "submit_time", "num_nodes" |
"num_nodes_min"/"num_nodes_max", "application_model", "arguments", "walltime"?}, ...]}``.
One node is one proc here. Types: ``rigid`` → rigid with ``min = max = procs =
num_nodes`` (set, so that the malleable conversion keeps it rigid: ElastiSim jobs keep
their own type); ``moldable`` → moldable with ElastiSim's range, ``procs = num_nodes_max``;
``malleable``, ``evolving`` and ``adaptive`` → malleable with ElastiSim's range,
``procs = num_nodes_max`` (the embedded simulator has no application-initiated resize
requests, so evolving jobs become scheduler-driven malleable ones; ``stats`` keeps the
original type counts). ``id`` is the job's 0-based index in the file (ElastiSim's own
numbering); ``requested_time`` is ``walltime`` when > 0; ``user`` is ``"elastisim"``.

ElastiSim computes a run time from the job's application model. The reader derives a
representative one the same way, at ``procs`` nodes, counting compute only:

- the model file is the job's ``application_model`` path, looked up as given, relative to
  ``jobs.json``'s directory, then by file name beside ``jobs.json``; when none exists the
  example project's model is assumed (``iterations`` phases of one ``cpu`` task of
  ``flops/num_nodes^alpha`` flops per node), counted in ``stats["default_model"]``;
- time = the sum over ``on_init`` (once) and ``phases`` (times their ``iterations``)
  of each task's time times its ``iterations`` (default 1; ``sequence`` tasks nest);
  a ``cpu`` task takes ``flops / node_flops`` seconds with the ``uniform`` pattern
  (every node runs ``flops``), ``flops / n / node_flops`` with ``total``, the largest
  entry with ``vector``; ``busy_wait`` and ``idle`` take their ``delay``;
- I/O, communication and ``gpu`` tasks count 0, so the run time is a lower bound of
  ElastiSim's: on the example project the PFS traffic alone would add a median 5 %,
  23 % at the 90th percentile, and more for a few jobs with little compute;
  ``on_reconfiguration``/``on_expansion`` are left to the simulator's reconfiguration
  cost;
- values are numbers or arithmetic expressions (``+ - * / % ^`` and parentheses) over the
  job's ``arguments``, ``num_nodes``, ``num_gpus_per_node`` and ``num_gpus``;
- ``node_flops`` comes from the argument, else from the SimGrid platform named by
  ``configuration.json`` beside ``jobs.json`` (the first ``<cluster>``'s ``speed``; its
  ``radical`` gives ``header.max_nodes``), else 1e11 flop/s (the example's 100 Gf).

A missing or wrong required key, an unknown type, an expression that does not evaluate
or a model that yields no compute time raises :class:`TraceError` naming the job index.
"""

from __future__ import annotations

import gzip
import io
import itertools
import json
import math
import os
import re
import xml.etree.ElementTree as ET
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import IO, Any, Literal, TypeAlias

import attrs

from xce_resize_plugin.errors import ConfigError

__all__ = [
    "DEFAULT_NODE_FLOPS",
    "Trace",
    "TraceError",
    "TraceHeader",
    "TraceJob",
    "TraceKind",
    "read_elastisim",
    "read_swf",
    "read_trace",
]

TraceKind: TypeAlias = Literal["rigid", "moldable", "malleable"]

#: Node speed (flop/s) assumed for ElastiSim traces without a platform: the example
#: project's 100 Gf nodes.
DEFAULT_NODE_FLOPS = 1e11

# SWF 2.2 data lines have exactly this many fields.
_SWF_FIELDS = 18
_GZIP_MAGIC = b"\x1f\x8b"
# A header key line is ";" + at most two blanks + an identifier + ":". Continuation
# lines are indented further (";              http://..."), which keeps "http:" in a
# continued value from being read as a key.
_HEADER_KEY = re.compile(r";[ \t]{0,2}([A-Za-z][A-Za-z0-9_]*):[ \t]*(.*)$")
_LEADING_INT = re.compile(r"\s*([-+]?\d+)")

Source: TypeAlias = "str | os.PathLike[str] | IO[bytes] | IO[str]"


class TraceError(ConfigError):
    """A trace file cannot be read; the detail names the file and the line or job."""

    message = "Trace error"

    def __init__(
        self,
        reason: str,
        *,
        source: str | None = None,
        line: int | None = None,
        job_index: int | None = None,
    ) -> None:
        self.source = source
        self.line = line
        self.job_index = job_index
        self.reason = reason
        where = source or "<trace>"
        if line is not None:
            where = f"{where}:{line}"
        if job_index is not None:
            where = f"{where}: job {job_index}"
        super().__init__(f"{where}: {reason}")


@attrs.frozen
class TraceJob:
    """One cleaned job of a trace.

    Times are seconds; ``submit`` is relative to the trace's first job (0 for it).
    ``procs`` is the size to run it at; ``min_procs``/``max_procs`` are set only when the
    trace itself says how flexible the job is (ElastiSim), ``None`` when it does not
    (SWF): the malleable conversion decides for those. ``wait`` and ``status`` are the
    recorded values, for comparison with a simulation.
    """

    id: str
    submit: float
    runtime: float
    procs: int
    requested_time: float | None = None
    user: str = "unknown"
    kind: TraceKind = "rigid"
    min_procs: int | None = None
    max_procs: int | None = None
    wait: float | None = None
    status: int | None = None


@attrs.frozen
class TraceHeader:
    """What a trace says about itself.

    For SWF the named attributes are the standard header keys; ``fields`` keeps every
    ``Key: value`` line in file order (repeated keys such as ``Queue`` and ``Note``
    included; continuation lines joined to their value with a newline). ``notes`` are
    the ``Note`` values. ``submit_offset`` is the original submit time of the first
    kept job (output submit times are relative to it).
    """

    format: Literal["swf", "elastisim"]
    version: str | None = None
    computer: str | None = None
    installation: str | None = None
    acknowledge: str | None = None
    information: tuple[str, ...] = ()
    conversion: str | None = None
    max_jobs: int | None = None
    max_records: int | None = None
    max_nodes: int | None = None
    max_procs: int | None = None
    unix_start_time: int | None = None
    time_zone: int | None = None
    time_zone_string: str | None = None
    start_time: str | None = None
    end_time: str | None = None
    notes: tuple[str, ...] = ()
    queues: tuple[str, ...] = ()
    partitions: tuple[str, ...] = ()
    fields: tuple[tuple[str, str], ...] = ()
    submit_offset: float = 0.0

    def get(self, key: str) -> str | None:
        """The first value of header key ``key`` (case-insensitive), or ``None``."""
        values = self.get_all(key)
        return values[0] if values else None

    def get_all(self, key: str) -> tuple[str, ...]:
        """Every value of header key ``key`` (case-insensitive), in file order."""
        k = key.lower()
        return tuple(v for name, v in self.fields if name.lower() == k)


class Trace:
    """A read trace: ``header``, ``jobs`` (sorted by submit), ``stats`` and ``source``.

    Iterating yields the jobs; ``len()`` is their number. The jobs are held in memory
    (about 250 bytes each: a year-long trace is tens of MB) because the submit-order
    guarantee needs the whole trace before the first job can be handed out.
    """

    __slots__ = ("header", "jobs", "source", "stats")

    def __init__(
        self,
        header: TraceHeader,
        jobs: Sequence[TraceJob],
        stats: Mapping[str, int],
        source: str,
    ) -> None:
        self.header = header
        self.jobs: tuple[TraceJob, ...] = tuple(jobs)
        self.stats: dict[str, int] = dict(stats)
        self.source = source

    def __iter__(self) -> Iterator[TraceJob]:
        return iter(self.jobs)

    def __len__(self) -> int:
        return len(self.jobs)

    def __repr__(self) -> str:
        return f"Trace({self.source!r}, {len(self.jobs)} jobs, stats={self.stats!r})"


# ----------------------------------------------------------------------------- dispatch


def read_trace(path: str | os.PathLike[str], limit: int | None = None) -> Trace:
    """Read a trace, choosing the reader by name.

    ``.swf`` and ``.swf.gz`` → :func:`read_swf`; ``.json`` → :func:`read_elastisim`; a
    directory holding ``jobs.json`` (an ElastiSim project's input) → its ``jobs.json``.
    Anything else raises :class:`TraceError`.
    """
    p = Path(path)
    name = p.name.lower()
    if p.is_dir():
        jobs = p / "jobs.json"
        if jobs.is_file():
            return read_elastisim(jobs, limit=limit)
        raise TraceError("a directory trace must contain jobs.json", source=str(p))
    if name.endswith((".swf", ".swf.gz")):
        return read_swf(p, limit=limit)
    if name.endswith(".json"):
        return read_elastisim(p, limit=limit)
    raise TraceError(
        "unknown trace format (expected .swf, .swf.gz, an ElastiSim .json or a directory "
        "with jobs.json)",
        source=str(p),
    )


def _check_limit(limit: int | None, source: str) -> None:
    if limit is not None and (isinstance(limit, bool) or limit < 0):
        raise TraceError(f"limit must be a non-negative integer, not {limit!r}", source=source)


# ---------------------------------------------------------------------------------- SWF


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
        binary: IO[bytes] = stack.enter_context(open(source, "rb"))  # noqa: SIM115
        gz = name.lower().endswith(".gz")
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
    text = io.TextIOWrapper(binary, encoding="utf-8", errors="replace", newline=None)
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
    _check_limit(limit, name)
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
            header, first_line, lineno = _read_swf_header(f)
            base = _read_swf_jobs(f, first_line, lineno, header, name, limit, stats, jobs)
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


def _read_swf_header(f: IO[str]) -> tuple[TraceHeader, str | None, int]:
    """Consume the leading ``;`` and blank lines; return the header and the first data line."""
    header_lines: list[str] = []
    lineno = 0
    for raw in f:
        lineno += 1
        line = raw.rstrip("\r\n")
        if line.startswith(";"):
            header_lines.append(line)
        elif line.strip():
            return _parse_header(header_lines), line, lineno
    return _parse_header(header_lines), None, lineno


def _bad_line(name: str, lineno: int, line: str, why: str) -> TraceError:
    shown = line.strip()
    if len(shown) > 120:
        shown = shown[:117] + "..."
    return TraceError(f"malformed SWF data line ({why}): {shown!r}", source=name, line=lineno)


def _read_swf_jobs(
    f: IO[str],
    first_line: str | None,
    first_lineno: int,
    header: TraceHeader,
    name: str,
    limit: int | None,
    stats: dict[str, int],
    jobs: list[TraceJob],
) -> float:
    """The hot loop: one ``split`` and a few conversions a line, appending to ``jobs``.

    Returns the raw submit time of the first kept job (0.0 when none is kept). What
    the cleaning skips or adjusts is counted in ``stats`` as it happens (the rare
    paths); ``lines`` is then the kept jobs plus the skipped lines.
    """
    if first_line is None or limit == 0:
        return 0.0
    max_procs = header.max_procs if header.max_procs and header.max_procs > 0 else None
    base: float | None = None
    prev = -math.inf
    kept = 0
    # One str per user instead of one per job; -1 (unknown) reads "unknown".
    users: dict[str, str] = {"-1": "unknown"}
    append = jobs.append
    # chain + enumerate stay in C: a generator here costs a frame switch a line.
    for lineno, line in enumerate(itertools.chain((first_line,), f), first_lineno):
        parts = line.split()
        if not parts:
            continue
        if parts[0].startswith(";"):
            stats["comment_lines"] += 1
            continue
        if len(parts) != _SWF_FIELDS:
            raise _bad_line(name, lineno, line, f"{len(parts)} fields, SWF has {_SWF_FIELDS}")
        try:
            runtime = float(parts[3])
            if not runtime > 0:  # also catches NaN
                stats["skipped_runtime"] += 1
                continue
            procs = int(parts[7])
            if procs <= 0:
                procs = int(parts[4])
                if procs <= 0:
                    stats["skipped_procs"] += 1
                    continue
                stats["used_allocated_procs"] += 1
            submit = float(parts[1])
            wait = float(parts[2])
            req_time = float(parts[8])
            status = int(parts[10])
        except ValueError as exc:
            raise _bad_line(name, lineno, line, f"not a number: {exc}") from None
        if not math.isfinite(submit):
            raise _bad_line(name, lineno, line, "submit time is not finite")
        if max_procs is not None and procs > max_procs:
            procs = max_procs
            stats["capped_procs"] += 1
        if req_time <= 0:
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


# ---------------------------------------------------------------------------- ElastiSim

_ELASTISIM_KINDS: dict[str, TraceKind] = {
    "rigid": "rigid",
    "moldable": "moldable",
    "malleable": "malleable",
    "evolving": "malleable",
    "adaptive": "malleable",
}

# The example project's model, assumed when a job's model file is not found.
_DEFAULT_MODEL: dict[str, Any] = {
    "phases": [
        {
            "iterations": "iterations",
            "tasks": [
                {
                    "type": "cpu",
                    "flops": "flops/num_nodes^alpha",
                    "computation_pattern": "uniform",
                }
            ],
        }
    ]
}

_TOKEN = re.compile(
    r"\s*(?:(?P<num>(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)|(?P<name>[A-Za-z_]\w*)|(?P<op>[-+*/%^()]))"
)

Env: TypeAlias = Mapping[str, float]
Compiled: TypeAlias = Callable[[Env], float]


class _ExprError(ValueError):
    """An expression that does not parse or evaluate; turned into a TraceError."""


def _compile(text: str) -> Compiled:
    """Compile an arithmetic expression (numbers, names, ``+ - * / % ^``, parentheses).

    ``^`` is a right-associative power binding tighter than unary minus (``-2^2`` is -4,
    the mathematical reading). ElastiSim's own evaluator knows more (functions,
    comparisons, ``?:``); those raise here, and the example project does not need them.
    Names are looked up in the environment at call time, so one compiled expression
    serves every job.
    """
    return _ExprParser(text).parse()


def _tokenize(text: str) -> list[tuple[str, str]]:
    """The expression's tokens: ``(kind, text)`` with kind ``num``, ``name`` or ``op``."""
    tokens: list[tuple[str, str]] = []
    pos = 0
    text_end = len(text.rstrip())
    while pos < text_end:
        m = _TOKEN.match(text, pos)
        if m is None or m.end() == pos:
            raise _ExprError(f"cannot parse {text!r} at {text[pos:].strip()!r}")
        kind = m.lastgroup
        assert kind is not None
        tokens.append((kind, m.group(kind)))
        pos = m.end()
    return tokens


def _binary(op: str, a: Compiled, b: Compiled) -> Compiled:
    """The compiled ``a op b``."""
    if op == "+":
        return lambda env: a(env) + b(env)
    if op == "-":
        return lambda env: a(env) - b(env)
    if op == "*":
        return lambda env: a(env) * b(env)
    if op == "/":
        return lambda env: a(env) / b(env)
    if op == "%":
        return lambda env: math.fmod(a(env), b(env))
    return lambda env: float(a(env) ** b(env))


class _ExprParser:
    """Recursive descent over one expression's tokens, one method per grammar rule::

    expr  = term (("+" | "-") term)*
    term  = unary (("*" | "/" | "%") unary)*
    unary = ("+" | "-") unary | power
    power = atom ("^" unary)?
    atom  = number | name | "(" expr ")"
    """

    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens = _tokenize(text)
        self.at = 0

    def parse(self) -> Compiled:
        compiled = self.expr()
        if self.at != len(self.tokens):
            raise _ExprError(f"unexpected {self.tokens[self.at][1]!r} in {self.text!r}")
        return compiled

    def peek(self) -> tuple[str, str] | None:
        return self.tokens[self.at] if self.at < len(self.tokens) else None

    def take(self) -> tuple[str, str]:
        if self.at >= len(self.tokens):
            raise _ExprError(f"unexpected end of {self.text!r}")
        self.at += 1
        return self.tokens[self.at - 1]

    def expr(self) -> Compiled:
        node = self.term()
        while (t := self.peek()) is not None and t[1] in "+-" and t[0] == "op":
            self.take()
            node = _binary(t[1], node, self.term())
        return node

    def term(self) -> Compiled:
        node = self.unary()
        while (t := self.peek()) is not None and t[0] == "op" and t[1] in "*/%":
            self.take()
            node = _binary(t[1], node, self.unary())
        return node

    def unary(self) -> Compiled:
        t = self.peek()
        if t is not None and t[0] == "op" and t[1] in "+-":
            self.take()
            inner = self.unary()
            return (lambda env: -inner(env)) if t[1] == "-" else inner
        return self.power()

    def power(self) -> Compiled:
        base = self.atom()
        t = self.peek()
        if t is not None and t == ("op", "^"):
            self.take()
            return _binary("^", base, self.unary())
        return base

    def atom(self) -> Compiled:
        kind, value = self.take()
        if kind == "num":
            number = float(value)
            return lambda env: number
        if kind == "name":
            text = self.text

            def lookup(env: Env) -> float:
                try:
                    return env[value]
                except KeyError:
                    raise _ExprError(f"unknown variable {value!r} in {text!r}") from None

            return lookup
        if value == "(":
            inner = self.expr()
            if self.take() != ("op", ")"):
                raise _ExprError(f"missing ')' in {self.text!r}")
            return inner
        raise _ExprError(f"unexpected {value!r} in {self.text!r}")


class _ModelEvaluator:
    """Compute time of an ElastiSim application model for one job at a node count.

    Compiled expressions are cached by text, so a workload sharing one model compiles
    each expression once.
    """

    def __init__(self, node_flops: float) -> None:
        self.node_flops = node_flops
        self._cache: dict[str, Compiled] = {}

    def value(self, raw: Any, env: Env, what: str) -> float:
        if isinstance(raw, bool):
            raise _ExprError(f"{what} is a boolean")
        if isinstance(raw, int | float):
            return float(raw)
        if isinstance(raw, str):
            fn = self._cache.get(raw)
            if fn is None:
                fn = self._cache[raw] = _compile(raw)
            try:
                result = fn(env)
            except (ArithmeticError, ValueError, TypeError) as exc:
                if isinstance(exc, _ExprError):
                    raise
                raise _ExprError(f"{what} {raw!r}: {exc}") from None
            if isinstance(result, complex) or not math.isfinite(result):
                raise _ExprError(f"{what} {raw!r} is not a finite number")
            return result
        raise _ExprError(f"{what} must be a number or an expression, not {raw!r}")

    def seconds(self, model: Mapping[str, Any], env: Env) -> float:
        total = 0.0
        for key in ("on_init", "on_termination"):
            block = model.get(key)
            if block is not None:
                tasks = block.get("tasks", []) if isinstance(block, Mapping) else block
                total += self._tasks(tasks, env)
        phases = model.get("phases")
        if not isinstance(phases, list):
            raise _ExprError("application model has no 'phases' list")
        for phase in phases:
            if not isinstance(phase, Mapping):
                raise _ExprError("a phase is not an object")
            # The docs give 0 as the default; a phase listed without iterations is
            # meant to run, and the example always sets it, so 1 is the safer reading.
            reps = self.value(phase.get("iterations", 1), env, "phase iterations")
            total += max(reps, 0.0) * self._tasks(phase.get("tasks", []), env)
        return total

    def _tasks(self, tasks: Any, env: Env) -> float:
        if not isinstance(tasks, list):
            raise _ExprError("'tasks' is not a list")
        return sum(self._task(t, env) for t in tasks)

    def _task(self, task: Any, env: Env) -> float:
        if not isinstance(task, Mapping):
            raise _ExprError("a task is not an object")
        reps = max(self.value(task.get("iterations", 1), env, "task iterations"), 0.0)
        kind = task.get("type")
        if kind == "sequence":
            return reps * self._tasks(task.get("tasks", []), env)
        if kind in ("busy_wait", "idle"):
            return reps * self.value(task.get("delay", 0), env, "delay")
        if kind == "cpu" and "flops" in task:
            raw = task["flops"]
            pattern = task.get("computation_pattern", "uniform")
            if isinstance(raw, list):
                flops = max((self.value(x, env, "flops") for x in raw), default=0.0)
            else:
                flops = self.value(raw, env, "flops")
                if pattern == "total":
                    flops /= env["num_nodes"]
            return reps * flops / self.node_flops
        return 0.0  # I/O, communication and GPU work are not modelled (docstring)


_FLOP_UNITS = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12, "p": 1e15, "e": 1e18}


def _parse_speed(text: str) -> float | None:
    """SimGrid speed ``100Gf`` (first pstate of ``100Gf,50Gf``) → flop/s."""
    m = re.fullmatch(r"\s*([\d.]+(?:[eE][-+]?\d+)?)\s*([kKmMgGtTpPeE]?)f?\s*", text.split(",")[0])
    if m is None:
        return None
    value = float(m.group(1)) * _FLOP_UNITS[m.group(2).lower()]
    return value if value > 0 else None


def _radical_count(text: str) -> int | None:
    """Nodes in a SimGrid cluster radical such as ``100-227`` or ``0-3,8,10-11``."""
    count = 0
    for part in text.split(","):
        lo, sep, hi = part.strip().partition("-")
        try:
            count += (int(hi) - int(lo) + 1) if sep else 1
        except ValueError:
            return None
    return count if count > 0 else None


def _beside(ref: str, directory: Path) -> Path | None:
    """Resolve a path an ElastiSim file names: as given, relative, or by name beside."""
    given = Path(ref)
    for candidate in (given, directory / given, directory / given.name):
        if candidate.is_file():
            return candidate
    return None


def _platform(directory: Path) -> tuple[float | None, int | None, str | None]:
    """(node flop/s, node count, cluster id) of the platform ``configuration.json`` names."""
    conf = directory / "configuration.json"
    if not conf.is_file():
        return None, None, None
    try:
        platform_ref = json.loads(conf.read_text(encoding="utf-8")).get("platform_file")
    except (OSError, ValueError, AttributeError):
        return None, None, None
    path = _beside(platform_ref, directory) if isinstance(platform_ref, str) else None
    if path is None:
        return None, None, None
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError) as exc:
        raise TraceError(f"cannot read platform: {exc}", source=str(path)) from exc
    for cluster in root.iter("cluster"):
        speed = _parse_speed(cluster.get("speed", ""))
        nodes = _radical_count(cluster.get("radical", ""))
        return speed, nodes, cluster.get("id")
    return None, None, None


def _int_field(job: Mapping[str, Any], key: str, index: int, name: str) -> int:
    if key not in job:
        raise TraceError(f"missing required key {key!r}", source=name, job_index=index)
    value = job[key]
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise TraceError(
            f"{key} must be a positive integer, not {value!r}", source=name, job_index=index
        )
    return value


def read_elastisim(
    path: str | os.PathLike[str],
    *,
    limit: int | None = None,
    node_flops: float | None = None,
) -> Trace:
    """Read ElastiSim's ``jobs.json`` with the mapping of the module docstring.

    ``limit`` keeps the first ``limit`` jobs of the file. ``node_flops`` overrides the
    node speed used to derive run times. ``trace.stats`` counts ``jobs``, the original
    types (``rigid``, ``moldable``, ``malleable``, ``evolving``, ``adaptive``),
    ``default_model`` (jobs whose model file was not found), ``capped_procs`` (sizes
    above the platform's nodes, capped) and ``resorted``.
    """
    p = Path(path)
    name = str(p)
    _check_limit(limit, name)
    raw_jobs = _load_elastisim_jobs(p, name)
    if limit is not None:
        raw_jobs = raw_jobs[:limit]
    plat_speed, plat_nodes, cluster_id = _platform(p.parent)
    if node_flops is not None and not (node_flops > 0 and math.isfinite(node_flops)):
        raise TraceError(f"node_flops must be positive, not {node_flops!r}", source=name)
    speed = node_flops or plat_speed or DEFAULT_NODE_FLOPS
    reader = _ElastisimJobs(name, p.parent, plat_nodes, _ModelEvaluator(speed))
    parsed = [reader.job(index, job) for index, job in enumerate(raw_jobs)]
    stats = reader.stats
    submits = [s for s, _ in parsed]
    if any(b < a for a, b in itertools.pairwise(submits)):
        stats["resorted"] = 1
        parsed.sort(key=lambda pair: pair[0])
    base = parsed[0][0] if parsed else 0.0
    jobs = [attrs.evolve(j, submit=s - base) if base else j for s, j in parsed]
    stats["jobs"] = len(jobs)
    note = (
        f"run times derived from the application model (compute only) at {speed:g} flop/s per node"
    )
    header = TraceHeader(
        format="elastisim",
        computer=cluster_id,
        max_nodes=plat_nodes,
        max_procs=plat_nodes,
        notes=(note,),
        submit_offset=base,
    )
    return Trace(header, jobs, stats, name)


def _load_elastisim_jobs(path: Path, name: str) -> list[Any]:
    """The ``jobs`` list of an ElastiSim job file, entries unchecked."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise TraceError(f"cannot read: {exc}", source=name) from exc
    except ValueError as exc:
        raise TraceError(f"not valid JSON: {exc}", source=name) from exc
    raw_jobs = data.get("jobs") if isinstance(data, dict) else None
    if not isinstance(raw_jobs, list):
        raise TraceError("expected an object with a 'jobs' list", source=name)
    return raw_jobs


class _ElastisimJobs:
    """Turns the entries of one ``jobs.json`` into :class:`TraceJob`, in file order.

    Holds what the jobs share: the platform's node count, the model evaluator, the
    application models read so far (by path) and the counts for ``trace.stats``.
    """

    def __init__(
        self, name: str, directory: Path, plat_nodes: int | None, evaluator: _ModelEvaluator
    ) -> None:
        self.name = name
        self.directory = directory
        self.plat_nodes = plat_nodes
        self.evaluator = evaluator
        self.models: dict[Path, Mapping[str, Any]] = {}
        self.stats = dict.fromkeys(
            ("jobs", *_ELASTISIM_KINDS, "default_model", "capped_procs", "resorted"), 0
        )

    def error(self, reason: str, index: int) -> TraceError:
        return TraceError(reason, source=self.name, job_index=index)

    def job(self, index: int, job: Any) -> tuple[float, TraceJob]:
        """The entry at ``index``: its raw submit time and the cleaned job."""
        if not isinstance(job, Mapping):
            raise self.error("a job must be an object", index)
        for key in ("type", "submit_time", "application_model"):
            if key not in job:
                raise self.error(f"missing required key {key!r}", index)
        etype = job["type"]
        kind = _ELASTISIM_KINDS.get(etype) if isinstance(etype, str) else None
        if kind is None:
            raise self.error(
                f"unknown type {etype!r} (expected one of {', '.join(_ELASTISIM_KINDS)})", index
            )
        self.stats[etype] += 1
        submit = job["submit_time"]
        if isinstance(submit, bool) or not isinstance(submit, int | float) or submit < 0:
            raise self.error(f"submit_time must be a non-negative number, not {submit!r}", index)
        lo, hi, procs = self.sizes(job, index, kind)
        walltime = job.get("walltime", 0)
        requested = (
            float(walltime)
            if isinstance(walltime, int | float) and not isinstance(walltime, bool) and walltime > 0
            else None
        )
        return float(submit), TraceJob(
            id=str(index),
            submit=float(submit),
            runtime=self.runtime(job, index, procs),
            procs=procs,
            requested_time=requested,
            user="elastisim",
            kind=kind,
            min_procs=lo,
            max_procs=hi,
        )

    def sizes(self, job: Mapping[str, Any], index: int, kind: TraceKind) -> tuple[int, int, int]:
        """``(min, max, procs)`` of the job, capped at the platform's nodes."""
        if kind == "rigid":
            lo = hi = procs = _int_field(job, "num_nodes", index, self.name)
        else:
            lo = _int_field(job, "num_nodes_min", index, self.name)
            hi = _int_field(job, "num_nodes_max", index, self.name)
            if lo > hi:
                raise self.error(f"num_nodes_min {lo} > num_nodes_max {hi}", index)
            procs = hi
        if self.plat_nodes is not None and hi > self.plat_nodes:
            self.stats["capped_procs"] += 1
            hi = procs = self.plat_nodes
            lo = min(lo, hi)
        return lo, hi, procs

    def runtime(self, job: Mapping[str, Any], index: int, procs: int) -> float:
        """The compute time of the job's application model at ``procs`` nodes."""
        arguments = job.get("arguments", {})
        if not isinstance(arguments, Mapping):
            raise self.error("arguments must be an object", index)
        model = self.model(job["application_model"], index)
        gpus = job.get("num_gpus_per_node_max", job.get("num_gpus_per_node", 0))
        env: dict[str, float] = {
            k: float(v)
            for k, v in arguments.items()
            if isinstance(v, int | float) and not isinstance(v, bool)
        }
        env.update(
            num_nodes=float(procs),
            num_gpus_per_node=float(gpus) if isinstance(gpus, int | float) else 0.0,
        )
        env["num_gpus"] = env["num_nodes"] * env["num_gpus_per_node"]
        try:
            runtime = self.evaluator.seconds(model, env)
        except _ExprError as exc:
            raise self.error(f"cannot derive a run time: {exc}", index) from None
        if not (runtime > 0 and math.isfinite(runtime)):
            raise self.error(f"the application model gives no compute time ({runtime!r} s)", index)
        return runtime

    def model(self, model_ref: Any, index: int) -> Mapping[str, Any]:
        """The application model ``model_ref`` names (read once per file), else the
        example project's."""
        if not isinstance(model_ref, str):
            raise self.error("application_model must be a path", index)
        model_path = _beside(model_ref, self.directory)
        if model_path is None:
            self.stats["default_model"] += 1
            return _DEFAULT_MODEL
        cached = self.models.get(model_path)
        if cached is None:
            try:
                cached = json.loads(model_path.read_text(encoding="utf-8"))
            except (OSError, ValueError) as exc:
                raise TraceError(
                    f"cannot read application model: {exc}", source=str(model_path)
                ) from exc
            if not isinstance(cached, Mapping):
                raise TraceError("application model is not an object", source=str(model_path))
            self.models[model_path] = cached
        return cached
