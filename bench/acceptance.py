"""Speed against another checkout (issue 58's acceptance: each figure against the commit before the
work, in the same run on the same machine): this checkout's `ackscope` and another's, each from
its own .venv, timed figure by figure, which of the two goes first alternating from one repeat to
the next, each run a new process:

- demo: `ackscope demo --lake TMP` (the bundled sample ingested, analysed, reported), a new lake each run;
- demo-lake: `ackscope analyze --lake L --full` on the sample's lake (ingested once by this
  checkout), its output removed before each run;
- lake-1, lake-2: `ackscope analyze --lake L --master local[N] --driver-memory 2g` on
  bench/analyze.py's generated lake (10 M frames by default), its small input files merged once
  before the first timed run (as this checkout's first analysis would), its output removed before each run;
- append: a scheduled `ackscope analyze --master local[2]` after the last `--tail` share of that
  lake's frames is appended to a copy of a lake whose first part the same checkout analysed
  (bench/incremental.py's split; the first run is made once per checkout, outside the timing).

Printed per figure: each checkout's median seconds, the ratio (this / other; issue 58 allows none
over 1.10), and whether the two left identical output tables (bench/incremental.py's digest, taken
after each checkout's first run of the figure; the demo's without findings' `source`, the path of
each checkout's own copy of the sample). `--lock FILE`: each timed run holds that lock
(flock), so runs of other sessions' Spark on a shared machine take turns with these.

    .venv/bin/python bench/acceptance.py --against DIR [--figures demo,demo-lake,lake-1,lake-2,append]
        [--repeat 3] [--frames 10000000] [--hot-deliveries 3000000] [--tail 0.05] [--lock /tmp/ackscope-spark.lock]
"""

import argparse
import fcntl
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
REPO_DIR = os.path.dirname(BENCH_DIR)
sys.path.insert(0, BENCH_DIR)
sys.path.insert(0, REPO_DIR)

import frames_generator as generator  # noqa: E402
from analyze import clear_outputs  # noqa: E402
from incremental import append, staged, tables_digest  # noqa: E402

from analyzer import lake, schema  # noqa: E402
from spark_jobs.compaction import merge_analysed_input  # noqa: E402

FIGURES = ("demo", "demo-lake", "lake-1", "lake-2", "append")
ALLOWED_RATIO = 1.10
DRIVER_MEMORY = "2g"


class Checkout:
    def __init__(self, label: str, folder: str):
        self.label, self.folder = label, os.path.abspath(folder)
        self.ackscope = os.path.join(self.folder, ".venv", "bin", "ackscope")
        if not os.access(self.ackscope, os.X_OK):
            raise SystemExit(f"bench/acceptance.py: no {self.ackscope}: run `make venv` in {self.folder}")
        self.commit = subprocess.run(["git", "-C", self.folder, "rev-parse", "--short", "HEAD"],
                                     capture_output=True, text=True).stdout.strip() or "?"


