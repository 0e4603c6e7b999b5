"""Job resize for the XCE workload manager.

Only the hook marker and the version live here (pluggy's eggsample layout; docs/architecture.md).
The marker is made on first use so that ``bresize`` — which imports this package —
starts without importing pluggy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    import pluggy

    #: Marker for hook implementations (``@hookimpl`` / ``@hookimpl(trylast=True)``),
    #: used by the plugin, the built-in policies and site policy files.
    hookimpl: pluggy.HookimplMarker


def __getattr__(name: str) -> Any:
    if name == "hookimpl":
        import pluggy

        marker = pluggy.HookimplMarker("xce")
        globals()["hookimpl"] = marker
        return marker
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["__version__", "hookimpl"]
