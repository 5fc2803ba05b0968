"""The speed machinery, each piece switched off alone, against the figure it targets (issue 58:
a piece that saves under 10% of its figure goes; docs/analysis.md, "The speed machinery").

    .venv/bin/python bench/machinery.py analyze [--frames N --hot-deliveries N] [--master 'local[2]']
        [--repeat 5] [--pieces archive,daemon,quick_start]
    .venv/bin/python bench/machinery.py ingest [--capture FILE] [--repeat 7] [--pieces pandas_probe,gc_paused]

`analyze`: `ackscope analyze --full` in a new process on the demo's lake (the bundled sample
ingested; with --frames, a generated lake as bench/analyze.py makes it), wall s. `ingest`: `ackscope
ingest` of a capture (default: the bundled sample) into a new lake, the process's CPU s (os.wait4).
Each repeat runs every configuration once
(all pieces on, then each piece off alone), its order rotated repeat by repeat; printed: each
configuration's runs, median, and the median over the median with every piece on. `analyze` also
checks that every run left the same tables (bench/incremental.tables_digest).

A piece is switched off in the child process only: `archive` points ACKSCOPE_JVM_ARCHIVE_DIR at an
empty folder; the others replace one name before ackscope's command line runs (see OFF). The
pieces that saved under 10% were removed (issue 58): their figures were measured with this script
as of commit 1bad99d (pieces interpreted, local_gc; `pass` for the pass's collector spacing).
"""

import os
import sys

# A child: `machinery.py --child PIECE ARGS...` runs `ackscope ARGS...` with PIECE switched off
# (or "none"). Kept first and light: the ingest figures are mostly start-up.
OFF = {
    "none": "",
    "archive": "",  # the environment's ACKSCOPE_JVM_ARCHIVE_DIR, set by the parent
    "daemon": "import spark_jobs.session as s; s.PYTHON_DAEMON = 'pyspark.daemon'",
    "quick_start": "import spark_jobs.session as s; s.QUICK_START_UP_TO_ROWS = -1",
    "pandas_probe": "import analyzer.pandas_probe as p; p.answer_pandas_probe_without_pandas = lambda: None",
    "gc_paused": "import contextlib, analyzer.gcpause as g; g.cyclic_gc_paused = contextlib.nullcontext",
}
SPARK_PIECES = ("archive", "daemon", "quick_start")

if __name__ == "__main__" and sys.argv[1:2] == ["--child"]:
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    piece, rest = sys.argv[2], sys.argv[3:]
    if rest[:1] == ["analyze"]:
        import spark_jobs.session  # noqa: F401  (every configuration alike, before the switch)
        # What is measured is the Spark executor's machinery: a run the local executor would take
        # (a full run of a lake this small) is Spark's here, in every configuration alike.
        import spark_jobs.local_executor as local
        local.DRIVER_FRAMES = -1
    for one in piece.split("+"):  # several pieces off at once: a+b
        exec(OFF[one])
    from analyzer.cli import main as ackscope_main
    sys.argv = ["ackscope", *rest]
    sys.exit(ackscope_main())  # argv from sys.argv: `ingest` runs as its own process does

import argparse  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
REPO_DIR = os.path.dirname(BENCH_DIR)
sys.path.insert(0, BENCH_DIR)
sys.path.insert(0, REPO_DIR)


def child(piece: str, args: list[str], empty_archive_dir: str) -> tuple[list[str], dict]:
    env = dict(os.environ)
    if "archive" in piece.split("+"):
        env["ACKSCOPE_JVM_ARCHIVE_DIR"] = empty_archive_dir
    return [sys.executable, os.path.abspath(__file__), "--child", piece, *args], env


def rotated(configs: list[str], attempt: int) -> list[str]:
    shift = attempt % len(configs)
    return configs[shift:] + configs[:shift]


def report(figures: dict[str, list[float]], unit: str) -> None:
    """Each configuration's runs and median; its ratio to all on, repeat by repeat (runs made side
    by side), their median, and what the piece saves by it: 1 - 1 / ratio."""
    base = figures["none"]
    print(f"\n{'switched off':<14} {'runs (' + unit + ')':<44} {'median':>8} {'ratio':>7} {'saves':>7}")
    for piece, values in figures.items():
        ratio = statistics.median(v / b for v, b in zip(values, base))
        print(f"{piece:<14} {', '.join(f'{v:.2f}' for v in values):<44} {statistics.median(values):8.2f} "
              f"{ratio:7.3f} {1 - 1 / ratio:7.1%}")
    print("(ratio: the median of each repeat's run over the run with every piece on; saves: 1 - 1 / ratio; "
          "< 10% goes)")


