"""The state of a simulated run at a pause, as one digest two runs can compare.

A time-parallel simulation (:mod:`.segments`) runs the end of a workload from an empty
machine while the run from the start goes on, and hands over where both reach the same
state: from then on they are the same run, event for event, because the simulation is
deterministic. "The same state" must mean everything the rest of the run depends on,
and nothing it does not: this module says which is which.

:func:`digest` pickles the controller, the plugin's runtime for it and the acting driver,
at a pause between instants (:meth:`~.EmbeddedController.run_before`), and hashes the
bytes. Pickling is conservative: two states whose pickles are equal have equal values,
equal orders (dicts, lists, the timeline) and equal sharing of objects (the scheduler
compares some of its kept views by identity), so they run alike. It can only err the
other way, finding two states different that would run alike, which costs a hand-over,
never a wrong result. What it leaves out or rewrites, and why each is safe:

- **Counters that only order or version** (the cluster's ``free_epoch``,
  ``change_epoch`` and ``taken_count``, the scheduler's ``_queue_epoch`` and
  ``_views_epoch``, the runtime's ``_version``, the timeline's sequence numbers): their
  values differ between the runs by how much each has done; only their comparisons
  with copies kept in caches matter, so the copies are written relative to the
  counter, and the timeline as its entries in order.
- **How the pending queue is laid out**: its holes and per-block bounds depend on what
  it held before and only let a pass skip steps (the starts are the same whatever
  they are, :mod:`~xce_resize_plugin.controllers.pending_queue`): the queued jobs in
  order, with their keys, are its state.
- **What is dead at a pause**: the scheduler's last-pass signature (it holds the
  instant's time, and every later instant has a later one), the clock itself (the next
  instant sets it), the settle bookkeeping (``_changes``, ``_instant``, ``_round``).
- **The workload**: its jobs are the same objects in every run of it (read once, then
  forked), so a job stands for itself by its id and the feeder by where it is.
- **What the rest of a simulated run never reads**: the plugin's journal and its
  pending writes (read back only for a job requeued after a host failure, and a
  time-parallel run has none), the ids of forgotten jobs (a workload's ids are unique,
  checked before a run is split), the temporary directories, the plugin manager, locks.
- **The observers that only watch** (metrics, checks, per-job rows) and the driver's
  request counts: what they gathered differs by construction, and is joined
  separately (:mod:`.segments`). The driver's own state (its jobs and sizes) is part of
  the digest: it acts on the run.
"""

from __future__ import annotations

import hashlib
import io
import pickle
import threading
import types
import weakref
from collections.abc import Callable
from pathlib import PurePath
from typing import Any

import attrs
import pluggy

from xce_resize_plugin.controllers.cluster import Cluster
from xce_resize_plugin.controllers.observer import Observer
from xce_resize_plugin.controllers.pending_queue import PendingQueue
from xce_resize_plugin.controllers.sim import EmbeddedController
from xce_resize_plugin.controllers.sim.events import Timeline
from xce_resize_plugin.host import HostHooks
from xce_resize_plugin.journal import Journal
from xce_resize_plugin.plugin import runtime_of
from xce_resize_plugin.runtime import Runtime
from xce_resize_plugin.simulation.drivers import RequestCounts
from xce_resize_plugin.simulation.malleable import SimJob
from xce_resize_plugin.simulation.simulate import Feeder

__all__ = ["digest", "signature"]

#: Left out of the controller's state (see the module docstring for each kind).
_CONTROLLER_LEFT_OUT = frozenset(
    {
        # the plugin and its hooks, locks, directories, the store (none in a simulation)
        "_pm",
        "_hooks",
        "_lock",
        "_state_dir",
        "_work_dir",
        "_store",
        "_config",
        # observers: the acting driver is digested on its own, the others only watch
        "_observers",
        "_on_submit",
        "_on_start",
        "_on_commit",
        "_on_ending",
        "_on_end",
        "_on_requeue",
        "_on_task",
        "_on_answer",
        "_on_cycles",
        "_on_cycled",
        "_on_settled",
        "_on_host",
        # dead at a pause
        "_clock",
        "_changes",
        "_instant",
        "_round",
        "_last_pass",
        # never read again in a simulated run (ids are unique)
        "_forgotten",
        # rewritten below, relative to their counters
        "_queue_epoch",
        "_views_epoch",
        "_taken_at_pass",
        "_res_known",
        "_head_kept",
    }
)

#: Left out of the plugin runtime's state.
_RUNTIME_LEFT_OUT = frozenset(
    {
        "_controller",
        "values",
        "settings",
        "policy",
        "journal",
        "_committer",
        "_observer",
        "_deferred",
        "_batched",
        "_lock",
        "_events_lock",
        # rewritten below, relative to _version
        "_version",
        "_reclaim_seen",
        "_candidates_kept",
    }
)

#: Left out of the cluster's state: its counters (the controller's copies are relative).
_CLUSTER_LEFT_OUT = frozenset({"taken_count", "free_epoch", "change_epoch", "_user_used"})

#: Objects that stand for themselves: the same in both runs, or outside the state.
_OPAQUE: tuple[type, ...] = (
    pluggy.PluginManager,
    pluggy.HookRelay,
    pluggy.HookCaller,
    HostHooks,
    Journal,
    RequestCounts,
    types.ModuleType,
    types.MappingProxyType,
    type(threading.Lock()),
    type(threading.RLock()),
    weakref.ref,
    PurePath,
)


