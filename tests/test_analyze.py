"""The analysis job end to end: recorded captures ingested into a real lake, `analyze` on real
Spark writing real Delta tables, findings checked against every example's expectations; and the
`ackscope analyze` / `ackscope findings` commands as a user runs them."""

import glob
import io
import json
import os
import shutil
import subprocess
import sys
from datetime import datetime, timezone

import pyspark
import pytest

from analyzer import cli, lake, schema
from analyzer.cli import build_parser
from analyzer.timeline import replay_frames
from spark_jobs.analyze import OUTPUT_TABLES, analyze, local_takes
from analyzer.detectors.thresholds import Thresholds

from .conftest import ROOT
from .findings_check import LAB_THRESHOLDS, findings_of_capture, problems

EXAMPLES = sorted(glob.glob(os.path.join(ROOT, "examples", "*.pcapng")))
ACKSCOPE = os.path.join(os.path.dirname(sys.executable), "ackscope")
JSON_KEYS = {"kind", "severity", "connection_id", "connection_name", "client", "server", "channel", "first_ts",
             "last_ts", "count", "summary", "evidence"}


@pytest.fixture(scope="module")
def analysed(analysed_examples):
    return analysed_examples


def _table(lake_dir, name):
    return lake.read_table(lake_dir, name, OUTPUT_TABLES[name])


@pytest.mark.parametrize("capture", EXAMPLES, ids=os.path.basename)
def test_every_expected_finding_and_no_forbidden_one(analysed, capture):
    lake_dir, _ = analysed
    expected = json.load(open(capture.replace(".pcapng", ".expected.json")))
    assert problems(findings_of_capture(lake_dir, capture), expected) == []


def test_clean_examples_have_nothing_of_warning_or_worse(analysed):
    lake_dir, _ = analysed
    for scenario in ("clean_async_confirms", "heartbeats"):
        capture = os.path.join(ROOT, "examples", f"{scenario}.pcapng")
        assert [f for f in findings_of_capture(lake_dir, capture) if f["severity"] != "info"] == [], scenario


def test_written_tables_are_the_reference_models_and_readable_by_delta_rs(analysed):
    lake_dir, report = analysed
    expected = replay_frames(lake.read_table(lake_dir, "frames", schema.FRAMES))
    keys = {"deliveries": ["connection_id", "channel", "incarnation", "seq"],
            "publishes": ["connection_id", "channel", "incarnation", "seq"],
            "channels": ["connection_id", "channel", "incarnation"],
            "violations": ["connection_id", "channel", "incarnation", "seq", "kind"]}
    for name, key in keys.items():
        # `provisional` and `requeue_related` are the stored tables' own (tests/test_connection_pass.py
        # and tests/test_detectors.py check them).
        got = _table(lake_dir, name).sort_by([(k, "ascending") for k in key])
        stored_only = [c for c in ("provisional", "requeue_related") if c in got.column_names]
        assert got.drop_columns(stored_only).to_pylist() == expected[name].to_pylist(), name
        assert report.rows[name] == got.num_rows
    assert report.rows["findings"] == _table(lake_dir, "findings").num_rows > 0
    assert report.rows["channel_metrics"] == _table(lake_dir, "channel_metrics").num_rows > 0
    assert report.frames == lake.read_table(lake_dir, "frames", schema.FRAMES).num_rows


@pytest.mark.parametrize("batch_rows", [None, 7])
def test_a_second_full_run_gives_the_same_tables_and_finding_ids(spark, analysed, tmp_path, monkeypatch, batch_rows):
    """The findings step (findings.py) has the pass's raw findings (collected with the pass's
    files) and scans `frames` for their packets in the driver, streamed in batches (lake.scan's,
    here of its default size and of 7 rows): no Spark job."""
    lake_dir = str(tmp_path / "lake")
    shutil.copytree(analysed[0], lake_dir)  # the shared lake stays as analysed
    before = {name: _table(lake_dir, name) for name in OUTPUT_TABLES}
    assert {"requeue_loop", "redelivery_after_close"} <= set(before["findings"]["kind"].to_pylist())
    if batch_rows is not None:
        monkeypatch.setattr(lake, "SCAN_BATCH_ROWS", batch_rows)
    progress = io.StringIO()
    assert analyze(spark, lake_dir, thresholds=LAB_THRESHOLDS, full=True, progress=progress).scope == "full"
    findings_line = next(line for line in progress.getvalue().splitlines() if ": findings (" in line)
    assert findings_line.endswith(", 0 Spark jobs)"), findings_line
    for name in OUTPUT_TABLES:
        after = _table(lake_dir, name)
        key = [c for c in ("finding_id", "connection_id", "channel", "incarnation", "seq", "bucket_start_ns", "kind")
               if c in after.column_names]
        assert after.sort_by([(k, "ascending") for k in key]).to_pylist() == \
            before[name].sort_by([(k, "ascending") for k in key]).to_pylist(), name


