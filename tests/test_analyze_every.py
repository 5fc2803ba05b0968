"""`ackscope analyze --every`: the schedule (spark_jobs/schedule.py) with a fake clock, the signals,
and the real command: one driver analysing a real lake as frames arrive, pushing each run to a real
Pushgateway, stopped by SIGTERM after the run in progress; and exiting when its driver is killed."""

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest

from analyzer.findings import read_findings
from analyzer.ingest import ingest_file
from analyzer.lake import open_table
from spark_jobs.analyze import analyze
from spark_jobs.schedule import parse_interval, run_every, stop_on_signals
from spark_jobs.timeline.plans import conf_meanwhile

from .child_output import ChildOutput
from .conftest import ROOT
from .prometheus_stack import pushgateway, pushgateway_series, settle

ACKSCOPE = os.path.join(os.path.dirname(sys.executable), "ackscope")

def _example(name: str) -> str:
    return os.path.join(ROOT, "examples", f"{name}.pcapng")


def test_intervals_are_a_number_and_a_unit_of_at_least_a_second():
    assert [parse_interval(text) for text in ("90", "90s", "1.5m", "5m", "1h", " 2s ")] == \
        [90, 90, 90, 300, 3600, 2]
    for text, reason in (("5 minutes", "is not a duration"), ("-5s", "is not a duration"), ("5d", "is not a duration"),
                         ("", "is not a duration"), ("0.5s", "shorter than 1s"), ("0", "shorter than 1s")):
        with pytest.raises(ValueError, match=reason):
            parse_interval(text)


class _FakeTime:
    """A clock the loop's waits advance, and a run that takes a given time."""

    def __init__(self, run_seconds: list[float]):
        self.now, self.run_seconds, self.starts = 100.0, run_seconds, []
        self.stopping = self

    def clock(self) -> float:
        return self.now

    def one_run(self) -> bool:
        self.starts.append(self.now)
        self.now += self.run_seconds[len(self.starts) - 1]
        return len(self.starts) < len(self.run_seconds)

    # the threading.Event the loop waits on
    def is_set(self) -> bool:
        return False

    def wait(self, timeout: float) -> bool:
        self.now += timeout
        return False


def test_runs_start_on_the_interval_and_a_long_run_is_followed_at_once_without_catching_up():
    fake = _FakeTime([2, 3, 25, 1, 11, 1])
    run_every(10, fake.one_run, fake.stopping, clock=fake.clock)
    # 100, 110, 120; the third overran two slots (130, 140): the next starts when it ends (145), and
    # the schedule goes on from there; so again after the fifth.
    assert fake.starts == [100, 110, 120, 145, 155, 166]


def test_the_loop_does_not_start_a_run_once_stopping_is_set():
    stopping, runs = threading.Event(), []

    def one_run() -> bool:
        runs.append(1)
        stopping.set()  # as the first signal does, during a run
        return True

    run_every(3600, one_run, stopping)  # returns at once: no wait for the next slot
    assert runs == [1]


def test_the_first_signal_sets_stopping_and_the_second_has_its_usual_effect():
    before = signal.getsignal(signal.SIGINT)
    with stop_on_signals() as stopping:
        os.kill(os.getpid(), signal.SIGTERM)
        assert stopping.wait(5)
        with pytest.raises(KeyboardInterrupt):  # pytest's own SIGINT handler, back in place
            os.kill(os.getpid(), signal.SIGINT)
            stopping.wait(5)
    assert signal.getsignal(signal.SIGINT) is before


def test_analyze_every_refuses_what_it_cannot_schedule(tmp_path):
    for extra, message in ((["--every", "soon"], "--every 'soon' is not a duration"),
                           (["--every", "0.2s"], "shorter than 1s"),
                           (["--every", "5m", "--full"], "--every schedules incremental runs"),
                           (["--every", "5m", "--since", "2026-11-01"], "--every schedules incremental runs")):
        run = subprocess.run([ACKSCOPE, "analyze", "--lake", str(tmp_path), *extra], capture_output=True,
                             text=True, timeout=120)
        assert run.returncode == 2 and message in run.stderr, (extra, run.stderr)


