"""Job resize for the XCE workload manager: the public API.

Hosts and site policies import what they need from here, and only from here (the
modules behind these names may move; these names stay):

- the hook marker :data:`hookimpl` and :func:`get_plugin_manager` (pluggy's eggsample
  layout; docs/architecture.md), :func:`load_policy_file` to load one policy file;
- the models a hook sees (:class:`JobInfo`, :class:`Task`, the requests, the resize
  record, :class:`GrowHostView`, :class:`Principal`, :class:`TaskEvent` (and runs of
  alike events, :class:`TaskEventRun` in :class:`TaskEvents`), the reclaim
  policy's :class:`ReclaimHead` and :class:`ReclaimCandidate`, ...);
- the errors a host catches and a site raises (:class:`ResizeError`,
  :class:`PolicyRejected`, ...; every error class is in :mod:`xce_resize_plugin.errors`);
- the protocols a host implements (:class:`Controller`, :class:`ClusterView`, whose
  blocked queue head is a :class:`QueueHead`);
- helpers a site policy needs (:func:`release_size`, :func:`default_grow_order`,
  :func:`format_hosts`, :func:`host_counts`, :func:`reclaim_in_order`).

The pytest fixtures for testing a policy are in :mod:`xce_resize_plugin.testing`.

Every name but ``__version__`` is imported on first use, so that ``bresize``, which
imports this package, starts without importing pluggy, attrs, cattrs or lmdb.
"""

from __future__ import annotations

__version__ = "0.1.0"

TYPE_CHECKING = False  # typing is not imported on bresize's path (see lsf/lean.py)
if TYPE_CHECKING:
    from typing import Any

    import pluggy

    from xce_resize_plugin.core.accounting import Usage
    from xce_resize_plugin.core.models import (
        AutoresizeRequest,
        CancelRequest,
        ChangeKind,
        GrowHosts,
        GrowRequest,
        JobInfo,
        JobState,
        LossOutcome,
        Phase,
        Principal,
        ReadyRequest,
        ReleaseRequest,
        ResizeRecord,
        ResizeRequest,
        Target,
        TargetRequest,
        Task,
        TaskEvent,
        format_hosts,
        host_counts,
    )
    from xce_resize_plugin.core.placement import GrowHostView, default_grow_order
    from xce_resize_plugin.core.reclaim import (
        QueueHead,
        ReclaimCandidate,
        ReclaimHead,
        reclaim_in_order,
    )
    from xce_resize_plugin.core.releasespec import release_size
    from xce_resize_plugin.core.status import ResizeStatus
    from xce_resize_plugin.core.task_events import TaskEventRun, TaskEvents
    from xce_resize_plugin.errors import (
        ConfigError,
        FencedError,
        InvalidRequest,
        JournalError,
        PermissionDenied,
        PolicyRejected,
        ResizeError,
    )
    from xce_resize_plugin.host import ClusterView, Controller
    from xce_resize_plugin.manager import get_plugin_manager, load_policy_file

    #: Marker for hook implementations (``@hookimpl`` / ``@hookimpl(trylast=True)``),
    #: used by the plugin, the built-in policies and site policy files.
    hookimpl: pluggy.HookimplMarker

# Public name -> the module that defines it (imported on first use).
_HOME = {
    "get_plugin_manager": "manager",
    "load_policy_file": "manager",
    "Controller": "host",
    "ClusterView": "host",
    "CancelRequest": "core.models",
    "ChangeKind": "core.models",
    "GrowHosts": "core.models",
    "GrowRequest": "core.models",
    "JobInfo": "core.models",
    "JobState": "core.models",
    "AutoresizeRequest": "core.models",
    "LossOutcome": "core.models",
    "Phase": "core.models",
    "Principal": "core.models",
    "ReadyRequest": "core.models",
    "ReleaseRequest": "core.models",
    "ResizeRecord": "core.models",
    "ResizeRequest": "core.models",
    "Target": "core.models",
    "TargetRequest": "core.models",
    "Task": "core.models",
    "TaskEvent": "core.models",
    "format_hosts": "core.models",
    "host_counts": "core.models",
    "GrowHostView": "core.placement",
    "default_grow_order": "core.placement",
    "release_size": "core.releasespec",
    "QueueHead": "core.reclaim",
    "ReclaimCandidate": "core.reclaim",
    "ReclaimHead": "core.reclaim",
    "reclaim_in_order": "core.reclaim",
    "ResizeStatus": "core.status",
    "TaskEventRun": "core.task_events",
    "TaskEvents": "core.task_events",
    "Usage": "core.accounting",
    "ConfigError": "errors",
    "FencedError": "errors",
    "InvalidRequest": "errors",
    "JournalError": "errors",
    "PermissionDenied": "errors",
    "PolicyRejected": "errors",
    "ResizeError": "errors",
}


def __getattr__(name: str) -> Any:
    if name == "hookimpl":
        import pluggy

        value: Any = pluggy.HookimplMarker("xce")
    elif name in _HOME:
        import importlib

        module = importlib.import_module(f"{__name__}.{_HOME[name]}")
        value = getattr(module, name)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


__all__ = [
    "AutoresizeRequest",
    "CancelRequest",
    "ChangeKind",
    "ClusterView",
    "ConfigError",
    "Controller",
    "FencedError",
    "GrowHostView",
    "GrowHosts",
    "GrowRequest",
    "InvalidRequest",
    "JobInfo",
    "JobState",
    "JournalError",
    "LossOutcome",
    "PermissionDenied",
    "Phase",
    "PolicyRejected",
    "Principal",
    "QueueHead",
    "ReadyRequest",
    "ReclaimCandidate",
    "ReclaimHead",
    "ReleaseRequest",
    "ResizeError",
    "ResizeRecord",
    "ResizeRequest",
    "ResizeStatus",
    "Target",
    "TargetRequest",
    "Task",
    "TaskEvent",
    "TaskEventRun",
    "TaskEvents",
    "Usage",
    "__version__",
    "default_grow_order",
    "format_hosts",
    "get_plugin_manager",
    "hookimpl",
    "host_counts",
    "load_policy_file",
    "reclaim_in_order",
    "release_size",
]