def _ackscope(*args, timeout=600):
    return subprocess.run([ACKSCOPE, *args], capture_output=True, text=True, timeout=timeout)


def test_findings_command_json_and_kind_filter(analysed):
    lake_dir, _ = analysed
    everything = json.loads(_ackscope("findings", "--lake", lake_dir, "--json").stdout)
    assert everything and all(JSON_KEYS <= set(item) for item in everything)
    assert all(isinstance(item["evidence"], dict) for item in everything)
    lost = json.loads(_ackscope("findings", "--lake", lake_dir, "--kind", "lost_confirm", "--json").stdout)
    assert lost and {item["kind"] for item in lost} == {"lost_confirm"}
    assert len(lost) == sum(item["kind"] == "lost_confirm" for item in everything)
    table = _ackscope("findings", "--lake", lake_dir).stdout
    assert "lost_confirm" in table and "lab-lost_confirms-tcp-cut" in table


def _sample_lake(tmp_path) -> str:
    """A lake of the bundled sample capture, ingested by the command."""
    lake_dir = str(tmp_path / "lake")
    sample = glob.glob(os.path.join(ROOT, "analyzer", "samples", "*.pcapng"))
    assert _ackscope("ingest", *sample, "--lake", lake_dir).returncode == 0
    return lake_dir


def _stored(lake_dir: str) -> dict[str, list[str]]:
    """Every output table's rows, sorted."""
    return {name: sorted(json.dumps(row, sort_keys=True, default=str) for row in
                         lake.read_table(lake_dir, name, table_schema).to_pylist())
            for name, table_schema in OUTPUT_TABLES.items()}


def test_analyze_command_on_the_bundled_sample(tmp_path):
    """The command on the sample's lake: its first run, a full one of a small lake, is the local
    executor's (no JVM: a driver that cannot start would fail it); the same connections analysed
    again by day (--since) are Spark's, with the same tables; a run with nothing new, and one with
    new thresholds (a full run: the local executor's again), then."""
    lake_dir = _sample_lake(tmp_path)
    run = _ackscope("analyze", "--lake", lake_dir, "--master", "local[2]", "--driver-memory", "2x", "--json")
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(run.stdout)
    assert report["findings_by_kind"] == {"lost_confirm": 2} and report["delta_mode"] == "none"
    assert report["rows"]["publishes"] == 45 and report["spark_jobs"] == 0 and report["scope"] == "full"
    steps = ["plan", "timelines", "write tables", "findings"]
    assert sorted(report["seconds_by_step"]) == sorted(steps)
    assert "analysed by the driver" in run.stderr
    tables = _stored(lake_dir)

    first = lake.read_table(lake_dir, "connections", schema.CONNECTIONS)["first_ts_ns"].to_pylist()
    since = datetime.fromtimestamp(min(first) / 1e9, timezone.utc).date().isoformat()
    # On Spark (--local-up-to 0: only a run with nothing new is the driver's), as a lake too large
    # for the local executor runs it.
    again = _ackscope("analyze", "--lake", lake_dir, "--master", "local[2]", "--since", since, "--local-up-to", "0",
                      "--json")
    assert again.returncode == 0, again.stderr[-3000:]
    by_day = json.loads(again.stdout)
    assert by_day["delta_mode"] == "bridge" and by_day["scope"] == "days" and by_day["connections"] == 2, by_day
    # One pass (its tables written by its tasks), the findings: issue 13's bound on Spark jobs.
    assert 1 <= by_day["spark_jobs"] <= 10, by_day["spark_jobs"]
    progress = [line for line in again.stderr.splitlines() if line.startswith("ackscope analyze: ")]
    assert [line.split(" (")[0] for line in progress][:2] == ["ackscope analyze: plan", "ackscope analyze: timelines"]
    # Spark's own log goes to its file, and so does what the JVM itself prints (its line about
    # incubator modules, before any logging starts): the progress lines are all there is.
    assert again.stderr.splitlines() == progress, again.stderr[-2000:]
    assert _stored(lake_dir) == tables

    # Nothing new since (a scheduled run over an idle lake): the same findings, and no Spark. A
    # driver that cannot start (the heap size "2x") would fail any run that started one.
    versions = {name: lake.open_table(lake_dir, name).version() for name in ("findings", "analysis_runs")}
    again = _ackscope("analyze", "--lake", lake_dir, "--driver-memory", "2x", "--json")
    assert again.returncode == 0, again.stderr[-3000:]
    unchanged = json.loads(again.stdout)
    assert unchanged["delta_mode"] == "none" and unchanged["spark_jobs"] == 0
    assert unchanged["scope"] == "new_data" and unchanged["reason"].endswith("; nothing to analyse")
    assert unchanged["findings_by_kind"] == report["findings_by_kind"] and unchanged["rows"] == {}
    assert list(unchanged["seconds_by_step"]) == ["plan"]
    assert again.stderr.startswith("ackscope analyze: plan (") and again.stderr.endswith(": no Spark\n")
    assert {name: lake.open_table(lake_dir, name).version() for name in versions} == versions
    text = _ackscope("analyze", "--lake", lake_dir, "--driver-memory", "2x")
    assert text.returncode == 0 and "(Spark not started, " in text.stdout
    assert "lab-lost_confirms-tcp-cut" in text.stdout  # the findings table follows the report
    # New thresholds make a full run (the stored findings and checkpoints were made under the old
    # ones): on a lake this small the local executor's, so still no Spark.
    stale = _ackscope("analyze", "--lake", lake_dir, "--driver-memory", "2x", "--threshold", "requeue_loop_deliveries=7",
                      "--json")
    assert stale.returncode == 0, stale.stderr[-2000:]
    rerun = json.loads(stale.stdout)
    assert (rerun["scope"], rerun["reason"], rerun["delta_mode"]) == (
        "full", "--threshold settings differ from the last run's", "none")
    assert rerun["connections"] == report["connections"]