def digest(ctl: EmbeddedController, driver: Observer) -> bytes:
    """The digest of a simulated run's state at a pause between instants: equal
    digests, equal rests of the runs (see the module docstring)."""
    buf = io.BytesIO()
    _StatePickler(buf, driver).dump((ctl, runtime_of(ctl), driver))
    return hashlib.blake2b(buf.getbuffer(), digest_size=32).digest()


def signature(ctl: EmbeddedController) -> tuple[tuple[str, ...], tuple[str, ...], int]:
    """A cheap necessary condition for equal digests: the jobs running, the jobs
    waiting, the free slots (all part of what :func:`digest` hashes). Two runs whose
    signatures differ are not in the same state; equal ones may be, and only then is
    the digest, which costs in proportion to the whole state, worth making."""
    return (
        tuple(sorted(ctl._running)),
        tuple(sorted(ctl._pending_views)),
        ctl._cluster.free_total,
    )


def _absent(*_args: object) -> None:
    """The reconstructor named in the digest's pickles, which are never loaded."""
    raise TypeError("a state digest is not loaded")


class _StatePickler(pickle.Pickler):
    def __init__(self, file: io.BytesIO, driver: Observer) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self._driver = driver

    def reducer_override(self, obj: Any) -> Any:
        # Not called for exact ints, floats, strings, tuples, lists, dicts, sets.
        kind = type(obj)
        canon = _CANONICAL.get(kind)
        if canon is not None:
            return (_absent, (kind.__qualname__,), canon(obj))
        if kind is types.FunctionType and "<locals>" in obj.__qualname__:
            # Local functions (callbacks with their closures) are not picklable by
            # name: their code and what they close over stand for them. (Functions of
            # a module, this module's _absent among them, are pickled by name.)
            code = obj.__code__
            cells = tuple(c.cell_contents for c in obj.__closure__ or ())
            name = (code.co_filename, obj.__qualname__, code.co_code, code.co_consts)
            return (_absent, name, (cells, obj.__defaults__, obj.__kwdefaults__))
        if kind is SimJob:
            # The workload's jobs are the same objects in both runs (read once, forked).
            return (_absent, ("job", obj.id))
        if isinstance(obj, _OPAQUE):
            return (_absent, (kind.__qualname__,))
        if isinstance(obj, Observer) and obj is not self._driver:
            return (_absent, ("observer", kind.__qualname__))
        return NotImplemented


def _controller(ctl: EmbeddedController) -> dict[str, Any]:
    state = {k: v for k, v in vars(ctl).items() if k not in _CONTROLLER_LEFT_OUT}
    if state.get("_host") is ctl:
        del state["_host"]
    cluster = ctl._cluster
    state["taken since the pass"] = cluster.taken_count - ctl._taken_at_pass
    known = ctl._res_known
    if known is not None:
        res, epoch, views, at = known
        state["known reservation"] = (
            res,
            epoch - cluster.change_epoch,
            views - ctl._views_epoch,
            at,
        )
    kept = ctl._head_kept
    if kept is not None:
        state["head kept"] = (kept[0] - cluster.change_epoch, kept[1])
    return state


def _cluster(cluster: Cluster) -> dict[str, Any]:
    state = {k: v for k, v in vars(cluster).items() if k not in _CLUSTER_LEFT_OUT}
    # Users who held slots once and hold none now are read as 0 either way, and the
    # cluster lists its users sorted (views.users_view): only the held counts matter.
    state["users"] = sorted((u, n) for u, n in cluster._user_used.items() if n)
    return state


def _runtime(runtime: Runtime) -> dict[str, Any]:
    state = {k: v for k, v in vars(runtime).items() if k not in _RUNTIME_LEFT_OUT}
    version = runtime._version
    seen = runtime._reclaim_seen
    if seen is not None:
        state["reclaim seen"] = (seen[0], seen[1] - version, seen[2])
    kept = runtime._candidates_kept
    if kept is not None:
        (job_id, resizable, at, asked), candidates = kept
        state["candidates kept"] = ((job_id, resizable, at - version, asked), candidates)
    return state


def _feeder(feeder: Feeder) -> dict[str, Any]:
    # Its jobs are the workload's (the same tuple in every run of it): where it is in
    # them is its state.
    state = {f.name: getattr(feeder, f.name) for f in attrs.fields(Feeder) if f.name != "jobs"}
    state["jobs"] = len(feeder.jobs)
    return state


def _pending_queue(queue: PendingQueue[Any]) -> list[tuple[Any, Any]]:
    # Its holes and block bounds only save a pass steps (the starts are the same
    # whatever they are, see its module): the queued jobs in order, with their keys.
    return [(k, j) for k, j in zip(queue._keys, queue._jobs, strict=True) if j is not None]


def _timeline(timeline: Timeline) -> list[tuple[float, Any]]:
    # Ties run in insertion order: the entries in order, without their numbers.
    return [(t, fn) for t, _, fn in sorted(timeline._heap, key=lambda e: (e[0], e[1]))]


_CANONICAL: dict[type, Callable[[Any], Any]] = {
    EmbeddedController: _controller,
    Cluster: _cluster,
    Runtime: _runtime,
    Timeline: _timeline,
    Feeder: _feeder,
    PendingQueue: _pending_queue,
}
