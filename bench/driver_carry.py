"""A scheduled run carried on by the driver without a JVM, next to Spark's carried pass: each in a
new process, as a CronJob runs it (spark_jobs/local_executor.py).

A scheduled run in a fresh process cost ~0.21 of a full run on the 10 M lake with Spark's carried
pass, ~0.11 in a warm driver (bench/README.md, session 49): starting the JVM, the session, the
plans and the Python worker cold was most of it. `ackscope analyze` now carries a few new frames
on in the driver (up to local_executor.DRIVER_FRAMES): this script times it against Spark's
path for the same run (spark_jobs.analyze.analyze with a new session, which always takes Spark's
carried pass: what `ackscope analyze` ran before), on fresh copies of a lake whose last frames
append is not analysed yet; `--check` then compares the two lakes' tables, row for row.

    .venv/bin/python bench/driver_carry.py [--frames 10000000] [--hot-deliveries 3000000] [--repeat 3] [--check]

The lake: the generator's (cached as analyze.py and incremental.py cache it) cut by time at the
last `--tail` share, its head analysed once by `ackscope analyze` and kept under
OUT/driver-carry/after-head; each measurement copies it and appends the tail.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, BENCH_DIR)
sys.path.insert(0, os.path.dirname(BENCH_DIR))

import frames_generator as generator  # noqa: E402
import incremental  # noqa: E402

from analyzer import lake, schema  # noqa: E402


def prepared(args) -> tuple[str, str]:
    """(the analysed head's lake, the tail's staged file), made once per generated lake."""
    source, _ = generator.cached_lake(args.out, generator.params_from_args(args))
    root = os.path.join(args.out, "driver-carry", os.path.basename(os.path.dirname(source)), f"tail-{args.tail}")
    head_lake, tail_file = os.path.join(root, "after-head"), os.path.join(root, "tail.parquet")
    if os.path.exists(os.path.join(root, "ready")):
        return head_lake, tail_file
    shutil.rmtree(root, ignore_errors=True)
    frames = lake.read_table(source, "frames", schema.FRAMES)
    head, tail = generator.as_appended(frames, [1 - args.tail])
    del frames
    head_file, tail_file = incremental.staged(root, "head", head), incremental.staged(root, "tail", tail)
    del head, tail
    incremental.append(head_lake, "frames", head_file, schema.FRAMES, "head")
    incremental.append(head_lake, "connections", lake.read_table(source, "connections", schema.CONNECTIONS),
                       schema.CONNECTIONS, "all")
    os.remove(head_file)
    seconds, _ = incremental.run_analyze(head_lake, args.master, args.driver_memory)
    print(f"the head analysed once: {seconds:.1f} s")
    open(os.path.join(root, "ready"), "w").close()
    return head_lake, tail_file


def appended_copy(head_lake: str, tail_file: str, name: str) -> str:
    work = os.path.join(os.path.dirname(head_lake), name)
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(head_lake, work)
    incremental.append(work, "frames", tail_file, schema.FRAMES, "tail")
    return work


# Spark's path in a new process: a session started as `ackscope analyze` starts it, one run.
SPARK_RUN = """
import json, sys
from spark_jobs.analyze import analyze
from spark_jobs.session import get_spark
spark = get_spark(sys.argv[2], "ackscope-analyze", driver_memory=sys.argv[3])
print(json.dumps(analyze(spark, sys.argv[1]).as_json()))
"""


def timed(cmd: list[str]) -> tuple[float, dict]:
    """A command's wall seconds and the JSON report it printed last."""
    started = time.monotonic()
    done = subprocess.run(cmd, capture_output=True, text=True)
    seconds = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return seconds, json.loads(done.stdout.strip().splitlines()[-1])


def differing_tables(one: str, other: str) -> list[str]:
    """The output tables and checkpoints of two lakes whose rows differ (incremental.tables_digest)."""
    from spark_jobs.analyze import OUTPUT_TABLES
    from spark_jobs.connection_pass import STATE_TABLE

    tables = {**OUTPUT_TABLES, STATE_TABLE: schema.ANALYSIS_STATE}
    first, second = (incremental.tables_digest(folder, tables) for folder in (one, other))
    return [name for name in tables if first[name] != second[name]]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    generator.add_spark_run_arguments(parser, frames=10_000_000, hot_deliveries=3_000_000)
    parser.add_argument("--tail", type=float, default=0.05, help="share of the frames appended last (default %(default)s)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--check", action="store_true", help="compare the two paths' tables after each repeat")
    args = parser.parse_args(argv)

    head_lake, tail_file = prepared(args)
    for n in range(args.repeat):
        driver_lake = appended_copy(head_lake, tail_file, "driver")
        seconds, report = timed([incremental.ACKSCOPE, "analyze", "--lake", driver_lake, "--master", args.master,
                                 "--driver-memory", args.driver_memory, "--json"])
        print(f"run {n + 1}: `ackscope analyze` in a new process: {seconds:.1f} s ({report['frames']:,} new frames of "
              f"{report['connections']} connections; delta_mode {report['delta_mode']}, {report['spark_jobs']} Spark "
              f"jobs, {report['seconds_by_step']})", flush=True)
        spark_lake = appended_copy(head_lake, tail_file, "spark")
        spark_seconds, report = timed([sys.executable, "-c", SPARK_RUN, spark_lake, args.master, args.driver_memory])
        print(f"run {n + 1}: Spark's carried pass in a new process: {spark_seconds:.1f} s ({report['spark_jobs']} "
              f"Spark jobs, {report['seconds_by_step']}); the driver's took {seconds / spark_seconds:.2f} of it",
              flush=True)
        if args.check:
            differ = differing_tables(driver_lake, spark_lake)
            print(f"run {n + 1}: tables {'differ: ' + ', '.join(differ) if differ else 'equal, row for row'}",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
