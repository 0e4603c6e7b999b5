"""How a simulated job's speed depends on its size: the speedup model.

A job recorded as running ``T_ref`` seconds on ``p_ref`` procs. With Amdahl's law and a
serial fraction ``s`` (0 <= s <= 1), its speedup on ``p`` procs is
``S(p) = 1 / (s + (1 - s) / p)``, its one-proc time ``T1 = T_ref * S(p_ref)`` and its
time on ``p`` procs::

    T(p) = T1 / S(p) = T_ref * (s + (1 - s) / p) / (s + (1 - s) / p_ref)

so ``T(p_ref) == T_ref`` exactly, and ``T`` never grows with ``p``. The ``linear`` model
is ``s = 0``: ``T(p) = T_ref * p_ref / p`` (perfect scaling; the work, procs x time, is
constant).

Work is measured in fractions of the job: 1.0 is the whole job, and at size ``p`` the
job does ``rate(T_ref, p_ref, p) = 1 / T(p)`` of it per second. The simulator integrates
that rate over the job's changing size, so a job that resizes finishes when the
integral reaches 1.0 — it does exactly its work under the model, whatever the sizes.
After every resize the job makes no progress for ``reconfig_cost`` seconds (data
redistribution, restart of the processes); the simulator charges it.
"""

from __future__ import annotations

import math
from typing import Literal, TypeAlias

import attrs

from xce_resize_plugin.errors import ConfigError

__all__ = ["MAX_RECONFIG_COST", "SpeedupKind", "SpeedupModel", "parse_speedup"]

SpeedupKind: TypeAlias = Literal["amdahl", "linear"]

#: The largest reconfiguration cost (10**6 s, about 11.6 days): a pause longer than any
#: batch job's run is a restart, which the model does not describe, and each resize
#: adds it to the simulated clock, whose range is 10**10 s (``events.MAX_SECONDS``):
#: ``cost=1e300`` made every elastic job end at 1e300, where its work no longer adds up.
MAX_RECONFIG_COST = 1e6


def _default_serial_fraction(model: SpeedupModel) -> float:
    return 0.05 if model.kind == "amdahl" else 0.0


@attrs.frozen
class SpeedupModel:
    """How a job's run time changes with its size; see the module docstring.

    ``kind`` is ``"amdahl"`` (``serial_fraction`` defaults to 0.05) or ``"linear"``
    (``serial_fraction`` is 0). ``reconfig_cost`` is the seconds without progress after
    each resize. Invalid values raise :class:`~xce_resize_plugin.errors.ConfigError`.
    """

    kind: SpeedupKind = "amdahl"
    serial_fraction: float = attrs.field(
        default=attrs.Factory(_default_serial_fraction, takes_self=True)
    )
    reconfig_cost: float = 10.0

    def __attrs_post_init__(self) -> None:
        if self.kind not in ("amdahl", "linear"):
            raise ConfigError(f"speedup model must be 'amdahl' or 'linear', not {self.kind!r}")
        s = self.serial_fraction
        if isinstance(s, bool) or not isinstance(s, int | float) or not 0.0 <= s <= 1.0:
            raise ConfigError(f"serial fraction must be between 0 and 1, not {s!r}")
        if self.kind == "linear" and s != 0.0:
            raise ConfigError(f"the linear model has no serial fraction (got {s!r})")
        c = self.reconfig_cost
        if isinstance(c, bool) or not isinstance(c, int | float) or not 0.0 <= c < math.inf:
            raise ConfigError(f"reconfiguration cost must be a finite number >= 0, not {c!r}")
        if c > MAX_RECONFIG_COST:
            raise ConfigError(
                f"reconfiguration cost must be at most {MAX_RECONFIG_COST:.0e} s, not {c!r}"
            )

    def speedup(self, procs: int) -> float:
        """Amdahl's ``S(p) = 1 / (s + (1 - s) / p)`` (``p`` for the linear model)."""
        if procs < 1:
            raise ValueError(f"procs must be >= 1, not {procs!r}")
        s = self.serial_fraction
        return 1.0 / (s + (1.0 - s) / procs)

    def time_for(self, work_seconds_at_ref: float, ref_procs: int, procs: int) -> float:
        """Run time on ``procs`` of a job that takes ``work_seconds_at_ref`` on ``ref_procs``.

        ``T(p) = T_ref * (s + (1-s)/p) / (s + (1-s)/p_ref)``; exactly ``T_ref`` at
        ``p == p_ref`` and non-increasing in ``p`` (each floating-point step is
        monotone, so this holds for the computed values too, not only in theory).
        """
        if procs < 1 or ref_procs < 1:
            raise ValueError(f"sizes must be >= 1, not {ref_procs!r} -> {procs!r}")
        if not work_seconds_at_ref > 0:
            raise ValueError(f"run time must be positive, not {work_seconds_at_ref!r}")
        if self.kind == "linear":
            return work_seconds_at_ref * (ref_procs / procs)
        s = self.serial_fraction
        q = 1.0 - s
        return work_seconds_at_ref * ((s + q / procs) / (s + q / ref_procs))

    def rate(self, work_seconds_at_ref: float, ref_procs: int, procs: int) -> float:
        """Fraction of the whole job done per second at size ``procs``: ``1 / T(p)``."""
        return 1.0 / self.time_for(work_seconds_at_ref, ref_procs, procs)

    def relative_speed(self, ref_procs: int, procs: int) -> float:
        """``T(p_ref) / T(p)``: how much faster the job runs on ``procs`` than recorded."""
        return self.time_for(1.0, procs, ref_procs)

    def spec(self) -> str:
        """The text :func:`parse_speedup` reads back into this model."""
        cost = f"cost={self.reconfig_cost!r}"
        if self.kind == "linear":
            return f"linear:{cost}"
        return f"amdahl:{self.serial_fraction!r}:{cost}"


