"""A day of scheduled runs in one driver, compressed: `ackscope analyze --every` on a lake the agent
keeps appending to. Does the driver that stays up stay the same size, and leave nothing behind?

The frames of `frames_generator.py`'s lake are cut by time into `--appends` pieces, as an agent
commits them. The first piece is committed and `ackscope analyze --lake LAKE --every 1s --json` is
started (its own process, Spark's local folder one of the bench's: SPARK_LOCAL_DIRS); each time a
run has analysed the last piece committed, the next piece is appended. After each such run: its
wall clock and Spark jobs (from its report), the resident memory of the command's process tree
(the Python driver, its JVM, Spark's Python workers), and the files and bytes in Spark's local
folder, sampled once a run with nothing new has followed (the loop releases a run's files after
it). Then SIGTERM (the command must exit 0), the files each analysis table has gathered, and
`ackscope analyze --full` over the same lake in a fresh process: the tables must be identical (a
fast wrong answer is not a result).

    .venv/bin/python bench/every.py [--frames 200000] [--hot-deliveries 60000] [--appends 40]
        [--master 'local[2]'] [--driver-memory 2g]
"""

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
REPO_DIR = os.path.dirname(BENCH_DIR)
sys.path.insert(0, BENCH_DIR)
sys.path.insert(0, REPO_DIR)

import frames_generator as generator  # noqa: E402
import incremental as bench  # noqa: E402
from jobs import _descendants  # noqa: E402

from analyzer import lake, schema  # noqa: E402
from spark_jobs.analyze import OUTPUT_TABLES  # noqa: E402


def tree_rss_mb(root: int) -> float:
    """Resident memory of a process and every process under it, now."""
    total_kb = 0
    for pid in [root, *_descendants(root)]:
        try:
            with open(f"/proc/{pid}/status") as status:
                total_kb += next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))
        except (OSError, StopIteration):
            continue
    return total_kb / 1024


def folder_usage(folder: str) -> tuple[int, float]:
    """(files, MB) under a folder."""
    files, size = 0, 0
    for path, _dirs, names in os.walk(folder):
        for name in names:
            try:
                size += os.path.getsize(os.path.join(path, name))
                files += 1
            except OSError:
                continue
    return files, size / 1e6


class Loop:
    """The command, and its reports as they come."""

    def __init__(self, work: str, local_dirs: str, args):
        env = {**os.environ, "SPARK_LOCAL_DIRS": local_dirs}
        self.process = subprocess.Popen(
            [bench.ACKSCOPE, "analyze", "--lake", work, "--master", args.master, "--driver-memory",
             args.driver_memory, "--every", "1s", "--json"], env=env, text=True,
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        self.reports: list[dict] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.process.stdout:
            self.reports.append(json.loads(line))

    def run_of(self, version: int, timeout: float) -> dict:
        """The report of the run that analysed this frames version, once a run with nothing new
        has followed it (so the loop has released what that run left)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for i, report in enumerate(self.reports[:-1]):
                if report["frames_version"] == version and report["connections"] and \
                        any(later["connections"] == 0 for later in self.reports[i + 1:]):
                    return report
            if self.process.poll() is not None:
                raise SystemExit(f"ackscope analyze --every exited with {self.process.returncode}")
            time.sleep(0.2)
        raise SystemExit(f"no run of frames version {version} within {timeout:.0f}s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    generator.add_spark_run_arguments(parser, frames=200_000, hot_deliveries=60_000)
    parser.add_argument("--appends", type=int, default=40, help="pieces the frames are cut into (default %(default)s)")
    parser.add_argument("--timeout", type=float, default=900, help="per run, seconds (default %(default)s)")
    args = parser.parse_args(argv)

    source, _stats = generator.cached_lake(args.out, generator.params_from_args(args))
    frames = lake.read_table(source, "frames", schema.FRAMES)
    connections = lake.read_table(source, "connections", schema.CONNECTIONS)
    pieces = generator.as_appended(frames, [i / args.appends for i in range(1, args.appends)])
    root = os.path.join(args.out, "every")
    work, local_dirs = os.path.join(root, "lake"), os.path.join(root, "spark-local")
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(local_dirs)
    bench.append(work, "connections", connections, schema.CONNECTIONS, "all")
    bench.append(work, "frames", pieces[0], schema.FRAMES, "piece-0")
    print(f"lake: {frames.num_rows:,} generated frames in {len(pieces)} appends of about "
          f"{frames.num_rows // len(pieces):,}; {len(connections)} connections", flush=True)

    loop = Loop(work, local_dirs, args)
    rows = []
    try:
        for i in range(len(pieces)):
            if i:
                bench.append(work, "frames", pieces[i], schema.FRAMES, f"piece-{i}")
            version = lake.open_table(work, "frames").version()
            report = loop.run_of(version, args.timeout)
            files, mb = folder_usage(local_dirs)
            rows.append((i, report, tree_rss_mb(loop.process.pid), files, mb))
            print(f"run {i + 1}: {report['scope']}, {report['connections']} connections, {report['frames']:,} frames, "
                  f"{report['seconds']:.1f} s, {report['spark_jobs']} jobs; process tree {rows[-1][2]:,.0f} MB; "
                  f"Spark local folder {files} files, {mb:.1f} MB"
                  + "".join(f"; compacted {name} {n} files" for name, n in report.get("files_compacted", {}).items()),
                  flush=True)
    finally:
        loop.process.send_signal(signal.SIGTERM)
        status = loop.process.wait(args.timeout)
    after_runs = bench.tables_digest(work)
    files = {name: len(table.file_uris()) for name in sorted(OUTPUT_TABLES) if (table := lake.open_table(work, name))}
    full_seconds, _full = bench.run_analyze(work, args.master, args.driver_memory, "--full")
    same = bench.tables_digest(work) == after_runs

    def spread(values, form: str = ",.1f") -> str:
        return f"{min(values):{form}}-{max(values):{form}}"

    later = rows[1:]
    print(f"\n{len(rows)} runs in one driver; SIGTERM: exit {status}")
    print(f"incremental runs (2nd on): {spread([r[1]['seconds'] for r in later])} s each, "
          f"{spread([r[1]['spark_jobs'] for r in later], ',d')} Spark jobs")
    for label, part in (("first 5", later[:5]), ("last 5", later[-5:])):
        print(f"  {label}: process tree {spread([r[2] for r in part])} MB, Spark local folder "
              f"{spread([r[3] for r in part], ',d')} files, {spread([r[4] for r in part])} MB")
    print("files of the analysis tables after the runs: " + ", ".join(f"{n} {k}" for n, k in files.items()))
    print(f"a full run over the same lake, fresh process: {full_seconds:.1f} s; tables identical to the "
          f"{len(rows)} runs': {'yes' if same else 'NO (MISMATCH)'}")
    return 0 if same and status == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
