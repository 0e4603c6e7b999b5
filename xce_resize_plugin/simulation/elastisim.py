"""The ElastiSim reader (``jobs.json``): :func:`read_elastisim`, and
:func:`elastisim_inputs`, the files it reads (for a result cache).

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

- the model file is the job's ``application_model`` path, relative to ``jobs.json``'s
  directory (an absolute path as given), then by file name beside ``jobs.json``, never
  relative to the working directory; when none exists the example project's model is
  assumed (``iterations`` phases of one ``cpu`` task of ``flops/num_nodes^alpha`` flops
  per node), counted in ``stats["default_model"]``;
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
  ``configuration.json`` beside ``jobs.json`` (the first ``<cluster>``'s ``speed``, the
  first pstate's when it lists several; its ``radical`` gives ``header.max_nodes``),
  else 1e11 flop/s (the example's 100 Gf).

The platform. No entry named ``configuration.json`` beside ``jobs.json`` means no
platform: the default speed and no node count. A platform file with no ``<cluster>`` is
read the same way. Any other configuration that does not give a platform is broken, not
absent, and raises :class:`TraceError` naming the file at fault, since falling back to
the defaults would silently change every run time: a ``configuration.json`` that cannot
be read (a directory, a dangling link), is not UTF-8 JSON or not an object, lacks
``platform_file`` or has one that is not a string or names no file (looked up like a
model path, from ``configuration.json``'s directory); a platform that is not XML; a first
``<cluster>`` without ``speed`` or ``radical`` (SimGrid requires both). ``speed`` is read
as SimGrid reads it: a decimal number and a case-sensitive unit, ``f`` with the prefixes
``k M G T P E Z Y`` (``100Gf``) or ``flops`` with ``kilo mega giga tera peta exa zeta
yotta`` (``100gigaflops``), a bare number being flop/s; anything else (``10GF``,
``100 Gf``), or a first speed that is not positive, is an error naming the value.
``radical`` is comma-separated non-negative integers and ascending ranges ``lo-hi``; a
descending range (``5-1``), a negative number, an empty part or a node named twice is an
error naming the radical.

A missing or wrong required key, an unknown type, an expression that does not evaluate,
a model that yields no compute time, a number no float holds, or a submit time, walltime
or run time that is infinite or beyond the simulated clock's range
(:data:`~xce_resize_plugin.controllers.sim.events.MAX_SECONDS`) raises
:class:`TraceError` naming the job index; a file nested too deeply to read is not valid.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import re
import xml.etree.ElementTree as ET
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from xce_resize_plugin.controllers.input_files import read_capped
from xce_resize_plugin.controllers.sim.events import MAX_SECONDS
from xce_resize_plugin.simulation.app_model import ExprError, ModelEvaluator
from xce_resize_plugin.simulation.gc_pause import gc_paused
from xce_resize_plugin.simulation.trace_types import (
    Trace,
    TraceError,
    TraceHeader,
    TraceJob,
    TraceKind,
    check_limit,
)

#: Node speed (flop/s) assumed for ElastiSim traces without a platform: the example
#: project's 100 Gf nodes.
DEFAULT_NODE_FLOPS = 1e11
#: The most an ElastiSim configuration, platform or application model file may hold
#: (read with that bound, as every input: docs/simulation.md, "Limits on inputs"): the
#: examples' are a few KiB.
MAX_JSON_BYTES = 16 << 20
#: The most a job file may hold: a million jobs of a few hundred bytes each fit.
MAX_JOBS_FILE_BYTES = 512 << 20

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


# SimGrid's speed units (xbt/parse_units.cpp), case-sensitive: ``f`` with the SI symbol
# prefixes and ``flops`` with the spelled-out ones ("zeta" is SimGrid's spelling).
_SPEED_UNITS: dict[str, float] = {
    **{f"{p}f": float(1000**i) for i, p in enumerate(("", "k", "M", "G", "T", "P", "E", "Z", "Y"))},
    **{
        f"{p}flops": float(1000**i)
        for i, p in enumerate(("", "kilo", "mega", "giga", "tera", "peta", "exa", "zeta", "yotta"))
    },
}
# What C's strtod reads in a SimGrid speed, bar hexadecimal and inf/nan (never a usable
# speed): leading white space, a decimal number; the rest must be a unit.
_SPEED = re.compile(
    r"[ \t\n\r\f\v]*([+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?)(.*)", re.DOTALL
)
_RADICAL_PART = re.compile(r"\s*([0-9]+)\s*(?:-\s*([0-9]+)\s*)?", re.ASCII)
# SimGrid numbers a cluster's hosts with C ints.
_MAX_RADICAL = 2**31 - 1


def _parse_speed(text: str, source: str) -> float:
    """SimGrid speed ``100Gf`` → flop/s; of ``100Gf,50Gf`` (pstates) the first, all checked.

    Mirrors SimGrid's parser (a value it refuses would stop ElastiSim): a single value is
    taken as written, pstates are trimmed; a number without a unit is flop/s.
    """
    parts = [part.strip(" \t\n\r\f\v") for part in text.split(",")] if "," in text else [text]
    speeds: list[float] = []
    for part in parts:
        m = _SPEED.fullmatch(part)
        unit = _SPEED_UNITS.get(m.group(2) or "f") if m else None
        if m is None or unit is None:
            raise TraceError(
                f"cluster speed {text!r}: {part!r} is not a SimGrid speed (a number and a "
                "case-sensitive unit: f, kf, Mf, Gf, Tf, Pf, Ef, Zf, Yf, or flops, kiloflops, "
                "megaflops, gigaflops, ...)",
                source=source,
            )
        speeds.append(float(m.group(1)) * unit)
    if not (speeds[0] > 0 and math.isfinite(speeds[0])):
        raise TraceError(
            f"cluster speed {text!r} must be positive and finite for jobs to compute",
            source=source,
        )
    return speeds[0]


def _radical_count(text: str, source: str) -> int:
    """Nodes in a SimGrid cluster radical such as ``100-227`` or ``0-3,8,10-11``.

    A descending range, a negative number or an empty part is refused rather than
    counted (SimGrid would make no host of ``5-1``, so the count would not be the
    machine's), and so are numbers that repeat (SimGrid refuses a second host of a name).
    """
    ranges: list[tuple[int, int]] = []
    for part in text.split(","):
        m = _RADICAL_PART.fullmatch(part)
        if m is None:
            raise TraceError(
                f"cluster radical {text!r}: {part!r} is not a number or a range lo-hi of "
                "non-negative integers",
                source=source,
            )
        # The length test first: int() refuses strings of thousands of digits.
        if (
            any(len(g) > 10 for g in m.groups() if g is not None)
            or max(int(g) for g in m.groups() if g is not None) > _MAX_RADICAL
        ):
            raise TraceError(
                f"cluster radical {text!r}: {part!r} is above SimGrid's {_MAX_RADICAL}",
                source=source,
            )
        lo = int(m.group(1))
        hi = lo if m.group(2) is None else int(m.group(2))
        if hi < lo:
            raise TraceError(
                f"cluster radical {text!r}: {part.strip()!r} is a descending range",
                source=source,
            )
        ranges.append((lo, hi))
    ranges.sort()
    for (_, prev_hi), (lo, _) in itertools.pairwise(ranges):
        if lo <= prev_hi:
            raise TraceError(f"cluster radical {text!r}: node {lo} is named twice", source=source)
    return sum(hi - lo + 1 for lo, hi in ranges)


def _beside(ref: str, directory: Path) -> Path | None:
    """The file a reference in an ElastiSim file names, ``directory`` being the referring
    file's: a relative reference relative to ``directory``, an absolute one as given;
    then, either way, the file of that name in ``directory``.

    Never relative to the working directory: the same project must read the same files
    wherever it is run from.
    """
    given = Path(ref)
    first = given if given.is_absolute() else directory / given
    for candidate in (first, directory / given.name):
        if candidate.is_file():
            return candidate
    return None


def _platform_files(directory: Path) -> tuple[Path, Path] | None:
    """``(configuration.json, the platform file it names)``; ``None`` when ``directory``
    has no entry of that name (no configuration: the defaults apply).

    Anything else that does not give a platform file is an error naming
    ``configuration.json``: silently using the defaults would change every run time.
    """
    conf = directory / "configuration.json"
    if not os.path.lexists(conf):  # a dangling link or a directory is there, but broken
        return None
    name = str(conf)
    try:
        data = json.loads(read_capped(conf, MAX_JSON_BYTES).decode("utf-8"))
    except OSError as exc:
        raise TraceError(f"cannot read configuration: {exc}", source=name) from exc
    except UnicodeDecodeError as exc:
        raise TraceError(f"configuration is not UTF-8 text: {exc}", source=name) from exc
    except ValueError as exc:
        raise TraceError(f"configuration is not valid JSON: {exc}", source=name) from exc
    except RecursionError:
        raise TraceError(
            "configuration is not valid JSON: nested too deeply", source=name
        ) from None
    if not isinstance(data, dict):
        raise TraceError("configuration is not a JSON object", source=name)
    if "platform_file" not in data:
        raise TraceError("configuration has no 'platform_file'", source=name)
    ref = data["platform_file"]
    if not isinstance(ref, str):
        raise TraceError(f"platform_file must be a path, not {_shown(ref)}", source=name)
    platform = _beside(ref, conf.parent)
    if platform is None:
        raise TraceError(
            f"platform_file {ref!r} not found: looked for {conf.parent / ref} and "
            f"{conf.parent / Path(ref).name}",
            source=name,
        )
    return conf, platform


def _platform(directory: Path) -> tuple[float | None, int | None, str | None]:
    """(node flop/s, node count, cluster id) of the platform ``configuration.json`` names;
    all ``None`` without a configuration or when the platform has no ``<cluster>``."""
    files = _platform_files(directory)
    if files is None:
        return None, None, None
    name = str(files[1])
    try:
        root = ET.fromstring(read_capped(files[1], MAX_JSON_BYTES))
    except (OSError, ET.ParseError) as exc:
        raise TraceError(f"cannot read platform: {exc}", source=name) from exc
    cluster = next(root.iter("cluster"), None)
    if cluster is None:
        return None, None, None
    # SimGrid's DTD requires both: a platform without them does not load in ElastiSim.
    speed, radical = cluster.get("speed"), cluster.get("radical")
    if speed is None:
        raise TraceError("the first <cluster> has no speed", source=name)
    if radical is None:
        raise TraceError("the first <cluster> has no radical", source=name)
    return _parse_speed(speed, name), _radical_count(radical, name), cluster.get("id")


def elastisim_inputs(path: str | os.PathLike[str]) -> list[Path]:
    """Every file :func:`read_elastisim` reads for ``path``, as it finds them, in a
    stable order: the jobs file, ``configuration.json`` when there is one, the platform
    file it names, then each application model the jobs name that exists, in order of
    first mention (a model not found is not a file: the default model is used).

    For a result cache: a key over these files' paths and contents changes whenever the
    reader's input does, including a configuration or model file that appears or goes.
    With ``limit`` the reader reads only the first jobs' models, a subset of these.
    Raises :class:`TraceError` as :func:`read_elastisim` does when the jobs file or the
    configuration cannot be read or names no platform file.
    """
    p = Path(path)
    raw_jobs = _load_elastisim_jobs(p, str(p))
    files = [p]
    platform = _platform_files(p.parent)
    if platform is not None:
        files.extend(platform)
    seen: set[str] = set()  # thousands of jobs name a handful of models
    for job in raw_jobs:
        ref = job.get("application_model") if isinstance(job, Mapping) else None
        if not isinstance(ref, str) or ref in seen:
            continue
        seen.add(ref)
        model = _beside(ref, p.parent)
        if model is not None and model not in files:
            files.append(model)
    return files


def _shown(value: object) -> str:
    """``repr(value)``, shortened: a number of 400 digits is not a message."""
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:20]}...({len(text)} characters)"


def _int_field(job: Mapping[str, Any], key: str, index: int, name: str) -> int:
    if key not in job:
        raise TraceError(f"missing required key {key!r}", source=name, job_index=index)
    value = job[key]
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise TraceError(
            f"{key} must be a positive integer, not {value!r}", source=name, job_index=index
        )
    return value


@gc_paused
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
    check_limit(limit, name)
    raw_jobs = _load_elastisim_jobs(p, name)
    if limit is not None:
        raw_jobs = raw_jobs[:limit]
    plat_speed, plat_nodes, cluster_id = _platform(p.parent)
    if node_flops is not None and not (node_flops > 0 and math.isfinite(node_flops)):
        raise TraceError(f"node_flops must be positive, not {node_flops!r}", source=name)
    speed = node_flops or plat_speed or DEFAULT_NODE_FLOPS
    reader = _ElastisimJobs(name, p.parent, plat_nodes, ModelEvaluator(speed))
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
        data = json.loads(read_capped(path, MAX_JOBS_FILE_BYTES).decode("utf-8"))
    except OSError as exc:
        raise TraceError(f"cannot read: {exc}", source=name) from exc
    except ValueError as exc:
        raise TraceError(f"not valid JSON: {exc}", source=name) from exc
    except RecursionError:
        raise TraceError("not valid JSON: nested too deeply", source=name) from None
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
        self, name: str, directory: Path, plat_nodes: int | None, evaluator: ModelEvaluator
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
        if (
            isinstance(submit, bool)
            or not isinstance(submit, int | float)
            or not 0 <= submit <= MAX_SECONDS  # also NaN
        ):
            raise self.error(
                f"submit_time must be a non-negative number up to {MAX_SECONDS:.0e} s, "
                f"not {_shown(submit)}",
                index,
            )
        lo, hi, procs = self.sizes(job, index, kind)
        walltime = job.get("walltime", 0)
        requested = None
        if isinstance(walltime, int | float) and not isinstance(walltime, bool) and walltime > 0:
            if walltime > MAX_SECONDS:
                raise self.error(
                    f"walltime must be at most {MAX_SECONDS:.0e} s, not {_shown(walltime)}", index
                )
            requested = float(walltime)
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
        env: dict[str, float] = {}
        for k, v in arguments.items():
            if isinstance(v, int | float) and not isinstance(v, bool):
                env[k] = self.number(v, f"argument {k!r}", index)
        env.update(
            num_nodes=float(procs),
            num_gpus_per_node=(
                self.number(gpus, "num_gpus_per_node", index)
                if isinstance(gpus, int | float)
                else 0.0
            ),
        )
        env["num_gpus"] = env["num_nodes"] * env["num_gpus_per_node"]
        try:
            runtime = self.evaluator.seconds(model, env)
        except ExprError as exc:
            raise self.error(f"cannot derive a run time: {exc}", index) from None
        except RecursionError:
            raise self.error(
                "cannot derive a run time: the model is nested too deeply", index
            ) from None
        if not (runtime > 0 and math.isfinite(runtime)):
            raise self.error(f"the application model gives no compute time ({runtime!r} s)", index)
        if runtime > MAX_SECONDS:
            raise self.error(
                f"the application model gives a run time above {MAX_SECONDS:.0e} s "
                f"({runtime:.3g} s)",
                index,
            )
        return runtime

    def number(self, value: float, what: str, index: int) -> float:
        """``value`` as a float; an int too large for one is an error naming ``what``."""
        try:
            return float(value)
        except OverflowError:
            raise self.error(f"{what} is too large: {_shown(value)}", index) from None

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
                cached = json.loads(read_capped(model_path, MAX_JSON_BYTES).decode("utf-8"))
            except (OSError, ValueError) as exc:
                raise TraceError(
                    f"cannot read application model: {exc}", source=str(model_path)
                ) from exc
            except RecursionError:
                raise TraceError(
                    "cannot read application model: nested too deeply", source=str(model_path)
                ) from None
            if not isinstance(cached, Mapping):
                raise TraceError("application model is not an object", source=str(model_path))
            self.models[model_path] = cached
        return cached
