"""Every Spark job of an incremental run, one by one: its step, how long it took, its tasks (and the
longest one) and the Python line that started it. The run of bench/incremental.py (the head of a
generated lake analysed, the last `--tail` appended, then analysed again), but in one warm process,
so the figures are the jobs' own and not the JVM's start.

    .venv/bin/python bench/jobs.py [--frames 200000] [--hot-deliveries 60000] [--tail 0.05] [--check]

The lake after the head's run and the append is kept (bench/out/jobs/<params>/base) and copied for
each invocation, so only the incremental run is done again; `--fresh` analyses the head again (do
it after changing what a full run writes). `--check` then runs `--full` over the same lake in the
same process and says whether the tables are the incremental run's.

Where a job comes from: a thread polls Spark's status tracker and, for each job it sees start,
notes the innermost lines of this repository's code on every Python thread's stack (the driver
thread that asked for the job waits inside it). Broadcasts and checkpoints run as jobs of their
own, started from the action that needs them. Times come from the Spark UI's REST API (the UI is
off in session.py for local runs; on here). The same thread samples the resident memory of the
Python workers under this process (Spark's daemon and the workers it forks, from /proc) and
prints each step's largest: what one task's Python holds. Each step's CPU seconds of the whole
process tree (tree_cpu_s) are taken as it starts and ends.
"""

import argparse
import json
import os
import shutil
import sys
import threading
import time
import urllib.request
from contextlib import contextmanager

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
REPO_DIR = os.path.dirname(BENCH_DIR)
sys.path.insert(0, BENCH_DIR)
sys.path.insert(0, REPO_DIR)

import frames_generator as generator  # noqa: E402
import incremental as bench  # noqa: E402

from pyspark import SparkConf  # noqa: E402

from analyzer import lake, schema  # noqa: E402
from spark_jobs import session, steps  # noqa: E402
from spark_jobs.analyze import analyze  # noqa: E402

# Spark's Python daemon: the module its command runs (`python -m ...`), which the workers it forks inherit.
DAEMON = b"pyspark.daemon"
OWN_CODE = (os.path.join(REPO_DIR, "spark_jobs") + os.sep, os.path.join(REPO_DIR, "analyzer") + os.sep)


class _ConfWithUi(SparkConf):
    """session.get_spark's conf, but with the UI (and so its REST API) on."""
    def set(self, key, value):
        return super().set(key, "true" if key == "spark.ui.enabled" else value)


