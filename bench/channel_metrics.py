"""channel_metrics in Python (analyzer/timeline/metrics.py) on the bench's hot connection: speed
and memory.

The hot connection of bench/frames_generator.py (one consumer channel, single and multiple acks,
a few requeues) goes through the state machine once; then:
- speed: channel_metrics over its records, in records per CPU second (the machine's own time
  apart);
- memory (tracemalloc peak, Python allocations; Arrow's own buffers are not counted): the
  connection streamed frame batch by frame batch through the machine and the streaming
  accumulator, rows out as they become final; the same with no row final until the end (what one
  item held from the first frame to the last costs); all records kept and computed at the end; and
  the machine alone for reference.

    .venv/bin/python bench/channel_metrics.py [--hot-deliveries 820000] [--bucket-seconds 10] [--no-memory]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import tracemalloc

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from analyzer.timeline import INPUT_COLUMNS, Timelines  # noqa: E402
from analyzer.timeline.metrics import channel_metrics  # noqa: E402
from analyzer.timeline.metrics_stream import stream_metrics  # noqa: E402
from bench.frames_generator import Params, generate  # noqa: E402


def hot_connection(hot_deliveries: int):
    """The generator's first connection (the hot one), as its Arrow slices."""
    done, _row = next(iter(generate(Params(frames=hot_deliveries, hot_deliveries=hot_deliveries))))
    return done


def frame_rows(done, batch_rows: int = 4096):
    """Dicts a batch at a time, as the Spark pass hands Arrow batches to the machine."""
    for table in done.tables():
        for batch in table.select(list(INPUT_COLUMNS)).to_batches(max_chunksize=batch_rows):
            yield from batch.to_pylist()


def records_of(done) -> list:
    timelines = Timelines()
    records = []
    for row in frame_rows(done):
        records += timelines.feed(row)
    return records + timelines.end_of_data()


def peak_mb(work) -> tuple[float, object]:
    tracemalloc.start()
    result = work()
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return peak / 1e6, result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hot-deliveries", type=int, default=820_000)  # about 1 M frames
    parser.add_argument("--bucket-seconds", type=int, default=10)
    parser.add_argument("--no-memory", action="store_true")
    args = parser.parse_args(argv)
    done = hot_connection(args.hot_deliveries)
    print(f"hot connection: {done.n:,} frames", flush=True)

    started = time.process_time()
    records = records_of(done)
    machine = time.process_time() - started
    started = time.process_time()
    rows = channel_metrics(records, args.bucket_seconds)
    spent = time.process_time() - started
    print(f"state machine: {len(records):,} records in {machine:.1f} CPU s ({done.n / machine:,.0f} frames/CPU s)")
    print(f"channel_metrics: {len(rows):,} rows in {spent:.2f} CPU s: {len(records) / spent:,.0f} records per CPU "
          f"second ({done.n / spent:,.0f} frames' worth)", flush=True)
    if args.no_memory:
        return 0
    del records, rows

    def machine_alone():
        timelines = Timelines()
        for row in frame_rows(done):
            timelines.feed(row)
        return len(timelines.end_of_data())

    def streamed():
        return sum(1 for _ in stream_metrics(frame_rows(done), args.bucket_seconds))

    def never_final():
        return sum(1 for _ in stream_metrics(frame_rows(done), args.bucket_seconds, advance_every=1 << 62))

    def all_at_once():
        return len(channel_metrics(records_of(done), args.bucket_seconds))

    for name, work in (("the machine alone, records dropped", machine_alone),
                       ("streamed: machine + metrics, rows out as final", streamed),
                       ("streamed, nothing final until the end (the worst case: an item held from the start)",
                        never_final),
                       ("all records kept, then metrics", all_at_once)):
        peak, count = peak_mb(work)
        print(f"tracemalloc peak, {name}: {peak:,.1f} MB ({count:,} rows)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
