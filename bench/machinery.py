"""The speed machinery, each piece switched off alone, against the figure it targets (issue 58:
a piece that saves under 10% of its figure goes; docs/analysis.md, "The speed machinery").

    .venv/bin/python bench/machinery.py analyze --runs full|append [--frames N --hot-deliveries N]
        [--tail 0.9] [--master 'local[2]'] [--repeat 3] [--pieces archive]
    .venv/bin/python bench/machinery.py ingest [--capture FILE] [--repeat 7] [--pieces pandas_probe,gc_paused]

`analyze`: the runs Spark makes now that the local executor takes small lakes and small appends
(local_executor.DRIVER_FRAMES), each `ackscope analyze` in a new process, wall s:
- full: `--full` on a generated lake just over DRIVER_FRAMES (bench/frames_generator.py; default
  1.2 M frames), the smallest full run Spark takes;
- append: a scheduled run after an append of more than DRIVER_FRAMES new frame rows (the generated
  lake's last `--tail` share, its head analysed first; the lake as it was before the run copied
  in again for each run).
A run that started no Spark driver fails the bench. `ingest`: `ackscope ingest` of a capture
(default: the bundled sample) into a new lake, the process's CPU s (os.wait4).
Each repeat runs every configuration once
(all pieces on, then each piece off alone), its order rotated repeat by repeat; printed: each
configuration's runs, median, and the median over the median with every piece on. `analyze` also
checks that every run of a figure left the same tables (bench/incremental.tables_digest).

A piece is switched off in the child process only: `archive` points ACKSCOPE_JVM_ARCHIVE_DIR at an
empty folder; the others replace one name before ackscope's command line runs (see OFF). The
pieces that saved under 10% were removed (issue 58): docs/analysis.md names them and the commit
whose copy of this script has their switches.
"""

import os
import sys

# A child: `machinery.py --child PIECE ARGS...` runs `ackscope ARGS...` with PIECE switched off
# (or "none"). Kept first and light: the ingest figures are mostly start-up.
OFF = {
    "none": "",
    "archive": "",  # the environment's ACKSCOPE_JVM_ARCHIVE_DIR, set by the parent
    "pandas_probe": "import analyzer.pandas_probe as p; p.answer_pandas_probe_without_pandas = lambda: None",
    "gc_paused": "import contextlib, analyzer.gcpause as g; g.cyclic_gc_paused = contextlib.nullcontext",
}
SPARK_PIECES = ("archive",)
NO_SPARK_EXIT = 3

if __name__ == "__main__" and sys.argv[1:2] == ["--child"]:
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    piece, rest = sys.argv[2], sys.argv[3:]
    if rest[:1] == ["analyze"]:
        import spark_jobs.session  # noqa: F401  (every configuration alike, before the switch)
    for one in piece.split("+"):  # several pieces off at once: a+b
        exec(OFF[one])
    from analyzer.cli import main as ackscope_main
    sys.argv = ["ackscope", *rest]
    code = ackscope_main()  # argv from sys.argv: `ingest` runs as its own process does
    if rest[:1] == ["analyze"]:
        from pyspark.core.context import SparkContext
        if SparkContext._gateway is None:  # the local executor's run: not what is measured
            print("machinery.py: this run started no Spark driver", file=sys.stderr)
            code = code or NO_SPARK_EXIT
    sys.exit(code)

import argparse  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
from collections.abc import Callable  # noqa: E402

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


def appended_lake(out: str, args) -> str:
    """The generated lake as a scheduled run finds it: its head committed and analysed (a full run,
    small enough for the local executor), then its last `--tail` share appended. Made once, kept in
    bench/out; each run works on a copy."""
    import frames_generator as generator
    import pyarrow.compute as pc
    from incremental import append, run_analyze

    from analyzer import schema
    from analyzer.lake import read_table
    from spark_jobs import local_executor

    params = generator.params_from_args(args)
    home = os.path.join(out, "machinery", f"append-{params.key()}-t{args.tail}")
    lake_dir, ready = os.path.join(home, "lake"), os.path.join(home, "ready")
    if os.path.exists(ready):
        return lake_dir
    shutil.rmtree(home, ignore_errors=True)
    source, _ = generator.cached_lake(out, params)
    frames = read_table(source, "frames", schema.FRAMES)
    head, tail = generator.as_appended(frames, [1 - args.tail])
    if tail.num_rows <= local_executor.DRIVER_FRAMES:
        raise SystemExit(f"an append of {tail.num_rows:,} frame rows is the local executor's "
                         f"(DRIVER_FRAMES {local_executor.DRIVER_FRAMES:,}): more --frames or --tail")
    append(lake_dir, "frames", head, schema.FRAMES, "head")
    append(lake_dir, "connections", read_table(source, "connections", schema.CONNECTIONS), schema.CONNECTIONS, "all")
    run_analyze(lake_dir, args.master, args.driver_memory)
    append(lake_dir, "frames", tail, schema.FRAMES, "tail")
    print(f"appended lake: {head.num_rows:,} frame rows analysed, {tail.num_rows:,} appended "
          f"({len(pc.unique(tail['connection_id']))} connections)")
    open(ready, "w").close()
    return lake_dir


