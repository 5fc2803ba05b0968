"""`ackscope analyze --every`: one long-lived driver runs the analysis on a fixed schedule, paying
Spark's start once (docs/analysis.md, "On a schedule, in one driver: `--every`"): runs start every
`interval` from the first and never overlap; one that overruns its slot is followed at once by the
next, the missed slots skipped, not queued (Structured Streaming's processing-time trigger).
"""

from __future__ import annotations

import logging
import re
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from pyspark.sql import SparkSession

_INTERVAL = re.compile(r"(\d+(?:\.\d+)?)([smh]?)")
_UNIT_SECONDS = {"": 1, "s": 1, "m": 60, "h": 3600}
SHORTEST_INTERVAL_S = 1.0


def parse_interval(text: str) -> float:
    """Seconds from '90', '90s', '5m' or '1h'; at least SHORTEST_INTERVAL_S (a tighter loop would
    only spin the plan step over a lake with nothing new)."""
    match = _INTERVAL.fullmatch(text.strip())
    if match is None:
        raise ValueError(f"--every {text!r} is not a duration: a number with s, m or h (e.g. 5m)")
    seconds = float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
    if seconds < SHORTEST_INTERVAL_S:
        raise ValueError(f"--every {text!r} is shorter than {SHORTEST_INTERVAL_S:g}s")
    return seconds


def run_every(interval_s: float, one_run: Callable[[], bool], stopping: threading.Event,
              clock: Callable[[], float] = time.monotonic) -> None:
    """Calls `one_run` at the schedule's times until `stopping` is set, or `one_run` returns False
    (the loop cannot go on)."""
    start = clock()
    while not stopping.is_set():
        if not one_run():
            return
        start = max(start + interval_s, clock())   # now, if that time has passed: the slots missed are skipped
        stopping.wait(max(0.0, start - clock()))


@contextmanager
def stop_on_signals() -> Iterator[threading.Event]:
    """An event set by the first SIGTERM or SIGINT; the second gets the signal's usual effect
    (SIGINT: KeyboardInterrupt; SIGTERM: the process ends)."""
    stopping = threading.Event()
    signals = (signal.SIGTERM, signal.SIGINT)
    previous = {sig: signal.getsignal(sig) for sig in signals}

    def on_signal(signum, frame) -> None:
        stopping.set()
        for sig, handler in previous.items():
            signal.signal(sig, handler)

    for sig in signals:
        signal.signal(sig, on_signal)
    try:
        yield stopping
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def driver_alive(spark: SparkSession) -> bool:
    """Can this session still run a job? False when the JVM is gone or its SparkContext stopped
    (an out-of-memory driver stops it)."""
    # Before it raises for a command the gone JVM did not answer, py4j logs a traceback on the root logger, or
    # not, as the socket happened to fail: the answer is the exception, which the command reports once.
    previous = logging.root.manager.disable
    logging.disable(logging.CRITICAL)
    try:
        return not spark.sparkContext._jsc.sc().isStopped()
    except Exception:  # noqa: BLE001 - py4j's own errors when the gateway is gone
        return False
    finally:
        logging.disable(previous)


def close_gone_driver(spark: SparkSession) -> None:
    """pyspark's stop without its JVM part, which fails (a refused connection, a reset): shuts down
    the Python side's accumulator server, and returns once that server's thread has finished, and
    printed the JVM's lost connection, so the caller's last word comes after it."""
    context = spark.sparkContext
    context._jsc = None
    context.stop()