def test_the_command_plans_its_run_before_it_chooses_the_executor(tmp_path):
    """`ackscope analyze` plans its run before it starts anything, as the run would plan itself,
    and chooses the executor on that plan (analyze.local_takes: the frame rows it will read); a
    lake it cannot plan gives no plan (the run then plans itself and says why)."""
    lake_dir = _sample_lake(tmp_path)
    rows = lake.logged_rows(lake.open_table(lake_dir, "frames"))
    args = build_parser().parse_args(["analyze", "--lake", lake_dir])
    plan = cli._planned(args, Thresholds())
    assert plan.scope == "full" and plan.rows_to_read == rows
    assert local_takes(plan, rows) and not local_takes(plan, rows - 1)
    shutil.rmtree(os.path.join(lake_dir, "frames", "_delta_log"))
    assert cli._planned(args, Thresholds()) is None


def test_spark_submit_runs_the_job_file_as_the_deployments_do(tmp_path):
    """`spark-submit spark_jobs/job.py` (the CronJob's, spark-operator's and compose's entry):
    Python runs the file as a script, outside its package."""
    lake_dir = _sample_lake(tmp_path)
    spark_home = os.path.dirname(pyspark.__file__)
    run = subprocess.run([os.path.join(spark_home, "bin", "spark-submit"), "--master", "local[1]",
                          os.path.join(ROOT, "spark_jobs", "job.py"), "--lake", lake_dir, "--json"],
                         capture_output=True, text=True, timeout=600,
                         env={**os.environ, "SPARK_HOME": spark_home, "PYSPARK_PYTHON": sys.executable})
    assert run.returncode == 0, run.stderr[-3000:]
    # Spark runs the Python driver with its stderr merged into stdout: the progress lines, then the report.
    *progress, last = run.stdout.splitlines()
    assert [line.split(" (")[0] for line in progress] == \
        [f"ackscope analyze: {step}" for step in ("plan", "timelines", "write tables", "findings")]
    report = json.loads(last)
    assert report["findings_by_kind"] == {"lost_confirm": 2} and report["rows"]["publishes"] == 45


def test_a_driver_that_cannot_start_is_reported_with_the_jvms_reason(tmp_path):
    lake_dir, log = _sample_lake(tmp_path), tmp_path / "spark.log"
    # Left to Spark (--local-up-to 0: the local executor takes only a run with nothing new).
    run = subprocess.run([ACKSCOPE, "analyze", "--lake", lake_dir, "--driver-memory", "2x", "--local-up-to", "0"],
                         capture_output=True,
                         text=True, timeout=600, env={**os.environ, "ACKSCOPE_SPARK_LOG": str(log)})
    assert run.returncode == 5 and run.stdout == "", run.stderr[-2000:]
    message, = run.stderr.splitlines()
    assert message.startswith("ackscope analyze: Spark's driver did not start: ")
    assert "Invalid maximum heap size: -Xmx2x" in message and str(log) in message
    assert "Invalid maximum heap size" in log.read_text()


def test_analyze_command_refuses_bad_arguments(tmp_path):
    run = _ackscope("analyze", "--lake", str(tmp_path))
    assert run.returncode == 2 and "no frames table" in run.stderr
    run = _ackscope("analyze", "--lake", str(tmp_path), "--threshold", "no_such=1")
    assert run.returncode == 2 and "unknown threshold 'no_such'" in run.stderr
    run = _ackscope("analyze", "--lake", str(tmp_path), "--since", "yesterday")
    assert run.returncode == 2 and "--since 'yesterday' is not a UTC day" in run.stderr
    run = _ackscope("analyze", "--lake", str(tmp_path), "--full", "--until", "2026-11-01")
    assert run.returncode == 2 and "--full analyses every day" in run.stderr
