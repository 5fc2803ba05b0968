"""A scheduled run's carried pass without a JVM, measured: issue 13's proposal for fresh processes.

A scheduled run in a fresh process (a CronJob's) costs ~0.21 of a full run on the 10 M lake, where
the same run in a warm driver costs ~0.11 (bench/README.md, session 49): starting the JVM, the
session, the plan and the Python worker cold is most of it. The proposal: when the new frames are
few, the driver's Python does the carried pass itself, with no JVM. This script measures what that
would cost before it is built, next to `ackscope analyze` on the same lake: each in a new process,
on a fresh copy of a lake whose last frames append is not analysed yet.

The prototype's process reads the appended frames files (delta-rs's file list of the last version
against the one before), the stored analysis_state and connections rows of their connections
(analyzer/lake.py), lays them out as the carried pass's `mapInArrow` gets them (header rows, then
frames by connection and seq) and runs `timeline/carried.py`'s `_CarriedPartition` over them,
writing its files into a temporary folder. Not in it, so a lower bound of such a run: the commits
(delta-rs, a few per run), the rewrite of the files holding the replaced provisional rows, and the
findings (already the driver's for a scheduled run: ~0.6 s here).

    .venv/bin/python bench/driver_carry.py [--frames 10000000] [--hot-deliveries 3000000] [--repeat 3]

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


def appended_copy(head_lake: str, tail_file: str) -> str:
    work = os.path.join(os.path.dirname(head_lake), "work")
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(head_lake, work)
    incremental.append(work, "frames", tail_file, schema.FRAMES, "tail")
    return work


def timed(cmd: list[str]) -> tuple[float, str]:
    started = time.monotonic()
    done = subprocess.run(cmd, capture_output=True, text=True)
    seconds = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return seconds, done.stdout


def in_process(lake_dir: str) -> None:
    """The prototype, in this (new) process: prints one JSON line of its phases' seconds."""
    import tempfile

    import deltalake
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from analyzer.connection_analysis import ANALYSIS_COLUMNS
    from analyzer.timeline.records import DEFAULT_OVERDUE_NS
    from carried_cpu import carried_layout
    from pass_cpu import HEADER_FIELDS
    from spark_jobs.connection_pass import Settings
    from spark_jobs.thresholds import Thresholds
    from spark_jobs.timeline.carried import STATE_COLUMNS, _CarriedPartition
    imported = time.monotonic()   # the process's wall clock (timed by the caller) holds the interpreter and imports

    frames = deltalake.DeltaTable(os.path.join(lake_dir, "frames"))
    before = set(deltalake.DeltaTable(os.path.join(lake_dir, "frames"), version=frames.version() - 1).file_uris())
    new = pa.concat_tables([pq.read_table(uri, columns=list(ANALYSIS_COLUMNS))
                            for uri in frames.file_uris() if uri not in before])
    ids = pc.unique(new["connection_id"])
    states = lake.read_table(lake_dir, "analysis_state", schema.ANALYSIS_STATE)
    states = states.filter(pc.is_in(states["connection_id"], ids)).select(["connection_id", *STATE_COLUMNS])
    connections = lake.read_table(lake_dir, "connections", schema.CONNECTIONS)
    connections = connections.filter(pc.is_in(connections["connection_id"], ids))
    read = time.monotonic()

    stored = {row["connection_id"]: row for row in states.to_pylist()}
    headers = {row["connection_id"]: json.dumps({name: row[name] for name in HEADER_FIELDS}, default=str)
               for row in connections.to_pylist()}
    rows = carried_layout(new, stored, headers)
    laid_out = time.monotonic()

    with tempfile.TemporaryDirectory() as folder:
        partition = _CarriedPartition(Settings(10, DEFAULT_OVERDUE_NS, Thresholds()), frames.version(), 50_000,
                                      folder, 250_000)
        for _ in partition.run(iter(rows.to_batches(max_chunksize=10_000))):
            pass
    passed = time.monotonic()
    print(json.dumps({"frames": new.num_rows, "connections": len(ids), "reads": read - imported, "layout": laid_out - read, "pass": passed - laid_out}))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    generator.add_spark_run_arguments(parser, frames=10_000_000, hot_deliveries=3_000_000)
    parser.add_argument("--tail", type=float, default=0.05, help="share of the frames appended last (default %(default)s)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--in-process", metavar="LAKE", help=argparse.SUPPRESS)  # the prototype's own process
    args = parser.parse_args(argv)
    if args.in_process:
        in_process(args.in_process)
        return 0

    head_lake, tail_file = prepared(args)
    for n in range(args.repeat):
        work = appended_copy(head_lake, tail_file)
        seconds, out = timed([sys.executable, os.path.abspath(__file__), "--in-process", work])
        phases = json.loads(out.strip().splitlines()[-1])
        print(f"run {n + 1}: the carried pass in a new Python process, no JVM: {seconds:.1f} s "
              f"({phases['frames']:,} new frames of {phases['connections']} connections; of it reads "
              f"{phases['reads']:.2f}, layout {phases['layout']:.2f}, pass {phases['pass']:.2f} s)", flush=True)
        work = appended_copy(head_lake, tail_file)
        seconds, out = timed([incremental.ACKSCOPE, "analyze", "--lake", work, "--master", args.master,
                              "--driver-memory", args.driver_memory, "--json"])
        report = json.loads(out)
        print(f"run {n + 1}: `ackscope analyze` in a new process: {seconds:.1f} s ({report['spark_jobs']} Spark "
              f"jobs, {report['seconds_by_step']})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