class JobWatcher:
    """Which step and which lines of code each Spark job started from."""

    def __init__(self, spark, poll_s: float = 0.02, memory_every: int = 10):
        self.spark, self.poll_s, self.memory_every = spark, poll_s, memory_every
        self.step = "-"
        self.sites: dict[int, tuple[str, str]] = {}
        self.worker_peak_mb: dict[str, int] = {}   # step -> the largest Python worker's resident MB
        self.cpu_s: dict[str, float] = {}          # step -> CPU seconds of this process's tree (tree_cpu_s)

    def __enter__(self):
        self.cpu_s, self.worker_peak_mb = {}, {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    def _poll(self) -> None:
        tracker = self.spark.sparkContext.statusTracker()
        polls = 0
        while not self._stop.is_set():
            for job in tracker.getActiveJobsIds():
                if job not in self.sites:
                    self.sites[job] = (self.step, _call_sites(threading.get_ident()))
            polls += 1
            if polls % self.memory_every == 0:
                step = self.step
                self.worker_peak_mb[step] = max(self.worker_peak_mb.get(step, 0), python_worker_mb(os.getpid()))
            time.sleep(self.poll_s)

    @contextmanager
    def steps_named(self):
        """Steps.step also says which step is under way."""
        original = steps.Steps.step

        @contextmanager
        def step(steps_self, name):
            self.step = name
            cpu_before = tree_cpu_s(os.getpid())
            try:
                with original(steps_self, name) as said:
                    yield said
            finally:
                self.step = "-"
                self.cpu_s[name] = self.cpu_s.get(name, 0.0) + tree_cpu_s(os.getpid()) - cpu_before

        steps.Steps.step = step
        try:
            yield
        finally:
            steps.Steps.step = original


def _descendants(root: int) -> list[int]:
    """The processes under process `root`, at this instant."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    parent = int(stat.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(parent, []).append(int(entry))
    found, todo = [], list(children.get(root, []))
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo += children.get(pid, [])
    return found


def tree_cpu_s(root: int) -> float:
    """CPU seconds used so far by process `root` and every process under it (the driver's JVM,
    Spark's Python daemon and workers), with those of their children that have ended and been
    waited for (a live child's are its own, counted once). Less shaken by other work on a shared
    machine than wall clock."""
    ticks = 0
    for pid in [root, *_descendants(root)]:
        try:
            with open(f"/proc/{pid}/stat") as stat:
                ticks += sum(int(field) for field in stat.read().rsplit(")", 1)[1].split()[11:15])
        except (OSError, ValueError):
            continue
    return ticks / os.sysconf("SC_CLK_TCK")


def python_worker_mb(root: int) -> int:
    """The largest resident set (MB) among the PySpark Python processes under process `root`: the
    daemon (DAEMON) and the workers it forks (named after it)."""
    largest = 0
    for pid in _descendants(root):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
                command = cmdline.read().split(b"\0")
                if command[1:3] != [b"-m", DAEMON]:
                    continue
            with open(f"/proc/{pid}/status") as status:
                kb = next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))
        except (OSError, StopIteration):
            continue
        largest = max(largest, kb // 1024)
    return largest


def _call_sites(skip_thread: int, depth: int = 3) -> str:
    sites = []
    for thread, frame in sys._current_frames().items():
        if thread == skip_thread:
            continue
        lines = []
        while frame is not None and len(lines) < depth:
            name = frame.f_code.co_filename
            if name.startswith(OWN_CODE):
                lines.append(f"{os.path.relpath(name, REPO_DIR)}:{frame.f_lineno} {frame.f_code.co_name}")
            frame = frame.f_back
        if lines:
            sites.append(" < ".join(lines))
    return " | ".join(sites) or "?"


def _rest(spark, path: str) -> list[dict]:
    context = spark.sparkContext
    with urllib.request.urlopen(f"{context.uiWebUrl}/api/v1/applications/{context.applicationId}/{path}") as answer:
        return json.load(answer)


def rest_jobs(spark) -> list[dict]:
    return sorted(_rest(spark, "jobs"), key=lambda job: job["jobId"])


def longest_task_s(spark, job: dict) -> float:
    """The job's longest task (s): a job waits for its slowest (the hot connection's, in the passes).
    Skipped stages ran no task of this job and list none."""
    longest = 0.0
    for stage in job.get("stageIds", []):
        for attempt in _rest(spark, f"stages/{stage}"):
            for task in _rest(spark, f"stages/{stage}/{attempt['attemptId']}/taskList?sortBy=-runtime&length=1"):
                longest = max(longest, task.get("duration", 0) / 1000)
    return longest


def print_stages(spark, job: dict) -> None:
    """The job's stages that ran (skipped ones read a shuffle an earlier job wrote): tasks, how
    long each took and the tasks' summed run time; where a job's time goes among its stages."""
    for stage in sorted(job.get("stageIds", [])):
        for attempt in _rest(spark, f"stages/{stage}"):
            if attempt["status"] == "SKIPPED":
                continue
            took = (_instant(attempt["completionTime"]) - _instant(attempt["submissionTime"])
                    if attempt.get("completionTime") and attempt.get("submissionTime") else float("nan"))
            print(f"{'':>11}stage {stage:>4} {attempt['numTasks']:>4} tasks {took:>6.2f} s, "
                  f"tasks' run time {attempt['executorRunTime'] / 1000:>6.2f} s  {attempt['name'][:60]}")


def _instant(stamp: str) -> float:
    return time.mktime(time.strptime(stamp[:19], "%Y-%m-%dT%H:%M:%S")) + int(stamp[20:23]) / 1000


def _seconds(job: dict) -> float:
    if not job.get("completionTime"):
        return float("nan")
    return _instant(job["completionTime"]) - _instant(job["submissionTime"])


def base_lake(args, spark) -> str:
    """The lake after the head's run and the append (made once per generated lake, or `--fresh`)."""
    source, _ = generator.cached_lake(args.out, generator.params_from_args(args))
    home = os.path.join(args.out, "jobs", f"{generator.params_from_args(args).key()}-tail{args.tail}")
    base = os.path.join(home, "base")
    if os.path.exists(os.path.join(home, "ready")) and not args.fresh:
        return base
    shutil.rmtree(home, ignore_errors=True)
    frames = lake.read_table(source, "frames", schema.FRAMES)
    head, tail = generator.as_appended(frames, [1 - args.tail])
    bench.append(base, "frames", head, schema.FRAMES, "head")
    bench.append(base, "connections", lake.read_table(source, "connections", schema.CONNECTIONS),
                 schema.CONNECTIONS, "all")
    first = analyze(spark, base)
    bench.append(base, "frames", tail, schema.FRAMES, "tail")
    print(f"base lake: {head.num_rows:,} frames analysed ({first.seconds:.1f} s), {tail.num_rows:,} appended")
    open(os.path.join(home, "ready"), "w").close()
    return base


def listed_run(spark, watcher: JobWatcher, run) -> tuple:
    """`run()`'s report and the Spark jobs it started (the UI's records), each job's site noted."""
    before = {job["jobId"] for job in rest_jobs(spark)}
    with watcher, watcher.steps_named():
        report = run()
    return report, [job for job in rest_jobs(spark) if job["jobId"] not in before]


def print_jobs(spark, report, jobs: list[dict], watcher: JobWatcher, stages: bool = False) -> None:
    print(f"\n{'job':>4} {'step':<26} {'at s':>6} {'s':>6} {'tasks':>5} {'max s':>6}  started from")
    start = min((_instant(job["submissionTime"]) for job in jobs), default=0.0)
    for job in jobs:
        step, site = watcher.sites.get(job["jobId"], ("?", "? (" + job["name"] + ")"))
        print(f"{job['jobId']:>4} {step:<26} {_instant(job['submissionTime']) - start:>6.2f} {_seconds(job):>6.2f} "
              f"{job['numTasks']:>5} {longest_task_s(spark, job):>6.2f}  {site}")
        if stages:
            print_stages(spark, job)
    print("\nby step: " + ", ".join(
        f"{name} {seconds:.1f} s / {sum(1 for j in jobs if watcher.sites.get(j['jobId'], ('?',))[0] == name)} jobs"
        for name, seconds in report.seconds_by_step.items()))
    print("CPU s of the process tree by step: " + ", ".join(
        f"{name} {watcher.cpu_s.get(name, 0.0):.1f}" for name in report.seconds_by_step))
    print("largest Python worker by step (resident MB): " + ", ".join(
        f"{name} {watcher.worker_peak_mb.get(name, 0):,}" for name in report.seconds_by_step))
    if report.files_compacted:  # merged beside the findings step, the findings' own after it
        print("small files merged: " + ", ".join(f"{name} {n}" for name, n in report.files_compacted.items()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    generator.add_spark_run_arguments(parser, frames=200_000, hot_deliveries=60_000)
    parser.add_argument("--tail", type=float, default=0.05)
    parser.add_argument("--fresh", action="store_true", help="analyse the head again for the base lake")
    parser.add_argument("--repeat", type=int, default=1, metavar="N",
                        help="the incremental run N times in the same driver, each on a new copy of the lake: "
                             "the first is the JVM's first work, the later ones a warm driver's (analyze --every)")
    parser.add_argument("--pause", type=float, default=0.0, metavar="S",
                        help="seconds the driver idles before each run after the first, as `analyze --every` "
                             "does between its runs (Spark stops a Python worker idle for a minute)")
    parser.add_argument("--check", action="store_true", help="then a --full run: are the tables the same?")
    parser.add_argument("--stages", action="store_true", help="under each job, the stages it ran")
    args = parser.parse_args(argv)

    session.SparkConf = _ConfWithUi
    spark = session.get_spark(args.master, driver_memory=args.driver_memory)
    base = base_lake(args, spark)
    work = os.path.join(os.path.dirname(base), "work")
    watcher = JobWatcher(spark)
    for attempt in range(1, args.repeat + 1):
        if attempt > 1:
            time.sleep(args.pause)
        shutil.rmtree(work, ignore_errors=True)
        shutil.copytree(base, work)
        report, jobs = listed_run(spark, watcher, lambda: analyze(spark, work))
        print(f"\nincremental run {attempt} of {args.repeat}: {report.scope}, {report.carried_connections} of "
              f"{report.connections} connections carried, {report.frames:,} frames read, {report.seconds:.1f} s, "
              f"{report.spark_jobs} Spark jobs")
        print_jobs(spark, report, jobs, watcher, args.stages)
    if args.check:
        incremental_tables = bench.tables_digest(work)
        report, jobs = listed_run(spark, watcher, lambda: analyze(spark, work, full=True))
        print(f"\nfull run: {report.frames:,} frames read, {report.seconds:.1f} s, {report.spark_jobs} Spark jobs")
        print_jobs(spark, report, jobs, watcher, args.stages)
        same = bench.tables_digest(work) == incremental_tables
        print(f"tables identical to a --full run's: {'yes' if same else 'NO (MISMATCH)'}")
        return 0 if same else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
