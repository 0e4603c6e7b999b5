"""Job resize for the XCE workload manager.

Only the hook marker and the version live here, so that ``bresize`` and site policy
files import this package cheaply (see DESIGN §3, pluggy's eggsample layout).
"""

import pluggy

__version__ = "0.1.0"

#: Marker for hook implementations: the plugin's own, the built-in policies and a
#: site's policy files all use it (``@hookimpl`` / ``@hookimpl(trylast=True)``).
hookimpl = pluggy.HookimplMarker("xce")

__all__ = ["__version__", "hookimpl"]
