"""Pausing CPython's cyclic garbage collector around work that allocates a lot and frees little,
and spacing its runs out around work that allocates a lot and frees nearly all of it at once.

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


# Net new container objects between two runs of the collector's youngest generation while frames
# stream through the state machine (CPython's default: 700).
STREAMING_YOUNG_THRESHOLD = 50_000


@contextlib.contextmanager
def cyclic_gc_spaced(young: int = STREAMING_YOUNG_THRESHOLD):
    """The collector runs, but rarely. The state machine makes a few containers per frame (its row
    dict, a record, the items it tracks) and reference counting frees nearly all of them soon;
    what accumulates between flushes (up to 50,000 records) pushes the net count past the default
    threshold every few hundred frames, and each older generation's run then walks everything the
    process holds (a Spark worker: pyspark, pyarrow, pandas). `bench/pass_cpu.py`, 200 k frames:
    ~460 young, ~40 middle and 3-4 full collections a run, 0.8-1.1 CPU s of 7-9; with 50,000, 4
    young ones, ~0.15 CPU s. The cycles the machine does leave (a channel incarnation and its two
    sides) are still collected, 50,000 allocations later at most."""
    threshold = gc.get_threshold()
    gc.set_threshold(young, *threshold[1:])
    try:
        yield
    finally:
        gc.set_threshold(*threshold)
