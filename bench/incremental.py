"""Incremental analysis benchmark: what a scheduled `ackscope analyze` costs when a little new data
has arrived, next to a full run over the same lake.

The frames come from bench/frames_generator.py (the lake bench/analyze.py times, cached the same
way). They are split by time: the first part is committed and analysed (a full run: the first one),
then the last `--tail` share is appended, as the agent would, and analysed incrementally (the
connections with new frames carried on from their checkpoints: only the new frames are read);
then the same lake is analysed again with `--full`. Printed: wall clock of each, the ratio, how
many connections each analysed (and carried), the frame rows each read, and whether the two left
identical tables (they must: a fast wrong answer is not a result). The three runs are made twice,
side by side: each in a fresh `ackscope analyze` process (a CronJob's runs), then all in one
driver kept up between them (`ackscope analyze --every`'s).

    .venv/bin/python bench/incremental.py [--frames 1000000] [--hot-deliveries 300000] [--tail 0.05]
        [--master 'local[2]'] [--driver-memory 2g] [--drivers fresh,warm]
"""

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
REPO_DIR = os.path.dirname(BENCH_DIR)
sys.path.insert(0, BENCH_DIR)
sys.path.insert(0, REPO_DIR)

import frames_generator as generator  # noqa: E402

from analyzer import lake, schema  # noqa: E402
from spark_jobs.analyze import OUTPUT_TABLES  # noqa: E402

ACKSCOPE = os.path.join(os.path.dirname(os.path.abspath(sys.executable)), "ackscope")
DIGEST_ROWS = 100_000
SORT_KEYS = ("finding_id", "connection_id", "channel", "incarnation", "seq", "bucket_start_ns", "kind")


def staged(folder: str, name: str, table: pa.Table) -> str:
    """`table` as a Parquet file of its own, for `append` to read back: the runs are timed with
    the frames out of this process's memory (held, the 10 M lake's took ~12 GB beside Spark)."""
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"{name}.parquet")
    pq.write_table(table, path)
    return path


def append(lake_dir: str, name: str, rows: pa.Table | str, schema_: pa.Schema, app_id: str) -> None:
    """`rows` (a table, or a file `staged` wrote) appended to the lake's table `name` in one commit."""
    batches = (pq.ParquetFile(rows).iter_batches(batch_size=1_000_000) if isinstance(rows, str)
               else rows.to_batches(max_chunksize=1_000_000))
    writer = lake.TableWriter(lake_dir, name, schema_)
    for batch in batches:
        writer.write(pa.Table.from_batches([batch]))
    writer.commit(app_id)


def run_analyze(lake_dir: str, master: str, driver_memory: str, *extra: str) -> tuple[float, dict]:
    cmd = [ACKSCOPE, "analyze", "--lake", lake_dir, "--master", master, "--driver-memory", driver_memory,
           "--json", *extra]
    started = time.monotonic()
    done = subprocess.run(cmd, capture_output=True, text=True)
    seconds = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return seconds, json.loads(done.stdout)


def tables_digest(lake_dir: str, tables: dict[str, pa.Schema] = OUTPUT_TABLES, ignored: tuple[str, ...] = ()) -> dict[str, str]:
    """A digest of each table's rows (by name: the output tables unless told; without the `ignored`
    columns) in a fixed order, hashed a slice at a time: the 10 M-frame lake's deliveries as one list
    of Python rows would not fit in memory."""
    digests = {}
    for name, table_schema in tables.items():
        table = lake.read_table(lake_dir, name, table_schema)
        table = table.drop_columns([column for column in ignored if column in table.column_names])
        table = table.sort_by([(k, "ascending") for k in SORT_KEYS if k in table.column_names]).combine_chunks()
        digest = hashlib.sha256()
        for offset in range(0, table.num_rows, DIGEST_ROWS):
            digest.update(repr(table.slice(offset, DIGEST_ROWS).to_pylist()).encode())
        digests[name] = digest.hexdigest()[:16]
        del table
        pa.default_memory_pool().release_unused()
    return digests


class OneDriver:
    """The runs in this process's own Spark driver, kept up between them as `ackscope analyze
    --every` keeps it (and released after each the same way): only the first pays the JVM's start.
    A small append's run is the driver's without Spark, as `--every` makes it (local_executor.py)."""

    def __init__(self, master: str, driver_memory: str):
        from spark_jobs.session import get_spark

        self.spark = get_spark(master, "ackscope-bench-incremental", driver_memory=driver_memory)

    def run(self, lake_dir: str, full: bool = False) -> tuple[float, dict]:
        """One run as `--every` makes it: planned, then by the driver without Spark where it can
        (analyze's local executor: a small append), else with this driver's Spark."""
        from analyzer.timeline.records import DEFAULT_OVERDUE_NS
        from spark_jobs.analyze import analyze, planned_run
        from analyzer.detectors.thresholds import Thresholds

        started = time.monotonic()
        plan = planned_run(lake_dir, None, None, full, 10, DEFAULT_OVERDUE_NS, Thresholds())
        report = analyze(self.spark, lake_dir, full=full, plan=plan, local=True).as_json()
        seconds = time.monotonic() - started
        return seconds, report


