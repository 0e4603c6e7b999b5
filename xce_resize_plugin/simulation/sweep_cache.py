"""The sweep's cache of finished runs: one JSON file per run key (:mod:`.sweep`).

A file is used only when it holds what a run's result holds, with the right types and
each number finite and in its metric's range (:func:`run_doc_ok`): a file cut short by
a crash, edited by hand or written by another program is made again, never read as a
result (a ``{"run": {}}`` stopped the sweep with a ``KeyError`` before; a utilization of
``1e308`` with an ``OverflowError`` in the table; JSON nested too deeply with a
``RecursionError``). So is anything that is not a regular file of at most
:data:`MAX_ENTRY_BYTES` (a FIFO blocked the sweep) and a result whose checks failed:
such a result is never written, so a file that holds one was not written by a run
(its "problems" would be reported as the run's). A result that cannot be written (a
full disk, a directory where the file goes) is counted in :attr:`CellCache.unkept` and
the sweep goes on: the run is made, only not kept for the next sweep.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any

import attrs

from xce_resize_plugin.controllers.input_files import read_capped
from xce_resize_plugin.controllers.sim.events import MAX_SECONDS
from xce_resize_plugin.simulation.failures import FailureStats
from xce_resize_plugin.simulation.metrics import RunMetrics

__all__ = ["CellCache", "RunResultDoc", "default_cache_dir", "run_doc_ok"]

#: One run's result: ``jobs``, ``malleable_jobs``, ``run`` (its metrics), ``problems``,
#: ``warnings`` (each kind once: ``run``, ``count``, ``first``).
RunResultDoc = dict[str, Any]

#: The keys of a run's metrics (:func:`~.sweep._run_json`).
_RUN_ORDER = (*(f.name for f in attrs.fields(RunMetrics)), "events", "resize_requests")
_RUN_KEYS = frozenset(_RUN_ORDER)
#: The keys of a run's ``host_failures`` (:meth:`~.failures.FailureStats.to_json`),
#: there when the run injected failures.
_FAILURE_ORDER = tuple(FailureStats().to_json())


_DOC_KEYS = frozenset({"jobs", "malleable_jobs", "run", "problems", "warnings"})

#: The largest cache file read (1 MiB): a run's result is about 1 KB (a warning's
#: first message makes it longer); a larger file was not written by a run.
MAX_ENTRY_BYTES = 1 << 20
#: The largest count a result holds (jobs, events, resizes): a float holds every
#: integer up to it exactly, and the table computes in floats.
MAX_COUNT = 1 << 53
#: The longest a run's times may be (mean wait, turnaround, makespan): the simulated
#: clock's range (MAX_SECONDS) ten times over leaves room for runs that start near
#: its end; ``1e308`` is no run's (the table's interval overflowed on it).
MAX_TIME = 10 * MAX_SECONDS
#: A utilization a run gives is a share of the machine: at most 1, and a rounding
#: error above it.
_MAX_UTILIZATION = 1.0 + 1e-9
#: The metrics that are means over the jobs: NaN (JSON's ``NaN``) in a run of no jobs.
_MEANS = frozenset({"mean_wait", "median_wait", "mean_turnaround", "mean_bounded_slowdown"})
#: Each number of a run's metrics and the range it must be in.
_RANGES: dict[str, tuple[float, float]] = {
    "mean_wait": (0.0, MAX_TIME),
    "median_wait": (0.0, MAX_TIME),
    "mean_turnaround": (0.0, MAX_TIME),
    # Bounded slowdown is at least 1 by definition; (wait + run) / 10 s at most.
    "mean_bounded_slowdown": (1.0, MAX_TIME),
    "utilization": (0.0, _MAX_UTILIZATION),
    "makespan": (0.0, MAX_TIME),
}
#: The longest warning text kept (a run's warnings are the plugin's log lines).
_MAX_WARNING_CHARS = 10_000


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/xce-resize/sweep``, else ``~/.cache/xce-resize/sweep``; an
    :class:`OSError` when the home directory does not exist (a HOME of ``/nonexistent``,
    a system account's: a cache made there would be a directory tree nobody asked for).
    ``XDG_CACHE_HOME`` is the user's own choice, made when missing."""
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg:
        return Path(xdg) / "xce-resize" / "sweep"
    home = Path(os.path.expanduser("~"))
    if not home.is_dir():
        raise FileNotFoundError(f"the home directory {home} does not exist")
    return home / ".cache" / "xce-resize" / "sweep"


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_COUNT


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _metric_ok(key: str, value: Any, jobs: Any) -> bool:
    """One number of a run's metrics: a count, or a time or share in its range."""
    if key not in _RANGES:
        return _count(value)
    if not _number(value):
        return False
    if math.isnan(value):
        return key in _MEANS and jobs == 0
    low, high = _RANGES[key]
    return bool(low <= value <= high)


