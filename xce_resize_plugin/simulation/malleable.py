"""Making a rigid trace malleable, and how a job's speed depends on its size.

Real traces (SWF) record rigid jobs: one size, one run time. Studies of malleable
scheduling convert a chosen share of them. This module is that conversion and the speedup
model the simulator uses to run a converted job at another size. Pure, deterministic,
no global state: the same inputs give the same jobs on every machine and Python version.

The speedup model is :mod:`xce_resize_plugin.controllers.sim.speedup`.

Conversion rule (:class:`MalleableRule`, :func:`convert`)
==========================================================

For each trace job, in order, yielding a :class:`SimJob`:

1. A job whose trace fixed its flexibility (``min_procs``/``max_procs`` set: ElastiSim
   jobs, whose type and range come from the workload) keeps its kind and range.
   ``malleable`` is true for kind ``"malleable"`` with ``min < max``; a moldable job
   keeps its range for the scheduler to choose a start size but does not resize while
   running.
2. Otherwise (SWF: ``min_procs``/``max_procs`` are ``None``) the job is *chosen* when
   ``u(seed, job id) < fraction``, where ``u`` is the first 8 bytes of
   BLAKE2b(``"{seed}:{job id}"``) read as a big-endian integer divided by 2**64, a
   uniform number in [0, 1). The choice depends only on the seed and the job's own id,
   not on the jobs before it, so ``--limit`` (any prefix of the trace) chooses the same
   jobs, and raising ``fraction`` only adds jobs. ``fraction == 0`` chooses none;
   ``fraction == 1`` chooses all.
3. A chosen job of size 1 stays rigid: it cannot shrink, and growing a serial job is
   not what malleable workloads are about. So does a chosen job whose computed range
   collapses to its own size (factors of 1, or ``max_factor`` capped at the machine
   with ``min_factor == 1``).
4. A chosen job of size ``p`` >= 2 becomes malleable with
   ``min = max(1, floor(p * min_factor))`` and
   ``max = min(machine_procs, ceil(p * max_factor))`` (floor/ceil with a 1e-9 tolerance,
   so that ``10 * 1.1`` is 11 and not 12). Defaults: half and twice the recorded size.
   The recorded size and run time stay the reference of the speedup model.
5. Rigid jobs get ``min = max = procs``. Every size is first capped at
   ``machine_procs`` (the trace readers already cap at the trace's ``MaxProcs``; this
   only matters when simulating a smaller machine; a capped job keeps its recorded run
   time, now at the capped size), so ``1 <= min <= procs <= max <= machine_procs``
   always holds. Every other field is copied from the trace job.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Iterator

import attrs

from xce_resize_plugin.controllers.sim.speedup import SpeedupKind, SpeedupModel, parse_speedup
from xce_resize_plugin.errors import ConfigError
from xce_resize_plugin.simulation.traces import TraceJob, TraceKind

__all__ = [
    "MalleableRule",
    "SimJob",
    "SpeedupKind",
    "SpeedupModel",
    "choice_value",
    "convert",
    "convert_job",
    "parse_speedup",
]

# Below this, floor/ceil of a size product treat the value as the integer it rounds to:
# 10 * 1.1 == 11.000000000000002 must give 11, not 12.
_EPS = 1e-9
_TWO_64 = float(2**64)


#: The largest seed, either sign: what ``--seed`` reads (19 decimal digits).
MAX_SEED = 10**19 - 1


@attrs.frozen
class SimJob:
    """A job as the simulator runs it: a :class:`~.traces.TraceJob` plus its flexibility.

    ``min_procs <= procs <= max_procs``; a rigid job has both equal to ``procs``.
    ``malleable`` says whether it may grow and shrink while running. ``runtime`` is the
    run time at ``procs`` (the speedup model's reference).
    """

    id: str
    submit: float
    runtime: float
    procs: int
    requested_time: float | None
    user: str
    kind: TraceKind
    min_procs: int
    max_procs: int
    wait: float | None
    status: int | None
    malleable: bool

    @property
    def estimate(self) -> float:
        """What the scheduler plans with: the requested time, else the run time."""
        return self.requested_time if self.requested_time is not None else self.runtime


@attrs.frozen(kw_only=True)
class MalleableRule:
    """Which trace jobs become malleable and how flexible; see the module docstring."""

    fraction: float
    seed: int
    machine_procs: int
    min_factor: float = 0.5
    max_factor: float = 2.0

    def __attrs_post_init__(self) -> None:
        f = self.fraction
        if isinstance(f, bool) or not isinstance(f, int | float) or not 0.0 <= f <= 1.0:
            raise ConfigError(f"malleable fraction must be between 0 and 1, not {f!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ConfigError(f"seed must be an integer, not {self.seed!r}")
        if not -MAX_SEED <= self.seed <= MAX_SEED:
            # As on the command line (19 digits at most), so that a seed a file gives
            # can be given to --seed to repeat the run.
            raise ConfigError(f"seed must have at most 19 digits, not {self.seed!r}")
        m = self.machine_procs
        if isinstance(m, bool) or not isinstance(m, int) or m < 1:
            raise ConfigError(f"machine size must be a positive integer, not {m!r}")
        if not 0.0 < self.min_factor <= 1.0:
            raise ConfigError(f"min factor must be in (0, 1], not {self.min_factor!r}")
        if not 1.0 <= self.max_factor < math.inf:
            raise ConfigError(f"max factor must be a finite number >= 1, not {self.max_factor!r}")

    def chooses(self, job_id: str) -> bool:
        """Whether the rule picks job ``job_id`` (before the size-1 exception)."""
        return choice_value(self.seed, job_id) < self.fraction


def choice_value(seed: int, job_id: str) -> float:
    """The job's uniform number in [0, 1): BLAKE2b of ``"{seed}:{job_id}"`` / 2**64.

    A keyed hash, not a sequential generator, so one job's choice never depends on
    another's; BLAKE2b rather than ``hash()`` because ``hash`` of a str is salted per
    process.
    """
    digest = hashlib.blake2b(f"{seed}:{job_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / _TWO_64


def convert_job(job: TraceJob, rule: MalleableRule) -> SimJob:
    """Apply the conversion rule to one job."""
    cap = rule.machine_procs
    procs = min(job.procs, cap)
    kind = job.kind
    if job.min_procs is not None or job.max_procs is not None:
        # The trace fixed the range (ElastiSim): keep it, only capped by the machine.
        hi = min(job.max_procs if job.max_procs is not None else procs, cap)
        lo = min(job.min_procs if job.min_procs is not None else procs, hi)
        procs = min(max(procs, lo), hi)
        malleable = kind == "malleable" and lo < hi
    else:
        lo = hi = procs
        if procs >= 2 and rule.chooses(job.id):
            # min_factor <= 1 <= max_factor keeps lo <= procs <= hi; the min/max make
            # that hold against any rounding too.
            lo = min(procs, max(1, math.floor(procs * rule.min_factor + _EPS)))
            # Compared before ceil: a large finite max_factor makes the product infinite.
            want = procs * rule.max_factor - _EPS
            hi = max(procs, cap if want >= cap else math.ceil(want))
            if lo < hi:
                kind = "malleable"
        malleable = lo < hi
    return SimJob(
        job.id,
        job.submit,
        job.runtime,
        procs,
        job.requested_time,
        job.user,
        kind,
        lo,
        hi,
        job.wait,
        job.status,
        malleable,
    )


def convert(jobs: Iterable[TraceJob], rule: MalleableRule) -> Iterator[SimJob]:
    """Convert trace jobs lazily, in order, with :func:`convert_job`."""
    for job in jobs:
        yield convert_job(job, rule)