def runs_of(driver: str, work: str, head: str, tail: str, connections: pa.Table, args) -> tuple[list, bool]:
    """The first run over the head, the incremental run after the tail's append, then a full run
    over everything: each a process of its own (`fresh`), or all in one driver (`warm`)."""
    shutil.rmtree(os.path.dirname(work), ignore_errors=True)
    append(work, "frames", head, schema.FRAMES, "head")
    append(work, "connections", connections, schema.CONNECTIONS, "all")
    one = OneDriver(args.master, args.driver_memory) if driver == "warm" else None

    def timed(name: str, full: bool = False) -> tuple[float, dict]:
        if one is None:
            seconds, report = run_analyze(work, args.master, args.driver_memory, *(["--full"] if full else []))
        else:
            seconds, report = one.run(work, full)
        print(f"{driver} driver, {name}: {seconds:.1f} s, {report['spark_jobs']} Spark jobs, "
              f"{report['seconds_by_step']}", flush=True)
        return seconds, report

    first = timed("first run")
    append(work, "frames", tail, schema.FRAMES, "tail")
    incremental = timed("incremental run")
    after_incremental = tables_digest(work)
    full = timed("full run", full=True)
    same = tables_digest(work) == after_incremental
    if one is not None:
        one.spark.stop()
    return [("first run (full, head only)", *first), ("incremental run after the append", *incremental),
            ("full run over everything (--full)", *full)], same


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    generator.add_spark_run_arguments(parser, frames=1_000_000, hot_deliveries=300_000)
    parser.add_argument("--tail", type=float, default=0.05, help="share of the frames appended last (default %(default)s)")
    parser.add_argument("--drivers", default="fresh,warm",
                        help="fresh: each run an `ackscope analyze` process of its own (a CronJob's runs); warm: "
                             "all in one driver (`ackscope analyze --every`'s); default %(default)s")
    args = parser.parse_args(argv)
    drivers = args.drivers.split(",")
    if not drivers or set(drivers) - {"fresh", "warm"}:
        parser.error(f"--drivers {args.drivers!r}: fresh, warm or both")

    source, stats = generator.cached_lake(args.out, generator.params_from_args(args))
    frames = lake.read_table(source, "frames", schema.FRAMES)
    connections = lake.read_table(source, "connections", schema.CONNECTIONS)
    head, tail = generator.as_appended(frames, [1 - args.tail])
    work = os.path.join(args.out, "incremental", "lake")
    print(f"lake: {frames.num_rows:,} generated frames; first {head.num_rows:,} committed, then {tail.num_rows:,} "
          f"appended ({args.tail:.0%}); {len(pc.unique(frames['connection_id']))} connections, "
          f"{len(pc.unique(tail['connection_id']))} of them with appended frames", flush=True)
    folder = os.path.join(args.out, "incremental-staged")
    head, tail = staged(folder, "head", head), staged(folder, "tail", tail)
    del frames
    pa.default_memory_pool().release_unused()

    results = {driver: runs_of(driver, work, head, tail, connections, args) for driver in drivers}
    print(f"\n{'driver':<6} {'run':<38} {'scope':<9} {'connections':>11} {'carried':>8} {'frames read':>12} "
          f"{'wall s':>8}")
    for driver, (rows, _same) in results.items():
        for name, seconds, r in rows:
            print(f"{driver:<6} {name:<38} {r['scope']:<9} {r['connections']:>11,} {r['carried_connections']:>8,} "
                  f"{r['frames']:>12,} {seconds:>8.1f}")
    for driver, (rows, _same) in results.items():
        for name, _seconds, r in rows:
            steps = ", ".join(f"{step} {s:.1f}" for step, s in r["seconds_by_step"].items())
            print(f"  {driver}, {name}: {r['spark_jobs']} Spark jobs; seconds by step: {steps}")
    incremental_report = next(iter(results.values()))[0][1][2]
    print(f"\nincremental run: {incremental_report['carried_records']:,} records carried in checkpoints; "
          f"{incremental_report['reason']}")
    for driver, (rows, same) in results.items():
        incremental, full = rows[1][1], rows[2][1]
        print(f"{driver} driver: incremental / full: {incremental / full:.2f} of the time; tables identical after "
              f"both: {'yes' if same else 'NO (MISMATCH)'}")
    return 0 if all(same for _rows, same in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
