"""Synthetic workloads: the Lublin-Feitelson model of rigid parallel jobs.

U. Lublin and D. G. Feitelson, "The workload on parallel supercomputers: modeling the
characteristics of rigid jobs", J. Parallel Distrib. Comput. 63(11):1105-1122, 2003.
The model was fitted to the logs of four machines (the whole-sample parameters, not
split into batch and interactive jobs, are used here); it describes each job by

- **size** (processors): serial with probability ``SERIAL_PROB``; otherwise the log2 of
  the size is drawn from a *two-stage uniform* distribution — uniform on
  [``ULOW``, ``umed``] with probability ``UPROB``, else uniform on [``umed``, ``uhi``],
  where ``uhi`` = log2(P) and ``umed`` = ``uhi`` - ``UMED_BELOW_UHI`` — and, for a
  share ``POW2_PROB`` of all jobs, rounded to an integer first (a power-of-two size);
  the size is round(2^value), at most P;
- **run time**: log(run time in seconds) is *hyper-gamma*: Gamma(``A1``, ``B1``) with
  probability p, else Gamma(``A2``, ``B2``), with p = ``PA`` x size + ``PB`` kept in
  [0, 1] — larger jobs draw more often from the second gamma (the long jobs); draws
  above ``MAX_LOG_RUNTIME`` (about 1.9 days) are drawn again; the run time is the
  integer part of e^value (at least 1 s);
- **arrivals**: log(inter-arrival time) is Gamma(``AARR`` x ``ARAR``, ``BARR``) (draws
  above ``MAX_LOG_INTERARRIVAL`` are drawn again), measured in a clock that runs faster
  in busy hours: each half-hour of the day has a weight proportional to the
  probability the Gamma(``ANUM``, ``BNUM``) distribution gives to it (half-hours
  counted from ``CYCLE_START``, 05:00, where arrivals are fewest), normalised to a mean
  of 1, and an interval of x model seconds lasts x / w real seconds in a half-hour of
  weight w. The first job arrives at time 0, midnight of day 0.

``load=L`` multiplies every inter-arrival draw by one factor, found by iteration, so that
the offered load sum(run time x size) / (P x last arrival) is L within 0.5 %; the daily
cycle keeps its 24 hours. Without it the model's own arrival rate is used (fitted on
machines of 128 processors: on a larger one its jobs are larger and the offered load
can exceed 1). A load that needs the arrivals spread over more than
:data:`MAX_LOAD_SPAN` seconds, or that the iteration cannot meet within 0.5 % (submit
times are whole seconds, so a tiny span cannot be tuned), is a :class:`ConfigError`;
:func:`check_load` raises the same one without the search (a sweep checks each
seed's workload before it makes the runs not in its cache).

The model has no users and no run-time estimates: ``user`` is ``"unknown"`` and
``requested_time`` ``None`` (the scheduler plans with the run time). Jobs are the
:class:`~.traces.TraceJob` objects the SWF reader produces (ids ``"1"``...,
status 1), so :func:`generate` returns a :class:`~.traces.Trace` that the rest of the
simulation uses unchanged, and :mod:`.swf_write` writes it out as SWF.

Deterministic: the same spec and seed give the same jobs (one ``random.Random(seed)``
stream, drawn in a fixed order: for each job its size, its run time, its interval).
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Iterator, Sequence

from attrs import frozen

from xce_resize_plugin.core.decimal_text import is_decimal_number
from xce_resize_plugin.errors import ConfigError
from xce_resize_plugin.simulation.gc_pause import gc_paused
from xce_resize_plugin.simulation.special import gamma_cdf
from xce_resize_plugin.simulation.traces import Trace, TraceHeader, TraceJob

__all__ = [
    "MAX_JOBS",
    "MAX_PROCS",
    "PARAMETERS",
    "LublinSpec",
    "check_load",
    "generate",
    "parse_spec",
]

# The whole-sample parameters of the paper (Table 5 and the authors' reference code).
SERIAL_PROB = 0.244
POW2_PROB = 0.576
ULOW = 0.8
UMED_BELOW_UHI = 2.5
UPROB = 0.86
A1, B1 = 4.2, 0.94
A2, B2 = 312.0, 0.03
PA, PB = -0.0054, 0.78
MAX_LOG_RUNTIME = 12.0
AARR, BARR, ARAR = 10.2303, 0.4871, 1.0225
ANUM, BNUM = 8.1737, 3.9631
MAX_LOG_INTERARRIVAL = 13.0
BUCKETS = 48
BUCKET_SECONDS = 86400 // BUCKETS
CYCLE_START = 11  # the cycle's first half-hour, counted from 1: 05:00-05:30

#: The parameters by name, for the documentation and the generated header.
PARAMETERS: dict[str, float] = {
    "SERIAL_PROB": SERIAL_PROB,
    "POW2_PROB": POW2_PROB,
    "ULOW": ULOW,
    "UMED_BELOW_UHI": UMED_BELOW_UHI,
    "UPROB": UPROB,
    "A1": A1,
    "B1": B1,
    "A2": A2,
    "B2": B2,
    "PA": PA,
    "PB": PB,
    "AARR": AARR,
    "BARR": BARR,
    "ARAR": ARAR,
    "ANUM": ANUM,
    "BNUM": BNUM,
}

_LOAD_TOLERANCE = 0.005
#: The most jobs a spec may ask for (10**6): generating them takes about 6 s and
#: holds them all in memory, and simulating them takes hours. ``jobs=10**12`` grew
#: until the memory ran out, silently (docs/simulation.md, "Limits on inputs").
MAX_JOBS = 1_000_000
#: The most processors (2**40): the largest machine the simulator builds, 2**20 hosts
#: (``simulate.MAX_HOSTS``) of 2**20 slots; ``--slots-per-host`` checks the rest.
MAX_PROCS = 1 << 40
#: A ``load`` that would spread the arrivals over more than this many seconds (about 32
#: years) is refused: no machine's log is that long, and generating it would take hours.
MAX_LOAD_SPAN = 1e9
_YEAR = 365.25 * 86400
_LOAD_ITERATIONS = 60
#: The longest run time a job draws (its log is at most ``MAX_LOG_RUNTIME``): with the
#: machine's size, a bound on the work the jobs not drawn yet can add (:func:`check_load`).
_MAX_RUNTIME = int(math.exp(MAX_LOG_RUNTIME))
#: From this span (s) on, whole seconds always hold one that meets the load: the spans
#: that do, [x / (1 + tol), x / (1 - tol)] around the ideal span x, are 0.01 x wide,
#: over 1 s from x = 100 (101: a margin for the rounding of the floats).
_ALWAYS_MET_SPAN = 101.0
_KEYS = ("jobs", "procs", "seed", "load")


@frozen
class LublinSpec:
    """``lublin:jobs=N,procs=P[,seed=S][,load=L]``; ``seed`` ``None`` means "the
    caller's seed" (``simulate --seed``, a sweep cell's seed)."""

    jobs: int
    procs: int
    seed: int | None = None
    load: float | None = None

    def text(self, seed: int | None = None) -> str:
        """The spec in its canonical form (keys in order), with ``seed`` when the
        spec has none."""
        s = self.seed if self.seed is not None else seed
        parts = [f"jobs={self.jobs}", f"procs={self.procs}"]
        if s is not None:
            parts.append(f"seed={s}")
        if self.load is not None:
            parts.append(f"load={_exact(self.load)}")
        return "lublin:" + ",".join(parts)


def _exact(value: float) -> str:
    """``value`` written short (``0.85``, ``1``) but exactly: the canonical text is the
    sweep cache's key, and ``:g``'s six digits made ``load=0.85`` and ``load=0.8500001``
    (two workloads: the load search scales the arrivals by a factor found for each)
    one key."""
    short = f"{value:g}"
    return short if float(short) == value else repr(value)


def is_spec(text: str) -> bool:
    """Whether ``text`` names a synthetic model (``lublin:...``) rather than a file."""
    return text.startswith("lublin:")


# Numbers as the command line's own types take them: int() and float() also read
# "1_0" and other scripts' digits, which no option of ours accepts.
_INTEGER = re.compile(r"[-+]?[0-9]+")
# nan and inf are read, for the message that says a load is a number > 0.
_NOT_FINITE = re.compile(r"[-+]?(?:nan|inf)")


def _int(key: str, value: str) -> int:
    if _INTEGER.fullmatch(value) is None:
        raise ConfigError(f"{key} must be an integer, not {value!r}")
    return int(value)


def parse_spec(text: str) -> LublinSpec:
    """Parse a spec; a :class:`ConfigError` says what is wrong (the caller names where)."""
    model, sep, rest = text.partition(":")
    if not sep and model.strip() == "lublin":
        raise ConfigError(
            "the lublin model needs its parameters: lublin:jobs=N,procs=P[,seed=S][,load=L]"
        )
    if not sep or model != "lublin":
        raise ConfigError(f"unknown synthetic model {model!r} (known: lublin)")
    values: dict[str, str] = {}
    for item in rest.split(",") if rest else []:
        key, eq, value = item.partition("=")
        key = key.strip()
        if not eq:
            raise ConfigError(f"{item!r} is not KEY=VALUE")
        if key not in _KEYS:
            raise ConfigError(f"unknown key {key!r} (known: {', '.join(_KEYS)})")
        if key in values:
            raise ConfigError(f"{key} given twice")
        values[key] = value.strip()
    for key in ("jobs", "procs"):
        if key not in values:
            raise ConfigError(f"missing {key}=N (lublin:jobs=N,procs=P[,seed=S][,load=L])")
    jobs, procs = _int("jobs", values["jobs"]), _int("procs", values["procs"])
    if jobs < 1:
        raise ConfigError(f"jobs must be at least 1, not {jobs}")
    if jobs > MAX_JOBS:
        raise ConfigError(f"jobs must be at most {MAX_JOBS:,}, not {jobs:,}")
    if procs < 1:
        raise ConfigError(f"procs must be at least 1, not {procs}")
    if procs > MAX_PROCS:
        raise ConfigError(f"procs must be at most {MAX_PROCS:,} (2**40), not {procs:,}")
    seed = _int("seed", values["seed"]) if "seed" in values else None
    load = None
    if "load" in values:
        text = values["load"]
        if not is_decimal_number(text) and _NOT_FINITE.fullmatch(text) is None:
            raise ConfigError(f"load must be a number, not {values['load']!r}")
        load = float(values["load"])
        if not 0 < load < math.inf:
            raise ConfigError(f"load must be a number > 0, not {values['load']!r}")
        if jobs < 2:
            raise ConfigError("load needs jobs >= 2 (one job has no arrival span)")
    return LublinSpec(jobs=jobs, procs=procs, seed=seed, load=load)


def _size(rng: random.Random, procs: int) -> int:
    u = rng.random()
    if u < SERIAL_PROB:
        return 1
    uhi = math.log2(procs)
    umed = max(ULOW, uhi - UMED_BELOW_UHI)
    # The two-stage uniform: the first stage with probability UPROB.
    first = rng.random() < UPROB
    value = rng.uniform(ULOW, umed) if first else rng.uniform(umed, max(umed, uhi))
    if u < SERIAL_PROB + POW2_PROB:
        value = float(round(value))
    return max(1, min(procs, round(math.pow(2.0, value))))


def _runtime(rng: random.Random, size: int) -> int:
    p = min(1.0, max(0.0, PA * size + PB))
    while True:
        short = rng.random() < p
        value = rng.gammavariate(A1, B1) if short else rng.gammavariate(A2, B2)
        if value <= MAX_LOG_RUNTIME:
            return max(1, int(math.exp(value)))


def _interval(rng: random.Random) -> float:
    while True:
        value = rng.gammavariate(AARR * ARAR, BARR)
        if value <= MAX_LOG_INTERARRIVAL:
            return math.exp(value)


def cycle_weights() -> tuple[float, ...]:
    """The weight of each half-hour of the day (index 0 = 00:00-00:30), mean 1."""
    weights = [0.0] * BUCKETS
    for i in range(CYCLE_START, CYCLE_START + BUCKETS):
        weights[(i - 1) % BUCKETS] = gamma_cdf(i + 0.5, ANUM, BNUM) - gamma_cdf(i - 0.5, ANUM, BNUM)
    mean = sum(weights) / BUCKETS
    return tuple(w / mean for w in weights)


def arrival_times(
    intervals: Sequence[float], weights: Sequence[float], factor: float
) -> list[float]:
    """Arrival times: the first at 0, then each interval (model seconds, times
    ``factor``) spent through the half-hours at their weights."""
    times = [0.0]
    bucket = 0  # half-hours since the start
    frac = 0.0  # how far into it, 0..1
    n = len(weights)
    for x in intervals:
        points = x * factor / BUCKET_SECONDS
        while True:
            w = weights[bucket % n]
            room = (1.0 - frac) * w
            if points <= room:
                frac += points / w
                break
            points -= room
            bucket += 1
            frac = 0.0
        times.append((bucket + frac) * BUCKET_SECONDS)
    return times


def _offered_load(work: float, procs: int, times: Sequence[float]) -> float:
    span = round(times[-1])
    return work / (procs * span) if span > 0 else math.inf


def _met(rho: float, target: float) -> bool:
    return abs(rho / target - 1.0) <= _LOAD_TOLERANCE


def _check_span(work: float, spec: LublinSpec) -> None:
    """Refuse a load whose arrivals would span more than :data:`MAX_LOAD_SPAN`."""
    target = spec.load
    assert target is not None
    span = work / (spec.procs * target)  # what the offered load's definition asks for
    if span > MAX_LOAD_SPAN:
        raise ConfigError(
            f"load={target:g} is too low: its arrivals would span {span / _YEAR:.3g} years "
            f"(at most {MAX_LOAD_SPAN / _YEAR:.0f})"
        )


def _whole_spans(work: float, spec: LublinSpec) -> list[int]:
    """The whole-second spans next to the ideal one, the last below and the first
    above it among them: the offered load falls as the span grows, so if any span
    meets the load, one of these does."""
    assert spec.load is not None
    ideal = math.floor(work / (spec.procs * spec.load))
    return [s for s in range(ideal - 1, ideal + 3) if s >= 1]


def _unreachable(work: float, spec: LublinSpec) -> ConfigError:
    """The error for a load no whole-second span meets, with the nearest load there is."""
    target = spec.load
    assert target is not None
    rho = min(
        (work / (spec.procs * s) for s in _whole_spans(work, spec)),
        key=lambda r: abs(r / target - 1.0),
    )
    return ConfigError(
        f"load={target:g} cannot be reached: the closest offered load is {rho:.4g} "
        f"({spec.jobs} jobs on {spec.procs} processors, submit times in whole seconds)"
    )


def _times_for_load(
    intervals: Sequence[float],
    weights: Sequence[float],
    work: float,
    spec: LublinSpec,
    times: list[float],
) -> list[float]:
    """Arrival times with the intervals scaled so that the offered load is ``spec.load``
    (within the tolerance). The load falls as the factor grows (arrivals spread out):
    bisection on the log of the factor, from a bracket around the first estimate."""
    target = spec.load
    assert target is not None
    rho = _offered_load(work, spec.procs, times)
    if _met(rho, target):
        return times
    _check_span(work, spec)
    lo = hi = rho / target  # the factor if the span grew in proportion
    while _offered_load(work, spec.procs, arrival_times(intervals, weights, lo)) < target:
        lo /= 2.0
    while _offered_load(work, spec.procs, arrival_times(intervals, weights, hi)) > target:
        hi *= 2.0
    for _ in range(_LOAD_ITERATIONS):
        mid = math.sqrt(lo * hi)
        times = arrival_times(intervals, weights, mid)
        rho = _offered_load(work, spec.procs, times)
        if _met(rho, target):
            break
        if rho > target:
            lo = mid
        else:
            hi = mid
    else:
        raise _unreachable(work, spec)
    return times


def _draws(spec: LublinSpec, seed: int) -> Iterator[tuple[int, int, float | None]]:
    """Each job's size, run time and interval since the previous job (``None`` for
    the first), in the stream's fixed order: :func:`generate` and :func:`check_load`
    draw the same jobs."""
    # random.Random(-S) draws what Random(S) draws (it seeds from the absolute value):
    # a negative seed is given its own stream, so that a sweep's seeds 1 and -1 are
    # two samples, not one counted twice. Seeds >= 0 draw as they always have.
    rng = random.Random(seed if seed >= 0 else f"lublin:{seed}")
    for i in range(spec.jobs):
        size = _size(rng, spec.procs)
        runtime = _runtime(rng, size)
        yield size, runtime, _interval(rng) if i else None


def check_load(spec: LublinSpec, seed: int = 0) -> None:
    """Raise the :class:`ConfigError` that :func:`generate` raises for ``spec.load`` at
    ``seed`` (too low, or out of reach), without searching the arrivals (the costly
    part of generating): for a sweep, which checks every seed's workload before it
    makes any run (:func:`~.sweep_config.check_loads`), not when the cell runs.

    What decides is the work the jobs draw: the load is met unless the ideal span
    (work / (P x load)) is above :data:`MAX_LOAD_SPAN` or so short that no whole
    second meets the tolerance (the bisection ends between the two whole spans around
    it, which this computes directly). The draws stop as soon as the jobs left cannot
    change that: after a few jobs when even jobs that all drew the longest run on the
    whole machine could not make the span too long (up to about 6,000 x load jobs);
    for more jobs most of them, and all for a span near a bound (about a third of
    generating)."""
    if spec.load is None:
        return
    scale = spec.procs * spec.load
    enough = _ALWAYS_MET_SPAN * scale  # the work from which a whole span meets the load
    room = 0.999 * MAX_LOAD_SPAN * scale  # the most work the longest span takes
    most = spec.procs * _MAX_RUNTIME  # the most work one job adds
    work, left = 0, spec.jobs
    intervals: list[float] = []
    for size, runtime, interval in _draws(spec, spec.seed if spec.seed is not None else seed):
        work += size * runtime
        left -= 1
        if interval is not None:
            intervals.append(interval)
        # Met whatever the jobs left draw: long enough already, and short enough even
        # if each drew the most (0.999: the floats' rounding; the full check decides).
        if work >= enough and work + left * most <= room:
            return
    total = float(work)
    natural = _offered_load(total, spec.procs, arrival_times(intervals, cycle_weights(), 1.0))
    if _met(natural, spec.load):  # as _times_for_load: the model's own arrivals meet it
        return
    _check_span(total, spec)
    if not any(_met(total / (spec.procs * s), spec.load) for s in _whole_spans(total, spec)):
        raise _unreachable(total, spec)


@gc_paused
def generate(spec: LublinSpec, seed: int = 0, limit: int | None = None) -> Trace:
    """The spec's jobs as a trace; ``seed`` is used when the spec has none.

    With ``limit``, only the first ``limit`` of them (the same jobs the whole spec
    starts with), and the header describes those: a file ``--save-swf`` writes from
    ``--limit`` says how many jobs it holds and their offered load."""
    s = spec.seed if spec.seed is not None else seed
    sizes: list[int] = []
    runtimes: list[int] = []
    intervals: list[float] = []
    for size, runtime, interval in _draws(spec, s):
        sizes.append(size)
        runtimes.append(runtime)
        if interval is not None:
            intervals.append(interval)
    weights = cycle_weights()
    work = float(sum(r * n for r, n in zip(runtimes, sizes, strict=True)))
    times = arrival_times(intervals, weights, 1.0)
    if spec.load is not None:
        times = _times_for_load(intervals, weights, work, spec, times)
    kept = spec.jobs if limit is None else max(0, min(limit, spec.jobs))
    if kept < spec.jobs:
        times, runtimes, sizes = times[:kept], runtimes[:kept], sizes[:kept]
        work = float(sum(r * n for r, n in zip(runtimes, sizes, strict=True)))
    load = _offered_load(work, spec.procs, times) if times else 0.0
    jobs = [
        TraceJob(
            id=str(i + 1),
            submit=float(round(t)),
            runtime=float(r),
            procs=n,
            status=1,
        )
        for i, (t, r, n) in enumerate(zip(times, runtimes, sizes, strict=True))
    ]
    return Trace(_header(spec, s, load, kept), jobs, {"jobs": len(jobs)}, spec.text(s))


def _header(spec: LublinSpec, seed: int, load: float, kept: int) -> TraceHeader:
    computer = "synthetic: Lublin-Feitelson 2003 model of rigid jobs"
    made = f"generated by xce-resize from {spec.text(seed)}"
    if kept < spec.jobs:
        made = f"the first {kept} jobs of the {spec.jobs} {made}"
    notes = (
        made,
        f"offered load {load:.4f} (sum of run time x size / (MaxProcs x last submit))",
    )
    fields = (
        ("Version", "2.2"),
        ("Computer", computer),
        ("MaxJobs", str(kept)),
        ("MaxRecords", str(kept)),
        ("MaxNodes", str(spec.procs)),
        ("MaxProcs", str(spec.procs)),
        *(("Note", n) for n in notes),
    )
    return TraceHeader(
        format="swf",
        version="2.2",
        computer=computer,
        max_jobs=kept,
        max_records=kept,
        max_nodes=spec.procs,
        max_procs=spec.procs,
        notes=notes,
        fields=fields,
    )
