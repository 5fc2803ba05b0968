"""The processes `ackscope ingest --workers N` decodes in: started once per command, before the
command's own imports, and used for every file it ingests.

spawn, not fork: delta-rs runs threads that a forked child would inherit in an unknown state. A
spawned interpreter spends ~0.2-0.5 s importing pyarrow and the decoder; started first, that runs
beside the command's own imports and fingerprints instead of after them, and only once per command.
"""

import contextlib
import multiprocessing


def worker_pool(workers: int):
    """A pool of `workers - 1` processes (this one decodes a share too), or nothing for one worker."""
    if workers <= 1:
        return contextlib.nullcontext()
    return multiprocessing.get_context("spawn").Pool(workers - 1, initializer=_ready_to_ingest)


def _ready_to_ingest() -> None:
    # A worker only ingests: it starts without pandas (pandas_probe), and imports the decoder and
    # the lake's writer now, not when the first file arrives (what ingest.py itself adds is small).
    from .pandas_probe import answer_pandas_probe_without_pandas
    answer_pandas_probe_without_pandas()
    from . import capture_file, fingerprint, flows, lake, native, packets, rows  # noqa: F401
