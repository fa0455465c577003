"""Python's cyclic garbage collector tuned for a process that runs one long-running service and little else."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

#: Allocations (less deallocations) between collections of the youngest generation, where Python's default
#: is 700: a service's few objects per item (a row, a lease) live until their batch is written, and a
#: collection every 700 of them would walk the batches in hand again and again.
TUNED_GC_THRESHOLD = 10_000


@contextmanager
def tuned_gc() -> Iterator[None]:
    """Tune Python's cyclic garbage collector for a service process for the block, then put it back.

    What exists when the block starts (modules, the app, SQLAlchemy's metadata and compiled statements) is
    moved out of the collector's sight with :func:`gc.freeze`, so that full collections no longer walk it
    again and again, and the youngest generation is collected less often, which short-lived per-job objects
    call for. It changes the whole process: meant for a process that runs a worker and little else, as
    ``dibs worker`` does.

    Example:
        >>> with tuned_gc():
        ...     pass
    """
    thresholds = gc.get_threshold()
    # A process that froze objects of its own manages its collector itself: what it froze stays frozen.
    freeze = gc.get_freeze_count() == 0
    if freeze:
        gc.freeze()
    gc.set_threshold(TUNED_GC_THRESHOLD, *thresholds[1:])
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)
        if freeze:
            gc.unfreeze()