def run_doc_ok(doc: Any, mode: str | None = None) -> bool:
    """Whether ``doc`` is a run's result as :func:`~.sweep.run_one` makes it, of the
    run ``mode`` (``rigid``, ``elastic``; ``None``: either), with no check failed."""
    if not isinstance(doc, dict) or set(doc) != _DOC_KEYS:
        return False
    run, problems, warnings = doc["run"], doc["problems"], doc["warnings"]
    return bool(
        _count(doc["jobs"])
        and _count(doc["malleable_jobs"])
        and doc["malleable_jobs"] <= doc["jobs"]
        and isinstance(run, dict)
        and set(run) - {"host_failures"} == _RUN_KEYS
        and all(_metric_ok(k, v, run["jobs"]) for k, v in run.items() if k != "host_failures")
        and _failures_ok(run.get("host_failures", {}))
        and problems == []
        and isinstance(warnings, list)
        and all(_warning_ok(w, mode) for w in warnings)
    )


def _failures_ok(doc: Any) -> bool:
    """``{}`` (no failures injected) or a run's failure counts."""
    if doc == {}:
        return True
    return (
        isinstance(doc, dict)
        and set(doc) == set(_FAILURE_ORDER)
        and all(
            _count(v) if k != "slot_hours_lost" else _number(v) and 0 <= v <= MAX_TIME
            for k, v in doc.items()
        )
    )


def _ordered(doc: RunResultDoc) -> RunResultDoc:
    """A cached result with its keys in the order a fresh run gives them (a file may
    have them in any order: sorted by an earlier version), so that a sweep's ``--json``
    is the same bytes whether its runs were made or read from the cache."""
    return {
        "jobs": doc["jobs"],
        "malleable_jobs": doc["malleable_jobs"],
        "run": {
            **{key: doc["run"][key] for key in _RUN_ORDER},
            **(
                {"host_failures": {k: doc["run"]["host_failures"][k] for k in _FAILURE_ORDER}}
                if "host_failures" in doc["run"]
                else {}
            ),
        },
        "problems": doc["problems"],
        "warnings": [{k: w[k] for k in ("run", "count", "first")} for w in doc["warnings"]],
    }


def _warning_ok(doc: Any, mode: str | None) -> bool:
    return (
        isinstance(doc, dict)
        and set(doc) == {"run", "count", "first"}
        and doc["run"] in ((mode,) if mode is not None else ("rigid", "elastic"))
        and _count(doc["count"])
        and isinstance(doc["first"], str)
        and len(doc["first"]) <= _MAX_WARNING_CHARS
    )


class CellCache:
    """Finished runs, one JSON file per run key in ``directory`` (created on use)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        #: Results that could not be written, and the last reason (the sweep says so).
        self.unkept = 0
        self.unkept_reason = ""

    def _path(self, key: str) -> Path:
        return self.directory / f"{key}.json"

    def get(self, key: str, mode: str | None = None) -> RunResultDoc | None:
        """The cached result of the run ``mode``, or ``None`` (also for a file that is
        not one: not a regular file, too large, not JSON, nested too deeply, not what
        :func:`run_doc_ok` takes). The caller makes the run and :meth:`put` replaces
        the file."""
        try:
            doc = json.loads(read_capped(self._path(key), MAX_ENTRY_BYTES))
        except (OSError, ValueError, RecursionError):  # UnicodeDecodeError: a ValueError
            return None
        return _ordered(doc) if run_doc_ok(doc, mode) else None

    def prepare(self) -> None:
        """Create the directory and write a file there, or raise :class:`OSError`:
        checked before any run, not found when the first finished run is kept."""
        self.directory.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=self.directory):
            pass

    def put(self, key: str, result: RunResultDoc) -> bool:
        """Write atomically (a reader sees the whole file or none); ``False`` when it
        could not be written (counted in :attr:`unkept`; nothing is left behind). A
        result whose checks failed is not written (``True``: nothing to keep): it is
        made again by the next sweep, never read back as a run's."""
        if result["problems"]:
            return True
        tmp = self._path(key).with_suffix(f".tmp{os.getpid()}")
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps(result), encoding="utf-8")
            os.replace(tmp, self._path(key))
        except OSError as exc:
            with contextlib.suppress(OSError):
                tmp.unlink()
            self.unkept += 1
            self.unkept_reason = f"{exc.strerror or exc}: {exc.filename or self.directory}"
            return False
        return True