@contextmanager
def held(lock: str | None):
    if lock is None:
        yield
        return
    with open(lock, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def timed(checkout: "Checkout", args: list[str], lock: str | None) -> float:
    """`ackscope ARGS` of this checkout, run in its folder: Spark's Python workers import the
    analysis from their working directory first, so a run started elsewhere would mix two codes."""
    cmd = [checkout.ackscope, *args]
    with held(lock):
        started = time.monotonic()
        done = subprocess.run(cmd, capture_output=True, text=True, cwd=checkout.folder)
        seconds = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
    return seconds


class Figure:
    """One figure: `prepare(checkout)` once per checkout, then `run(checkout)` (timed) per repeat;
    `lake(checkout)` the lake whose output tables the run leaves."""

    ignored: tuple[str, ...] = ()   # columns left out of the tables' comparison

    def __init__(self, name: str, work: str, lock: str | None):
        self.name, self.work, self.lock = name, work, lock

    def prepare(self, checkout: Checkout) -> None:
        pass


class Demo(Figure):
    # Each checkout's demo ingests its own copy of the bundled sample, and a finding's `source`
    # names the capture file it came from: that column differs by the checkouts' folders alone.
    ignored = ("source",)

    def lake(self, checkout):
        return os.path.join(self.work, f"demo-{checkout.label}")

    def run(self, checkout):
        shutil.rmtree(self.lake(checkout), ignore_errors=True)
        return timed(checkout, ["demo", "--lake", self.lake(checkout)], self.lock)


class Analyze(Figure):
    """`ackscope analyze` over a lake of fixed input, its output removed before each run."""

    def __init__(self, name, work, lock, source: str, extra: list[str]):
        super().__init__(name, work, lock)
        self.source, self.extra = source, extra

    def lake(self, checkout):
        return self.source

    def run(self, checkout):
        clear_outputs(self.source)
        return timed(checkout, ["analyze", "--lake", self.source, *self.extra], self.lock)


class Append(Figure):
    """The scheduled run after an append, on a copy of the lake the checkout analysed before it."""

    def __init__(self, name, work, lock, head: str, tail: str, connections):
        super().__init__(name, work, lock)
        self.head, self.tail, self.connections = head, tail, connections

    def analysed(self, checkout):
        return os.path.join(self.work, f"append-analysed-{checkout.label}")

    def lake(self, checkout):
        return os.path.join(self.work, f"append-{checkout.label}")

    def prepare(self, checkout):
        folder = self.analysed(checkout)
        shutil.rmtree(folder, ignore_errors=True)
        append(folder, "frames", self.head, schema.FRAMES, "head")
        append(folder, "connections", self.connections, schema.CONNECTIONS, "all")
        timed(checkout, ["analyze", "--lake", folder, "--master", "local[2]", "--driver-memory", DRIVER_MEMORY],
              self.lock)

    def run(self, checkout):
        work = self.lake(checkout)
        shutil.rmtree(work, ignore_errors=True)
        shutil.copytree(self.analysed(checkout), work)
        append(work, "frames", self.tail, schema.FRAMES, "tail")
        return timed(checkout, ["analyze", "--lake", work, "--master", "local[2]", "--driver-memory", DRIVER_MEMORY],
                     self.lock)


def figures(names: list[str], work: str, this: Checkout, args) -> list[Figure]:
    made: list[Figure] = []
    lock = args.lock
    if "demo" in names:
        made.append(Demo("demo", work, lock))
    if "demo-lake" in names:
        sample = os.path.join(work, "sample-lake")
        shutil.rmtree(sample, ignore_errors=True)
        captures = [os.path.join(REPO_DIR, "analyzer", "samples", f)
                    for f in sorted(os.listdir(os.path.join(REPO_DIR, "analyzer", "samples")))]
        subprocess.run([this.ackscope, "ingest", *captures, "--lake", sample, "--no-progress"], check=True,
                       capture_output=True)
        made.append(Analyze("demo-lake", work, lock, sample, ["--full"]))
    big = [n for n in names if n in ("lake-1", "lake-2", "append")]
    if big:
        source, stats = generator.cached_lake(args.out, generator.params_from_args(args))
        print(f"generated lake {source}: {stats['frames']:,} frames", flush=True)
        # This checkout's analysis merges the small files of its input after a complete run
        # (compaction.merge_analysed_input); the base commit's does not. Merged here, once, before any
        # timed run: otherwise this checkout's first run pays a one-off merge (7.5 s of a 10 M-frame
        # run at local[1]) and every later run of either checkout reads other files than the first.
        merged = merge_analysed_input(source, lake.open_table(source, "frames").version(), "acceptance")
        if merged:
            print(f"generated lake: its small input files merged first ({merged})", flush=True)
        for cores in ("1", "2"):
            if f"lake-{cores}" in names:
                made.append(Analyze(f"lake-{cores}", work, lock, source,
                                    ["--master", f"local[{cores}]", "--driver-memory", DRIVER_MEMORY]))
        if "append" in names:
            frames = lake.read_table(source, "frames", schema.FRAMES)
            head, tail = generator.as_appended(frames, [1 - args.tail])
            print(f"append: {head.num_rows:,} frames analysed first, then {tail.num_rows:,} appended "
                  f"({args.tail:.0%})", flush=True)
            folder = os.path.join(work, "staged")
            head, tail = staged(folder, "head", head), staged(folder, "tail", tail)
            del frames
            made.append(Append("append", work, lock, head, tail,
                               lake.read_table(source, "connections", schema.CONNECTIONS)))
    return made


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    generator.add_arguments(parser)
    parser.add_argument("--out", default=os.path.join(BENCH_DIR, "out"), metavar="DIR",
                        help="where generated lakes are cached (bench/analyze.py's; default %(default)s)")
    parser.add_argument("--against", required=True, metavar="DIR", help="the other checkout (with its own .venv)")
    parser.add_argument("--figures", default=",".join(FIGURES), help="default %(default)s")
    parser.add_argument("--repeat", type=int, default=3, metavar="N", help="runs per figure and checkout (default %(default)s)")
    parser.add_argument("--tail", type=float, default=0.05, help="the append's share of the frames (default %(default)s)")
    parser.add_argument("--lock", default=None, metavar="FILE", help="a lock each timed run holds (flock)")
    args = parser.parse_args(argv)
    names = [n for n in args.figures.split(",") if n]
    if set(names) - set(FIGURES):
        parser.error(f"--figures: {sorted(set(names) - set(FIGURES))} unknown; known: {', '.join(FIGURES)}")
    this, other = Checkout("this", REPO_DIR), Checkout("other", args.against)
    print(f"this: {this.folder} at {this.commit}; other: {other.folder} at {other.commit}", flush=True)
    work = tempfile.mkdtemp(prefix="ackscope-acceptance-")
    results = []
    try:
        for figure in figures(names, work, this, args):
            seconds = {this.label: [], other.label: []}
            same = {}
            for checkout in (this, other):
                figure.prepare(checkout)
            for attempt in range(args.repeat):
                order = (this, other) if attempt % 2 == 0 else (other, this)
                for checkout in order:
                    took = figure.run(checkout)
                    seconds[checkout.label].append(took)
                    print(f"{figure.name} {checkout.label} run {attempt + 1}: {took:.1f} s", flush=True)
                    if attempt == 0:
                        same[checkout.label] = tables_digest(figure.lake(checkout), ignored=figure.ignored)
            mine, theirs = statistics.median(seconds["this"]), statistics.median(seconds["other"])
            differing = sorted(name for name in same["this"] if same["this"][name] != same["other"].get(name))
            results.append((figure.name, mine, theirs, differing, seconds))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"\n{'figure':<10} {'this s':>8} {'other s':>8} {'ratio':>6}  verdict  tables")
    for name, mine, theirs, differing, seconds in results:
        ratio = mine / theirs
        verdict = "ok" if ratio <= ALLOWED_RATIO else "SLOWER"
        tables = "identical" if not differing else "differ: " + ", ".join(differing)
        print(f"{name:<10} {mine:>8.1f} {theirs:>8.1f} {ratio:>6.2f}  {verdict:<7}  {tables}")
        print(f"{'':<10} runs: this {', '.join(f'{s:.1f}' for s in seconds['this'])}; "
              f"other {', '.join(f'{s:.1f}' for s in seconds['other'])}")
    return 0 if all(mine / theirs <= ALLOWED_RATIO for _, mine, theirs, _, _ in results) else 1


if __name__ == "__main__":
    sys.exit(main())
