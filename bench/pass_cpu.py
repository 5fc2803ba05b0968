"""The connection pass's Python, without Spark: CPU seconds and frames per CPU second.

Generates frames in memory (bench/frames_generator.py), lays them out as the pass's `mapInArrow`
receives them (spark_jobs/connection_pass.py: each connection's header row first, then its frames
in seq order, in Arrow batches of Spark's default 10,000 rows) and runs `_Partition.run` over them
in this process: the state machine, channel_metrics, the detectors, the records back to Arrow and
their files written (into a temporary folder, as the tasks write them into the lake), everything
the pass's Python does per connection. Spark's own part (shuffle, sort, Arrow to and from the JVM)
is not in it. Prints the CPU seconds of each repeat (process time, the writer's thread too) and the
best, and a digest of the output rows (those written and the wide table's), which a change that
should alter no output must leave as it was.
The C parts (analyzer/columns.py, records.py's makers) run in it where they are built;
ACKSCOPE_PURE_PYTHON=1 runs the Python paths alone, to the same digest.

    .venv/bin/python bench/pass_cpu.py [--frames 200000] [--hot-deliveries 60000] [--repeat 3]
        [--profile [--top 30] [--sort tottime]]
"""

from __future__ import annotations

import argparse
import cProfile
import hashlib
import json
import os
import pstats
import sys
import tempfile
import time

import pyarrow as pa

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, BENCH_DIR)
sys.path.insert(0, os.path.dirname(BENCH_DIR))

import frames_generator as generator  # noqa: E402

from spark_jobs.connection_pass import (ADVANCE_EVERY_ROWS, ANALYSIS_COLUMNS, FLUSH_RECORDS, HEADER, HEADER_SEQ,  # noqa: E402
                                        PASS_TABLES, RAW_FINDINGS, STATE_TABLE, TALLY, WRITTEN_TABLES, Settings,
                                        _Partition)
from analyzer.detectors.thresholds import Thresholds  # noqa: E402
from spark_jobs.timeline.wide import RECORD, ROLE, rows_from_wide  # noqa: E402
from analyzer import schema  # noqa: E402
from analyzer.lake import TableWriter  # noqa: E402
from analyzer.timeline.records import DEFAULT_OVERDUE_NS  # noqa: E402

SPARK_BATCH_ROWS = 10_000    # spark.sql.execution.arrow.maxRecordsPerBatch's default
CHECKPOINT = f"{STATE_TABLE}__checkpoint"   # as flat_row names it
HEADER_FIELDS = ("connection_id", "first_ts_ns", "agent_id", "connection_name", "client_addr", "client_port",
                 "server_addr", "server_port", "source", "last_ts_ns")


def pass_input(params: generator.Params) -> tuple[pa.Table, int]:
    """The pass's input rows (ANALYSIS_COLUMNS and the header column), connection by connection,
    and the number of frame rows."""
    columns = [field for field in schema.FRAMES if field.name in ANALYSIS_COLUMNS]
    input_schema = pa.schema([*sorted(columns, key=lambda f: ANALYSIS_COLUMNS.index(f.name)), (HEADER, pa.string())])
    pieces, frames = [], 0
    for item in generator.generate(params):
        if isinstance(item, dict):
            break
        done, row = item
        header = {name: row.get(name) for name in HEADER_FIELDS}
        pieces.append(pa.Table.from_pylist([{"connection_id": row["connection_id"], "seq": HEADER_SEQ,
                                             HEADER: json.dumps(header, default=str)}], schema=input_schema))
        for table in done.tables():
            frames += table.num_rows
            table = table.select(list(ANALYSIS_COLUMNS))
            pieces.append(table.append_column(HEADER, pa.nulls(table.num_rows, pa.string())).cast(input_schema))
    return pa.concat_tables(pieces), frames


def run_pass(batches: list[pa.RecordBatch], settings: Settings, folder: str) -> list[pa.RecordBatch]:
    """The pass's wide rows, its tables' files written into `folder`."""
    return list(_Partition(settings, None, FLUSH_RECORDS, ADVANCE_EVERY_ROWS, folder).run(iter(batches)))


