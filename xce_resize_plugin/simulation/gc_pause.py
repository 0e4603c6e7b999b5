"""Building a workload with Python's cyclic garbage collector paused: :func:`gc_paused`.

Reading a trace and converting its jobs makes a few hundred thousand small objects that
all live on (one :class:`~.trace_types.TraceJob` and one
:class:`~.malleable.SimJob` per job). Each is tracked by the collector, and while the
heap grows its full collections walk every one of them again: on HPC2N's 202,871 jobs
that was about a third of the time the read and the conversion took
(docs/performance.md, "The collector paused while a workload is built"). Nothing they
make is cyclic garbage, so pausing the collector frees nothing later than it would
have been freed.

Paused for the call only, and resumed only if it was running: a caller that turned it
off keeps it off, and nested calls resume it once, at the outermost. The collector is
per process; the simulator builds workloads in its own thread, before any run starts.
"""

from __future__ import annotations

import functools
import gc
from collections.abc import Callable
from typing import ParamSpec, TypeVar

__all__ = ["gc_paused"]

_P = ParamSpec("_P")
_R = TypeVar("_R")


def gc_paused(fn: Callable[_P, _R]) -> Callable[_P, _R]:
    """``fn`` with the cyclic garbage collector paused while it runs (see the module
    docstring); an exception passes through with the collector resumed."""

    @functools.wraps(fn)
    def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        if not gc.isenabled():
            return fn(*args, **kwargs)
        gc.disable()
        try:
            return fn(*args, **kwargs)
        finally:
            gc.enable()

    return wrapper