def parse_speedup(text: str) -> SpeedupModel:
    """Parse a speedup model from a command line.

    Grammar: ``KIND[:SERIAL][:key=value]...`` with KIND ``amdahl`` or ``linear``,
    SERIAL the serial fraction (amdahl only), keys ``s`` (serial fraction) and ``cost``
    (reconfiguration cost in seconds). Examples: ``amdahl``, ``amdahl:0.1``, ``linear``,
    ``amdahl:0.1:cost=5``, ``linear:cost=0``. Case and blanks around parts are ignored.
    Bad text raises :class:`~xce_resize_plugin.errors.ConfigError` saying what is wrong.
    """
    if not isinstance(text, str) or not text.strip():
        raise ConfigError("empty speedup model (expected e.g. 'amdahl', 'amdahl:0.1', 'linear')")
    parts = [p.strip() for p in text.strip().lower().split(":")]
    kind = parts[0]
    if kind not in ("amdahl", "linear"):
        raise ConfigError(
            f"unknown speedup model {parts[0]!r} in {text!r} (expected 'amdahl' or 'linear')"
        )
    values: dict[str, float] = {}
    for i, part in enumerate(parts[1:]):
        key, sep, raw = part.partition("=")
        if not sep:
            key, raw = "s", part  # a bare number right after the kind is the fraction
            if i != 0:
                raise ConfigError(f"expected key=value, not {part!r}, in speedup {text!r}")
        key = key.strip()
        if key not in ("s", "cost"):
            raise ConfigError(f"unknown speedup option {key!r} in {text!r} (expected s, cost)")
        if key in values:
            raise ConfigError(f"speedup option {key!r} given twice in {text!r}")
        try:
            value = float(raw)
        except ValueError:
            raise ConfigError(f"speedup option {key!r} is not a number: {raw!r}") from None
        if not math.isfinite(value):
            raise ConfigError(f"speedup option {key!r} must be finite, not {raw!r}")
        values[key] = value
    if kind == "linear" and "s" in values:
        raise ConfigError(f"the linear model takes no serial fraction: {text!r}")
    model = SpeedupModel(kind="linear") if kind == "linear" else SpeedupModel()
    if "s" in values:
        model = attrs.evolve(model, serial_fraction=values["s"])
    if "cost" in values:
        model = attrs.evolve(model, reconfig_cost=values["cost"])
    return model