def bench_analyze(args) -> int:
    import analyze as bench
    import frames_generator as generator
    from incremental import tables_digest
    from spark_jobs import jvm_archive

    if not jvm_archive.java_options():
        print("no JVM archive for this installation: `make jvm-archive` first", file=sys.stderr)
        return 2
    out = os.path.join(BENCH_DIR, "out")
    if args.frames:
        lake_dir, _ = generator.cached_lake(out, generator.params_from_args(args))
    else:
        lake_dir = os.path.join(out, "machinery", "demo-lake")
        if not os.path.isdir(os.path.join(lake_dir, "frames")):
            from analyzer.cli import sample_captures
            from analyzer.ingest import ingest_file
            for capture in sample_captures():
                ingest_file(capture, lake_dir)
    runs_dir = os.path.join(out, "machinery", "runs")
    os.makedirs(runs_dir, exist_ok=True)
    configs = ["none", *args.pieces]
    figures: dict[str, list[float]] = {c: [] for c in configs}
    digests: dict[str, set] = {c: set() for c in configs}
    print(f"lake {lake_dir}, master {args.master}; `ackscope analyze --full`, a new process each run")
    with tempfile.TemporaryDirectory(prefix="ackscope-no-archive-") as empty:
        for attempt in range(args.repeat):
            for piece in rotated(configs, attempt):
                bench.clear_outputs(lake_dir)
                cmd, env = child(piece, ["analyze", "--lake", lake_dir, "--full", "--master", args.master,
                                         "--driver-memory", args.driver_memory], empty)
                log = os.path.join(runs_dir, f"{piece}-{attempt + 1}.log")
                seconds, code, *_ = bench.timed_run(cmd, env, log, args.timeout)
                if code != 0:
                    print(f"{piece}: exit {code}, see {log}", file=sys.stderr)
                    return 1
                digests[piece].add(tuple(sorted(tables_digest(lake_dir).items())))
                figures[piece].append(seconds)
                print(f"  run {attempt + 1}, {piece} off: {seconds:.2f} s", flush=True)
    bench.clear_outputs(lake_dir)
    report(figures, "wall s")
    same = len(set.union(*digests.values())) == 1
    print(f"tables identical in every run: {'yes' if same else 'NO'}")
    return 0 if same else 1


def bench_ingest(args) -> int:
    from analyzer.cli import sample_captures

    captures = [args.capture] if args.capture else sample_captures()
    configs = ["none", *args.pieces]
    figures: dict[str, list[float]] = {c: [] for c in configs}
    print(f"`ackscope ingest {' '.join(os.path.basename(c) for c in captures)}` into a new lake, the process's CPU s")
    for attempt in range(args.repeat):
        for piece in rotated(configs, attempt):
            with tempfile.TemporaryDirectory(prefix="ackscope-machinery-") as lake_dir:
                cmd, env = child(piece, ["ingest", *captures, "--lake", lake_dir, "--no-progress"], "")
                proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL)
                _, status, usage = os.wait4(proc.pid, 0)
                proc.returncode = os.waitstatus_to_exitcode(status)
                if proc.returncode not in (0,):
                    print(f"{piece}: exit {proc.returncode}", file=sys.stderr)
                    return 1
                figures[piece].append(usage.ru_utime + usage.ru_stime)
    report(figures, "CPU s")
    return 0


def main(argv: list[str] | None = None) -> int:
    import frames_generator as generator

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="figure", required=True)
    spark = commands.add_parser("analyze")
    generator.add_arguments(spark)
    spark.set_defaults(frames=0, run=bench_analyze)
    spark.add_argument("--master", default="local[2]")
    spark.add_argument("--driver-memory", default="2g")
    spark.add_argument("--timeout", type=float, default=1800)
    spark.add_argument("--pieces", default=",".join(SPARK_PIECES))
    ingest = commands.add_parser("ingest")
    ingest.add_argument("--capture", default=None)
    ingest.add_argument("--pieces", default="pandas_probe,gc_paused")
    ingest.set_defaults(run=bench_ingest)
    for command in (spark, ingest):
        command.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args(argv)
    args.pieces = [p for p in args.pieces.split(",") if p]
    unknown = [p for p in args.pieces if not set(p.split("+")) <= set(OFF)]
    if unknown:
        parser.error(f"unknown pieces: {', '.join(unknown)} (known: {', '.join(list(OFF)[1:])})")
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
