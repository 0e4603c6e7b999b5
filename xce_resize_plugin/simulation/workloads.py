"""A workload by name: a trace file, or a synthetic model's spec (``lublin:...``).

``simulate --synthetic SPEC`` and the sweeps (:mod:`.sweep`) name workloads this way;
:func:`open_workload` turns the name into the :class:`~.simulate.Workload` that
:func:`~.comparison.simulate` runs. A synthetic spec without ``seed=`` takes the seed of
the options (``simulate --seed``, a sweep cell's seed), so that seeds vary both the
workload and the malleable choice; ``--limit`` keeps the first N jobs of either.
"""

from __future__ import annotations

import os

from xce_resize_plugin.simulation.gc_pause import gc_paused
from xce_resize_plugin.simulation.lublin import generate, is_spec, parse_spec
from xce_resize_plugin.simulation.simulate import SimOptions, Workload, load_workload, workload_of
from xce_resize_plugin.simulation.traces import Trace

__all__ = ["open_workload", "synthetic_trace"]


def synthetic_trace(spec_text: str, options: SimOptions) -> Trace:
    """The jobs of a synthetic spec (a :class:`ConfigError` when it is wrong)."""
    return generate(parse_spec(spec_text), seed=options.seed, limit=options.limit)


@gc_paused
def open_workload(source: str | os.PathLike[str], options: SimOptions) -> Workload:
    """The workload of a trace file or of a synthetic spec, ready to simulate."""
    if isinstance(source, str) and is_spec(source):
        trace = synthetic_trace(source, options)
        return workload_of(trace, trace.source, options)
    return load_workload(source, options)
