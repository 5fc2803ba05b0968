"""Pausing CPython's cyclic garbage collector around decoding, which allocates a lot and frees little.

Each pass of the collector walks every container object alive, again and again as allocations go
on; building a batch of row tuples is such work: decoding bulk traffic took 15-20% longer with the
collector running (when this was added; not measured again: docs/analysis.md, "The speed
machinery"). Reference counting frees objects as usual meanwhile; cyclic garbage, which the decoder
does not make, waits for the collector to resume.
"""

import contextlib
import gc


@contextlib.contextmanager
def cyclic_gc_paused():
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
