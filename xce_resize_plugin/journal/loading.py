"""Loading a store's records into long-lived objects: the cyclic collector paused.

At a controller's start every live job's state is decoded from its store (the plugin's
journal, the controller's job store) into objects that live as long as the controller.
While that many objects are made, CPython's cyclic collector runs its full collection
again and again, each one walking every object made so far, and can free none of them:
the collection work grows with the square of what is loaded. Pausing the collector
while loading and letting it run once afterwards (its next automatic run) is the usual
remedy; it changes no result. docs/performance.md has the figures.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def collector_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector for the block; restore what it was after.

    Nested uses, or a caller that had paused it already, leave it paused until the
    outermost block ends. Reference counting still frees what the block drops.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