def figure_runs(args) -> tuple[str, Callable[[], tuple[str, list[str]]]]:
    """What the figure `args.runs` times: a line saying so, and a function that readies the lake for
    one run and returns it with the run's own arguments."""
    import analyze as bench
    import frames_generator as generator

    out = os.path.join(BENCH_DIR, "out")
    if args.runs == "full":
        lake_dir, stats = generator.cached_lake(out, generator.params_from_args(args))

        def full() -> tuple[str, list[str]]:
            bench.clear_outputs(lake_dir)
            return lake_dir, ["--full"]
        return f"`ackscope analyze --full`, a generated lake of {stats['frames']:,} frames", full
    template = appended_lake(out, args)
    work = os.path.join(out, "machinery", "append-run", "lake")

    def appended() -> tuple[str, list[str]]:
        shutil.rmtree(work, ignore_errors=True)
        shutil.copytree(template, work)
        return work, []
    return "`ackscope analyze` (scheduled) after the append", appended


def bench_analyze(args) -> int:
    import analyze as bench
    from incremental import tables_digest
    from spark_jobs import jvm_archive

    if not jvm_archive.java_options():
        print("no JVM archive for this installation: `make jvm-archive` first", file=sys.stderr)
        return 2
    what, ready_run = figure_runs(args)
    runs_dir = os.path.join(BENCH_DIR, "out", "machinery", "runs")
    os.makedirs(runs_dir, exist_ok=True)
    configs = ["none", *args.pieces]
    figures: dict[str, list[float]] = {c: [] for c in configs}
    digests: dict[str, set] = {c: set() for c in configs}
    print(f"{what}, master {args.master}; a new process each run")
    with tempfile.TemporaryDirectory(prefix="ackscope-no-archive-") as empty:
        for attempt in range(args.repeat):
            for piece in rotated(configs, attempt):
                lake_dir, run_args = ready_run()
                cmd, env = child(piece, ["analyze", "--lake", lake_dir, *run_args, "--master", args.master,
                                         "--driver-memory", args.driver_memory], empty)
                log = os.path.join(runs_dir, f"{args.runs}-{piece}-{attempt + 1}.log")
                seconds, code, *_ = bench.timed_run(cmd, env, log, args.timeout)
                if code != 0:
                    print(f"{piece}: exit {code}, see {log}", file=sys.stderr)
                    return 1
                digests[piece].add(tuple(sorted(tables_digest(lake_dir).items())))
                figures[piece].append(seconds)
                print(f"  run {attempt + 1}, {piece} off: {seconds:.2f} s", flush=True)
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
    spark.set_defaults(frames=1_200_000, hot_deliveries=360_000, run=bench_analyze)
    spark.add_argument("--runs", choices=("full", "append"), required=True,
                       help="the figure: a full run of the generated lake, "
                            "a scheduled run after the generated lake's last --tail share was appended")
    spark.add_argument("--tail", type=float, default=0.9, help="--runs append: the share appended (default %(default)s)")
    spark.add_argument("--master", default="local[2]")
    spark.add_argument("--driver-memory", default="2g")
    spark.add_argument("--timeout", type=float, default=600)
    spark.add_argument("--pieces", default=",".join(SPARK_PIECES))
    ingest = commands.add_parser("ingest")
    ingest.add_argument("--capture", default=None)
    ingest.add_argument("--pieces", default="pandas_probe,gc_paused")
    ingest.set_defaults(run=bench_ingest)
    spark.add_argument("--repeat", type=int, default=3)
    ingest.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args(argv)
    args.pieces = [p for p in args.pieces.split(",") if p]
    unknown = [p for p in args.pieces if not set(p.split("+")) <= set(OFF)]
    if unknown:
        parser.error(f"unknown pieces: {', '.join(unknown)} (known: {', '.join(list(OFF)[1:])})")
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