class _Command:
    """`ackscope analyze --every 1s --json` in its own process; its lines as they come."""

    def __init__(self, lake_dir: str, *extra: str):
        # A session of its own, as a terminal's foreground job is a process group: Ctrl-C signals
        # the command, its JVM and the JVM's Python workers.
        self.process = subprocess.Popen([ACKSCOPE, "analyze", "--lake", lake_dir, "--master", "local[1]",
                                         "--every", "1s", "--json", *extra], text=True,
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        self.output = ChildOutput(self.process)
        self.out, self.err = self.output.out, self.output.err  # the lines so far

    def reports(self) -> list[dict]:
        return [json.loads(line) for line in list(self.out)]

    def errors(self) -> str:
        return self.output.stderr()

    def report_of_version(self, version: int, timeout: float = 180) -> dict:
        def found():
            # At or past it: a run merges the frames files it analysed after it (a commit of its own),
            # so the run after an append may plan at that merge's version.
            return next((r for r in self.reports() if r["frames_version"] >= version and r["connections"]), None)
        return settle(found, f"no run of frames version {version}: {self.errors()[-2000:]}", timeout)

    def wait(self, timeout: float = 180) -> int:
        return self.output.wait(timeout)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(30)


def _frames_version(lake_dir: str) -> int:
    return open_table(lake_dir, "frames").version()


def _stopped_during_a_run(command: _Command, lake_dir: str, capture: str, send) -> None:
    """Appends a capture, sends the signal once the run that analyses it is under way (its plan
    step's line names the connections it is about to analyse: a Spark job or more follow), and
    checks that this run finished (its steps after the signal, its report, its log row) and the
    loop ended."""
    before = len(command.err)
    ingest_file(_example(capture), lake_dir)
    appended = _frames_version(lake_dir)   # the run merges the files it analysed after it: a later version
    deadline = time.monotonic() + 180
    while not any(re.search(r": plan \(.*\): new_data, [1-9][0-9]* connection", line) for line in command.err[before:]):
        assert time.monotonic() < deadline, f"no run of {capture}: {command.errors()[-2000:]}"
        time.sleep(0.02)   # the signal must come while the run is under way: watched closely
    reported, progressed = len(command.out), len(command.err)
    send(command.process.pid)
    assert command.wait() == 0, command.errors()[-3000:]
    assert any(" findings (" in line for line in command.err[progressed:]), "the run ended before the signal"
    last = command.reports()[-1]
    assert len(command.out) == reported + 1 and last["frames_version"] == appended
    assert last["scope"] == "new_data" and last["connections"] >= 1
    runs = open_table(lake_dir, "analysis_runs").to_pyarrow_table().to_pylist()
    assert max(run["frames_version"] for run in runs) == last["frames_version"]
    assert "failed" not in command.errors(), command.errors()[-3000:]


def test_analyze_every_waits_for_frames_analyses_each_append_and_stops_after_the_run_in_progress(tmp_path):
    """SIGTERM to the command, as Kubernetes and `docker stop` send it."""
    lake_dir = str(tmp_path / "lake")
    with pushgateway(str(tmp_path)) as gateway:
        # Runs with new frames on Spark (--local-up-to 0): seconds long, so the signal lands in one.
        command = _Command(lake_dir, "--pushgateway", gateway, "--push-job", "every", "--local-up-to", "0")
        try:
            settle(lambda: "no frames table in" in command.errors(), "no word about the missing frames", 120)
            ingest_file(_example("confirm_nacks"), lake_dir)
            first = command.report_of_version(_frames_version(lake_dir))
            assert first["scope"] == "full" and first["reason"] == "first run"
            for name in ("flow_control", "lost_confirms"):
                ingest_file(_example(name), lake_dir)
            second = command.report_of_version(_frames_version(lake_dir))
            assert second["scope"] == "new_data" and second["connections"] >= 1
            # A small append carried on from the checkpoints, by Spark here (--local-up-to 0).
            assert second["delta_mode"] != "none" and second["spark_jobs"] >= 1, second
            assert second["carried_connections"] == second["connections"], second
            # Each run pushed its results: the group holds the lake's findings as they are now.
            total = sum(s["value"] for s in pushgateway_series(gateway)
                        if s["name"] == "ackscope_findings" and s["labels"]["job"] == "every")
            assert total == len(read_findings(lake_dir)) > 1, (total, read_findings(lake_dir))
            # Runs with nothing new start no Spark job: the loop idles in the plan step.
            idle = settle(lambda: [r for r in command.reports()[command.reports().index(second) + 1:]],
                          "no run after the second", 60)
            assert idle[0]["connections"] == 0 and idle[0]["spark_jobs"] == 0, idle[0]
            _stopped_during_a_run(command, lake_dir, "requeue_loop", lambda pid: os.kill(pid, signal.SIGTERM))
        finally:
            command.stop()


def test_ctrl_c_stops_after_the_run_in_progress(tmp_path):
    """SIGINT to the command's whole process group, as Ctrl-C in a terminal sends it: the JVM and
    Spark's Python workers get it too, and the run still finishes."""
    lake_dir = str(tmp_path / "lake")
    ingest_file(_example("confirm_nacks"), lake_dir)
    command = _Command(lake_dir, "--local-up-to", "0")   # runs on Spark: seconds long, the signal lands in one
    try:
        command.report_of_version(_frames_version(lake_dir))
        _stopped_during_a_run(command, lake_dir, "requeue_loop", lambda pid: os.killpg(pid, signal.SIGINT))
    finally:
        command.stop()


def _java_children(pid: int) -> list[int]:
    children = open(f"/proc/{pid}/task/{pid}/children").read().split()
    return [int(c) for c in children if open(f"/proc/{c}/comm").read().strip() == "java"]


def test_analyze_every_exits_when_its_driver_is_gone(tmp_path):
    """A JVM killed (out of memory, by the kernel) cannot run the next job: the command says so and
    exits with 5, for its supervisor (Kubernetes) to start a new one, rather than fail every run."""
    lake_dir = str(tmp_path / "lake")
    ingest_file(_example("confirm_nacks"), lake_dir)
    command = _Command(lake_dir)
    try:
        command.report_of_version(_frames_version(lake_dir))
        [java] = _java_children(command.process.pid)
        os.kill(java, signal.SIGKILL)
        ingest_file(_example("flow_control"), lake_dir)  # a run follows, then the loop finds the driver gone
        assert command.wait() == 5
    finally:
        command.stop()
    # The last word is the command's own: py4j's errors are silenced in its probes, and pyspark's
    # accumulator server, whose thread prints its lost connection, is shut down before it.
    assert command.err[-1] == "ackscope analyze: the Spark driver is gone: stopping", command.errors()[-3000:]


def _spark_local_files(spark) -> list[str]:
    """The files in the driver's Spark local folders: shuffle files, blocks stored on disk."""
    folders = spark.sparkContext._jsc.sc().env().blockManager().diskBlockManager().localDirs()
    return [os.path.join(path, name) for folder in folders
            for path, _dirs, names in os.walk(folder.getAbsolutePath()) for name in names]


def _shuffle_files(spark) -> set[str]:
    return {path for path in _spark_local_files(spark) if "shuffle_" in os.path.basename(path)}


def test_a_long_lived_driver_keeps_no_runs_shuffle_files(spark, tmp_path):
    """The session has Spark delete a query's shuffle files when it ends (session.py): an `--every`
    driver that collects seldom would otherwise keep every run's until the JVM collected the objects
    that reference them. The same run without that setting shows where they would stay."""
    before = _shuffle_files(spark)  # the session's: other tests' may still be held
    for cleanup, lake_dir in [("false", tmp_path / "kept"), ("true", tmp_path / "deleted")]:
        for name in ("confirm_nacks", "requeue_loop"):
            ingest_file(_example(name), str(lake_dir))
        with conf_meanwhile(spark, "spark.sql.classic.shuffleDependency.fileCleanup.enabled", cleanup):
            analyze(spark, str(lake_dir))
            ingest_file(_example("flow_control"), str(lake_dir))
            analyze(spark, str(lake_dir))  # an incremental run: the carried pass's shuffle
        left = _shuffle_files(spark) - before
        assert bool(left) == (cleanup == "false"), (cleanup, sorted(left)[:20])
        before |= left