def written(out: list[pa.RecordBatch], folder: str) -> dict[str, pa.Table]:
    """The rows of each of WRITTEN_TABLES in the files the pass wrote into `folder` (its `files` rows)."""
    files = rows_from_wide(pa.Table.from_batches(out), "files", PASS_TABLES["files"]).to_pylist()
    return {name: pa.concat_tables([table_schema.empty_table(), *[
        TableWriter(folder, name, table_schema).read_file(file["path"], file["date"])
        for file in files if file["table"] == name]]) for name, table_schema in WRITTEN_TABLES.items()}


# The tables of the digest, in the order of the pass's one wide table when it was fixed (session 20,
# when every table's rows were in it): each row is digested as that table's flat `table__column`
# row (every table's columns, the others' null), so that digests stay comparable with the figures
# printed before. A flush's counts and the files are left out.
DIGESTED = {**{name: WRITTEN_TABLES[name] for name in WRITTEN_TABLES if name != STATE_TABLE},
            "raw_findings": RAW_FINDINGS, STATE_TABLE: WRITTEN_TABLES[STATE_TABLE],
            "tally": pa.schema([TALLY.field(name) for name in ("connection_id", "frames", "metrics_redo")])}


def flat_row(name: str, row: dict) -> dict:
    return {RECORD: name, ROLE: None, **{f"{table}__{column}": row[column] if table == name else None
                                         for table, table_schema in DIGESTED.items() for column in table_schema.names}}


def digests(out: list[pa.RecordBatch], folder: str) -> tuple[int, str, str]:
    """(rows, a digest of the output rows in any order without the checkpoints, one of the
    checkpoints): a change of the checkpoint's shape changes only the second."""
    tables = {**written(out, folder), **{name: rows_from_wide(pa.Table.from_batches(out), name, DIGESTED[name])
                                         for name in ("raw_findings", "tally")}}
    rows, checkpoints = [], []
    for name, table in tables.items():
        for row in table.to_pylist():
            row = flat_row(name, row)
            checkpoints.append(repr(row.pop(CHECKPOINT)))
            rows.append(repr(row))
    return (len(rows), *(hashlib.sha256("\n".join(sorted(x)).encode()).hexdigest()[:16] for x in (rows, checkpoints)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    generator.add_arguments(parser)
    parser.set_defaults(frames=200_000, hot_deliveries=60_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--profile", action="store_true", help="one more run under cProfile, its top functions")
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--sort", default="tottime", help="cProfile sort key (default %(default)s)")
    parser.add_argument("--no-digest", action="store_true", help="skip the digest of the output rows")
    args = parser.parse_args(argv)

    rows, frames = pass_input(generator.params_from_args(args))
    batches = rows.to_batches(max_chunksize=SPARK_BATCH_ROWS)
    settings = Settings(10, DEFAULT_OVERDUE_NS, Thresholds())
    connections = rows.num_rows - frames
    print(f"input: {frames:,} frames of {connections} connections, {len(batches)} Arrow batches")
    times, digested = [], None
    for _ in range(args.repeat):
        with tempfile.TemporaryDirectory() as folder:
            started = time.process_time()
            out = run_pass(batches, settings, folder)
            times.append(time.process_time() - started)
            if not args.no_digest:
                digested = digests(out, folder)
    print("CPU s per run: " + ", ".join(f"{t:.2f}" for t in times))
    best = min(times)
    print(f"best of {args.repeat}: {best:.2f} CPU s, {frames / best:,.0f} frames per CPU s")
    if digested is not None:
        n, tables, checkpoints = digested
        print(f"output: {n:,} rows, digest {tables} (checkpoints {checkpoints})")
    if args.profile:
        profiler = cProfile.Profile()
        with tempfile.TemporaryDirectory() as folder:
            profiler.enable()
            run_pass(batches, settings, folder)
            profiler.disable()
        pstats.Stats(profiler).sort_stats(args.sort).print_stats(args.top)
    return 0


if __name__ == "__main__":
    sys.exit(main())
