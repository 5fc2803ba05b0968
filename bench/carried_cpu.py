"""The carried pass's Python, without Spark: what an incremental run's carry step costs per CPU second.

Generates frames in memory (frames_generator.py), analyses the capture window up to its last
`--tail` share (split by time, as incremental.py splits the lake) with the pass over whole
connections (pass_cpu.py's input and `_Partition`), then lays out what the carried pass's
`mapInArrow` receives for the rest (spark_jobs/connection_pass.py's `connection_pass` with `states`:
each connection with new frames, its header row holding its analysis_state row's checkpoint and its
connections row, then its new frames in seq order, in Arrow batches of Spark's default 10,000 rows)
and runs `_Partition.run` (a carried one) over it in this process, its files written to a temporary folder as the
tasks write them into the lake. Spark's part (reading, the join with analysis_state, shuffle,
sort) is not in it.

Printed: the checkpoints' bytes and records carried, each repeat's CPU seconds and the best, and
where the best run's CPU went by phase (the checkpoints read, the new rows fed, the connections
finished, the next checkpoints written) from a profile of one more run; a digest of the rows
written and of the wide rows, which a change that should alter no output must leave as it was.

    .venv/bin/python bench/carried_cpu.py [--frames 1000000] [--hot-deliveries 300000] [--tail 0.05] [--repeat 3]
"""

from __future__ import annotations

import argparse
import cProfile
import hashlib
import os
import pstats
import sys
import tempfile
import time

import pyarrow as pa
import pyarrow.compute as pc

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, BENCH_DIR)
sys.path.insert(0, os.path.dirname(BENCH_DIR))

import frames_generator as generator  # noqa: E402
from pass_cpu import SPARK_BATCH_ROWS, pass_input, run_pass, written  # noqa: E402

from analyzer.timeline.records import DEFAULT_OVERDUE_NS  # noqa: E402
from analyzer.connection_analysis import ANALYSIS_COLUMNS  # noqa: E402
from spark_jobs.local_executor import laid_out  # noqa: E402
from spark_jobs.connection_pass import (ADVANCE_EVERY_ROWS, HEADER, HEADER_SEQ, STATE_TABLE, Settings,  # noqa: E402
                                        _Partition)
from analyzer.detectors.thresholds import Thresholds  # noqa: E402
from spark_jobs.timeline.wide import RECORD, ROLE  # noqa: E402

FILE_ROWS = 1_000_000    # wide_writes.FILE_ROWS's order: a carried run's few rows make one file a table
FLUSH_RECORDS = 50_000   # connection_pass.FLUSH_RECORDS
# Where the profile's CPU goes, by the functions that bound each phase (cumulative time; the rest
# is the partition's loop and its batches made rows).
PHASES = {"connections started": ("connection_pass.py", "_start"), "of which checkpoints read": ("carry.py", "load"),
          "new rows fed": ("connection_analysis.py", "feed_from"),
          "connections finished": ("connection_pass.py", "_finish"),
          "of which checkpoints written": ("carry.py", "dump"), "flushes": ("connection_pass.py", "_flush"),
          "files written": ("wide_writes.py", "files")}


def split_by_time(rows: pa.Table, tail: float) -> tuple[pa.Table, pa.Table, int]:
    """(the head's input with every header row, the tail's frame rows, the cut in ns)."""
    frames = rows.filter(pc.not_equal(rows["seq"], HEADER_SEQ))
    times = frames["ts_ns"].to_numpy()
    times.sort()
    cut = int(times[int(len(times) * (1 - tail))])
    is_header = pc.equal(rows["seq"], HEADER_SEQ)
    head = rows.filter(pc.or_(is_header, pc.less(rows["ts_ns"], cut)))
    return head, frames.filter(pc.greater_equal(frames["ts_ns"], cut)), cut


def carried_input(rows: pa.Table, head_states: pa.Table, tail: pa.Table) -> tuple[pa.Table, int, int]:
    """The carried pass's input after the head's pass (`head_states`: the analysis_state rows it
    wrote), the checkpoints' bytes and their carried records."""
    states = {row["connection_id"]: row for row in head_states.to_pylist()}
    headers = {row["connection_id"]: row[HEADER] for row in
               rows.filter(pc.equal(rows["seq"], HEADER_SEQ)).select(["connection_id", HEADER]).to_pylist()}
    touched = set(tail["connection_id"].to_pylist())
    checkpoints = [state for c, state in states.items() if c in touched and state["checkpoint"] is not None]
    tail = tail.select(list(ANALYSIS_COLUMNS))
    return (laid_out(tail, {key: headers.get(key) for key in set(tail["connection_id"].to_pylist())}, states),
            sum(len(s["checkpoint"]) for s in checkpoints),
            sum(s["carried_records"] for s in checkpoints))


