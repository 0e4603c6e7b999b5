"""Injected host failures for ``xce-resize simulate --host-failures MTBF[:REPAIR]``.

Each host fails after an exponentially distributed time with mean ``MTBF`` hours and
comes back ``REPAIR`` hours later (default :data:`DEFAULT_REPAIR_HOURS`), again and
again. The failure times of a host come from its own random stream, seeded by the
simulation's seed and the host's name, so the rigid and the elastic runs see exactly
the same failures (docs/simulation.md, "Host failures"), whatever their jobs do. A run
stops drawing failures once it has no job left to submit, wait or run.

What a failure does is the controller's rule (``host_down``, docs/failover.md): a
resizable job that can lose the host's tasks shrinks, any other ends ``EXIT``. The
injector counts, per run, the jobs killed, the runs requeued (a site policy may requeue
a job a failure would end; it then starts again from scratch), the jobs shrunk and the
slot-hours the killed and requeued runs had run (work thrown away).

The spec is written back (:meth:`HostFailures.spec`, ``options.host_failures`` of the
JSON output) with every digit it was simulated with, so that :func:`parse` reads it
back to the same values.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from functools import partial

from attrs import asdict, frozen

from xce_resize_plugin.controllers.sim.sim_controller import EmbeddedController
from xce_resize_plugin.core.decimal_text import is_decimal_number
from xce_resize_plugin.core.models import LossOutcome
from xce_resize_plugin.errors import ConfigError

__all__ = ["DEFAULT_REPAIR_HOURS", "FailureInjector", "FailureStats", "HostFailures", "parse"]

#: Hours a failed host stays down when ``--host-failures`` gives no repair time.
DEFAULT_REPAIR_HOURS = 1.0
#: The shortest time a spec may give, in hours: one second, the resolution of a
#: trace's clock. Far below it a host's failure and repair add nothing to the clock
#: (``t + gap == t``), and the run never leaves that instant.
MIN_HOURS = 1 / 3600
#: The longest, in hours: 10**10 s, the longest time a trace may hold
#: (docs/simulation.md, "Traces"); far above it ``hours x 3600`` is no float.
MAX_HOURS = 1e10 / 3600


@frozen
class HostFailures:
    """Mean time between failures of each host, and its repair time, in hours."""

    mtbf_hours: float
    repair_hours: float = DEFAULT_REPAIR_HOURS

    def spec(self) -> str:
        """``MTBF:REPAIR`` as :func:`parse` reads it back to these exact values."""
        return f"{_exact(self.mtbf_hours)}:{_exact(self.repair_hours)}"


def _exact(hours: float) -> str:
    """The shortest text that reads back as ``hours`` (``repr``), without the ``.0``
    of a whole number: 200 stays ``200``, 2.0000004 is no longer shown as ``2``."""
    text = repr(float(hours))
    return text[:-2] if text.endswith(".0") else text


def parse(text: str) -> HostFailures:
    """``MTBF_HOURS[:REPAIR_HOURS]``; a bad spec is a :class:`ConfigError` saying what
    is wrong (the caller names where it came from: the option, or a file's key)."""
    parts = text.split(":")
    if len(parts) > 2:
        raise ConfigError(f"expected MTBF_HOURS[:REPAIR_HOURS], got {text!r}")
    values: list[float] = []
    for name, part in zip(("MTBF_HOURS", "REPAIR_HOURS"), parts, strict=False):
        # Plain decimals: float() also takes "nan", "1_000" and other scripts' digits.
        if not is_decimal_number(part):
            raise ConfigError(f"{name} must be a number, got {part!r}")
        value = float(part)
        if not (0 < value < math.inf):
            raise ConfigError(f"{name} must be a positive finite number, got {part!r}")
        if not MIN_HOURS <= value <= MAX_HOURS:
            raise ConfigError(
                f"{name} must be between 1/3600 (one second) and {math.floor(MAX_HOURS):,} hours "
                f"(10^10 s), got {part!r}"
            )
        values.append(value)
    return HostFailures(*values)


@frozen
class FailureStats:
    """What the failures of one run did."""

    failures: int = 0
    jobs_killed: int = 0
    #: Runs a failure ended by requeueing the job (a site's ``xce_resize_host_lost``):
    #: the job starts again from scratch, so a job may count more than once.
    jobs_requeued: int = 0
    jobs_shrunk: int = 0
    #: The slot-hours of the runs that failures ended (killed or requeued).
    slot_hours_lost: float = 0.0

    def to_json(self) -> dict[str, float | int]:
        """As JSON, in field order; ``failures`` is named ``host_failures`` there."""
        fields = asdict(self)
        return {"host_failures": fields.pop("failures"), **fields}


class FailureInjector:
    """Fails and repairs the hosts of one run (see the module docstring).

    :param active: whether the run still has jobs to submit, wait or run; no new
        failure is drawn once it is false.
    """

    def __init__(
        self,
        ctl: EmbeddedController,
        hosts: Sequence[str],
        failures: HostFailures,
        seed: int,
        active: Callable[[], bool],
    ) -> None:
        self.ctl = ctl
        self.failures = failures
        self.active = active
        self._rng = {h: random.Random(f"host-failures:{seed}:{h}") for h in hosts}
        self.stats = FailureStats()
        #: ``(time, host)`` of every failure injected, in order.
        self.log: list[tuple[float, str]] = []

    def start(self) -> None:
        for host in self._rng:
            self._schedule(host, self.ctl.now())

    def _schedule(self, host: str, after: float) -> None:
        gap = self._rng[host].expovariate(1.0 / (self.failures.mtbf_hours * 3600.0))
        self.ctl.at(after + gap, partial(self._down, host))

    def _down(self, host: str) -> None:
        if not self.active():
            return
        ctl = self.ctl
        now = ctl.now()
        ran = {job_id: self._slot_hours(job_id, now) for job_id in ctl.host_view(host).jobs}
        failure = ctl.host_down(host)
        self.log.append((now, host))
        outcomes = failure.outcomes
        killed = [j for j, o in outcomes.items() if o is LossOutcome.EXIT]
        requeued = [j for j, o in outcomes.items() if o is LossOutcome.REQUEUE]
        shrunk = [j for j, o in outcomes.items() if o is LossOutcome.SHRUNK]
        s = self.stats
        self.stats = FailureStats(
            failures=s.failures + 1,
            jobs_killed=s.jobs_killed + len(killed),
            jobs_requeued=s.jobs_requeued + len(requeued),
            jobs_shrunk=s.jobs_shrunk + len(shrunk),
            slot_hours_lost=s.slot_hours_lost + sum(ran[j] for j in (*killed, *requeued)),
        )
        ctl.at(now + self.failures.repair_hours * 3600.0, partial(self._up, host))

    def _slot_hours(self, job_id: str, now: float) -> float:
        """The slot-hours ``job_id`` has run so far (thrown away if the failure kills it)."""
        record = self.ctl.record(job_id)
        if record is None:
            return 0.0
        total = 0.0
        versions = record.versions
        for i, version in enumerate(versions):
            end = versions[i + 1].time if i + 1 < len(versions) else now
            total += len(version.tasks) * (end - version.time)
        return total / 3600.0

    def _up(self, host: str) -> None:
        self.ctl.host_up(host)
        if self.active():
            self._schedule(host, self.ctl.now())
