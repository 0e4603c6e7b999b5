"""The sweep's cache of finished runs: one JSON file per run key (:mod:`.sweep`).

A file is used only when it holds what a run's result holds, with the right types
(:func:`run_doc_ok`): a file cut short by a crash, edited by hand or written by another
program is made again, never read as a result (a ``{"run": {}}`` stopped the sweep with
a ``KeyError`` before). A result that cannot be written (a full disk, a directory where
the file goes) is counted in :attr:`CellCache.unkept` and the sweep goes on: the run is
made, only not kept for the next sweep.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import attrs

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


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/xce-resize/sweep``, else ``~/.cache/xce-resize/sweep``."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "xce-resize" / "sweep"


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def run_doc_ok(doc: Any) -> bool:
    """Whether ``doc`` is a run's result as :func:`~.sweep.run_one` makes it."""
    if not isinstance(doc, dict) or set(doc) != _DOC_KEYS:
        return False
    run, problems, warnings = doc["run"], doc["problems"], doc["warnings"]
    return (
        _count(doc["jobs"])
        and _count(doc["malleable_jobs"])
        and isinstance(run, dict)
        and set(run) - {"host_failures"} == _RUN_KEYS
        and all(_number(v) for k, v in run.items() if k != "host_failures")
        and _failures_ok(run.get("host_failures", {}))
        and isinstance(problems, list)
        and all(isinstance(p, str) for p in problems)
        and isinstance(warnings, list)
        and all(_warning_ok(w) for w in warnings)
    )


def _failures_ok(doc: Any) -> bool:
    """``{}`` (no failures injected) or a run's failure counts."""
    if doc == {}:
        return True
    return (
        isinstance(doc, dict)
        and set(doc) == set(_FAILURE_ORDER)
        and all(_number(v) for v in doc.values())
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


def _warning_ok(doc: Any) -> bool:
    return (
        isinstance(doc, dict)
        and set(doc) == {"run", "count", "first"}
        and doc["run"] in ("rigid", "elastic")
        and _count(doc["count"])
        and isinstance(doc["first"], str)
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

    def get(self, key: str) -> RunResultDoc | None:
        """The cached result, or ``None`` (also for a file that is not one)."""
        try:
            doc = json.loads(self._path(key).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return _ordered(doc) if run_doc_ok(doc) else None

    def prepare(self) -> None:
        """Create the directory and write a file there, or raise :class:`OSError`:
        checked before any run, not found when the first finished run is kept."""
        self.directory.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=self.directory):
            pass

    def put(self, key: str, result: RunResultDoc) -> bool:
        """Write atomically (a reader sees the whole file or none); ``False`` when it
        could not be written (counted in :attr:`unkept`; nothing is left behind)."""
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