def run_carried(batches: list[pa.RecordBatch], settings: Settings, folder: str) -> list[pa.RecordBatch]:
    partition = _Partition(settings, 1, FLUSH_RECORDS, ADVANCE_EVERY_ROWS, folder, FILE_ROWS, carried=True)
    return list(partition.run(iter(batches)))


def digest(out: list[pa.RecordBatch], folder: str) -> str:
    """Of the rows written and of the wide rows (each as its table's row: the wide table's shape
    aside), in any order, but what says what the checkpoints hold (analysis_state's checkpoint,
    format and carried_records, the tally's carried_records: a checkpoint's shape may change alone),
    the tally's metrics_redo (a whole pass's), the files' names and the flushes' counts."""
    lines = []
    for name, table in written(out, folder).items():
        if name == STATE_TABLE:
            table = table.drop_columns(["checkpoint", "format", "carried_records"])
        lines += [f"{name} {row!r}" for row in table.to_pylist()]
    for batch in out:
        for row in batch.to_pylist():
            own = row[row[RECORD]]
            if row[RECORD] in ("tally", "fallback"):
                for column in ("carried_records", "metrics_redo", "streamed"):
                    own.pop(column, None)
            if row[RECORD] not in ("files", "counts"):
                lines.append(repr((row[RECORD], row[ROLE], own)))
    return hashlib.sha256("\n".join(sorted(lines)).encode()).hexdigest()[:16]


def phases(profiler: cProfile.Profile) -> dict[str, float]:
    stats = pstats.Stats(profiler).stats
    spent = {}
    for phase, (file, function) in PHASES.items():
        spent[phase] = max((cumulative for (path, _, name), (_, _, _, cumulative, _) in stats.items()
                            if name == function and path.endswith(os.sep + file)), default=0.0)
    return spent


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    generator.add_arguments(parser)
    parser.set_defaults(frames=1_000_000, hot_deliveries=300_000)
    parser.add_argument("--tail", type=float, default=0.05, help="the share of frames carried on (default 0.05)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--top", type=int, default=0, help="also print the profile's top functions")
    args = parser.parse_args(argv)

    rows, _ = pass_input(generator.params_from_args(args))
    settings = Settings(10, DEFAULT_OVERDUE_NS, Thresholds())
    head, tail, _ = split_by_time(rows, args.tail)
    with tempfile.TemporaryDirectory() as folder:
        head_states = written(run_pass(head.to_batches(max_chunksize=SPARK_BATCH_ROWS), settings, folder),
                              folder)[STATE_TABLE]
    table, checkpoint_bytes, carried = carried_input(rows, head_states, tail)
    batches = table.to_batches(max_chunksize=SPARK_BATCH_ROWS)
    connections = table.num_rows - tail.num_rows
    print(f"input: {tail.num_rows:,} new frames of {connections} connections; checkpoints {checkpoint_bytes:,} "
          f"bytes, {carried:,} records carried")
    times, digests = [], set()
    for _ in range(args.repeat):
        with tempfile.TemporaryDirectory() as folder:
            started = time.process_time()
            out = run_carried(batches, settings, folder)
            times.append(time.process_time() - started)
            digests.add(digest(out, folder))
    print("CPU s per run: " + ", ".join(f"{t:.2f}" for t in times))
    best = min(times)
    print(f"best of {args.repeat}: {best:.2f} CPU s, {tail.num_rows / best:,.0f} new frames per CPU s")
    with tempfile.TemporaryDirectory() as folder:
        profiler = cProfile.Profile()
        profiler.enable()
        run_carried(batches, settings, folder)
        profiler.disable()
    spent = phases(profiler)
    total = pstats.Stats(profiler).total_tt
    print(f"profiled run ({total:.2f} CPU s under cProfile), CPU s by phase: "
          + ", ".join(f"{phase} {s:.2f}" for phase, s in spent.items()))
    if args.top:
        pstats.Stats(profiler).sort_stats("cumulative").print_stats(args.top)
    print(f"output digest {' '.join(sorted(digests))}" + ("" if len(digests) == 1 else " (runs differ!)"))
    return 0 if len(digests) == 1 else 1


if __name__ == "__main__":
    sys.exit(main())
