"""Forking worker processes safely: what the parent holds is never finalized in a child.

A forked child inherits every object of the parent, garbage cycles included. If the child's
garbage collector frees one, its finalizer runs in the child: a DALI pipeline's `__del__` then
shuts down native threads that exist only in the parent and the worker dies of a segfault.
Freezing the heap across the fork (`gc.freeze`, as the `gc` docs advise for fork servers) puts
everything the parent has into the permanent generation of the child, which its collector never
visits; it also keeps the collector from writing to, and so copying, the parent's pages.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def frozen_heap() -> Iterator[None]:
    """Fork inside this block: children never collect what the parent held. The parent's heap
    is thawed after (unless something had frozen it before, which is then left as it was)."""
    was_frozen = gc.get_freeze_count() > 0
    gc.freeze()
    try:
        yield
    finally:
        if not was_frozen:
            gc.unfreeze()
