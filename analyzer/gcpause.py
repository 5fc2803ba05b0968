"""Pausing CPython's cyclic garbage collector around work that allocates a lot and frees little.

Each pass of the collector walks every container object alive, again and again as allocations go
on. Importing pyarrow and pandas (start-up) and building a batch of row tuples (decoding) are such
work: with the collector running, start-up took ~20% longer and decoding bulk traffic 15-20%.
Reference counting frees objects as usual meanwhile; cyclic garbage, which the decoder does not
make, waits for the collector to resume.
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
