"""The plugin's per-controller runtime: journal, live states, and the effects it orders.

:class:`Runtime` is built in three layers, one module each: :mod:`.transitions` (the
journal, the live states and the one path every change takes), :mod:`.reclaiming`
(shrinking running jobs for the blocked queue head) and :mod:`.phases` (what each hook
phase asks of the runtime). The hook implementations (:mod:`xce_resize_plugin.plugin`)
make one per controller.
"""

from xce_resize_plugin.runtime.phases import Runtime

__all__ = ["Runtime"]
