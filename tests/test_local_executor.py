"""The local executor's own (spark_jobs/local_executor.py; test_executors.py holds its tables to
Spark's after every run): the bounds of the runs it takes; a connection that must be analysed
whole analysed whole by it; no Spark for its findings, whatever they read or rewrite; no JVM for
`ackscope analyze`; its pass over whole connections equal to Spark's. Real
Spark for the reference runs, real Delta tables, generated and recorded traffic (test_incremental.py's)."""

import io
import json
import os
import subprocess
from dataclasses import fields
from types import SimpleNamespace

import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from analyzer import lake, schema
from analyzer.connection_analysis import Settings
from analyzer.timeline.records import DEFAULT_OVERDUE_NS
from spark_jobs import local_executor
from spark_jobs.analyze import NO_SPARK, analyze, local_takes, planned_run
from spark_jobs.connection_pass import STATE_TABLE, WRITTEN_TABLES, PassSummary, connection_pass, summarised_pass
from spark_jobs.delta_io import read_delta
from spark_jobs.timeline.tables import TIMELINE_TABLES
from spark_jobs import findings

from .findings_check import LAB_THRESHOLDS
from .test_analyze import ACKSCOPE
from .test_incremental import (_append, _frames, _lakes_split_at, _pieces, _stray_files, _tables,  # noqa: F401
                               traffic)

def _in_driver(spark, lake_dir: str, thresholds=LAB_THRESHOLDS):
    """`ackscope analyze`'s run on a local master: (its report, and what it printed)."""
    progress = io.StringIO()
    report = analyze(spark, lake_dir, thresholds=thresholds, progress=progress, local=True)
    return report, progress.getvalue()


def test_a_run_of_too_many_frame_rows_is_sparks(spark, traffic, tmp_path):  # noqa: F811
    """The local executor takes a run of at most `local_up_to` frame rows (the Delta log's count): an
    append's new rows; a full run's, the lake's. `ackscope analyze --local-up-to` says the default."""
    frames, connections = traffic
    first, second, _ = _pieces(frames)
    lake_dir = str(tmp_path)
    _append(lake_dir, "frames", first, schema.FRAMES, "one")
    _append(lake_dir, "connections", connections, schema.CONNECTIONS, "all")
    report = analyze(spark, lake_dir, thresholds=LAB_THRESHOLDS, local=True, local_up_to=first.num_rows - 1)
    assert report.scope == "full" and report.delta_mode != NO_SPARK and report.spark_jobs > 0, report
    _append(lake_dir, "frames", second, schema.FRAMES, "two")
    plan = planned_run(lake_dir, None, None, False, 10, DEFAULT_OVERDUE_NS, LAB_THRESHOLDS)
    assert not local_takes(plan, second.num_rows - 1) and local_takes(plan, second.num_rows)
    report = analyze(spark, lake_dir, thresholds=LAB_THRESHOLDS, local=True, local_up_to=second.num_rows)
    assert report.frames == second.num_rows and report.delta_mode == NO_SPARK and report.spark_jobs == 0, report
    assert local_takes(plan) == (second.num_rows <= local_executor.DRIVER_FRAMES)
    said = subprocess.run([ACKSCOPE, "analyze", "--help"], capture_output=True, text=True).stdout
    assert f"(default {local_executor.DRIVER_FRAMES:,}:" in " ".join(said.split()), said


def test_a_connection_to_analyse_whole_is_analysed_whole_by_the_local_executor(spark, tmp_path):
    """A connection that ended (closed) gets new frames: it has no checkpoint to carry on from, so
    the local executor's carried pass gives it up, deletes what it wrote of it, and the executor
    analyses it whole, without Spark: one run's tables (test_executors.py: beside others carried on)."""
    from .test_timeline import T0, Conv

    a, b = Conv("10.9.0.21:40021>10.9.0.9:5672@1", start=T0), Conv("10.9.0.22:40022>10.9.0.9:5672@2", start=T0)
    a.open(1)
    a.consume(1)
    a.deliver(1, 1, msg="m1")
    a.ack(1, 1)
    b.ts = a.ts
    b.open(1)
    b.consume(1)
    b.deliver(1, 1, msg="m2")
    a.c(0, "connection.close", reply_code=200, reply_text="bye")
    a.b(0, "connection.close-ok")
    held = len(a.rows)
    a.deliver(1, 2, msg="late")   # after its close: no checkpoint was kept for it
    b.ack(1, 1)
    whole_dir, pieces_dir = _lakes_split_at(spark, tmp_path, a, b, held)
    _append(pieces_dir, "frames", _frames(a.rows[held:]), schema.FRAMES, "second")
    report, said = _in_driver(spark, pieces_dir)
    assert report.delta_mode == NO_SPARK and report.spark_jobs == 0, said
    assert a.id in report.reason and report.connections == 1 and report.carried_connections == 0, report
    analyze(spark, whole_dir, thresholds=LAB_THRESHOLDS)
    assert _tables(pieces_dir) == _tables(whole_dir)
    assert not _stray_files(pieces_dir)


@pytest.mark.parametrize("needs", ["a scan for packets", "a large findings table"])
def test_the_drivers_findings_need_no_spark(spark, tmp_path, monkeypatch, needs):
    """The driver carries the connections on, and its findings step needs no Spark: the evidence
    packets of frames neither the stored findings nor the new frames hold are found by a scan of
    `frames` in Arrow (findings._scanned); a findings table too large to be rewritten whole (a
    bound of 0 bytes while the step rewrites it) has the files holding a replaced row searched for
    and rewritten by the driver (delta_io.rewrite). Both end with one run's tables."""
    from .test_incremental import _spy, findings_searched
    from .test_timeline import T0, Conv

    a = Conv("10.9.0.31:40031>10.9.0.9:5672@1", start=T0)
    a.open(1)
    a.consume(1)   # no basic.qos: an unbounded_prefetch finding, its evidence the consume's frame
    a.deliver(1, 1, msg="d1")
    held = len(a.rows)
    a.ack(1, 1)
    a.deliver(1, 2, msg="d2")
    # No packet numbers (frames ingested before they were kept): the scan is the only place to look.
    b = Conv("10.9.0.32:40032>10.9.0.9:5672@2", start=T0)
    b.open(1)
    whole_dir, pieces_dir = _lakes_split_at(spark, tmp_path, a, b, held)
    scans, searches = [], []
    _spy(monkeypatch, findings, "_scanned", scans)
    if needs == "a large findings table":
        findings_searched(monkeypatch, searches)
    _append(pieces_dir, "frames", _frames(a.rows[held:]), schema.FRAMES, "second")
    report, said = _in_driver(spark, pieces_dir)
    assert report.carried_connections == 1, said
    assert report.spark_jobs == 0 and report.delta_mode == NO_SPARK and "start Spark" not in said, (report, said)
    assert len(scans) == 1 and len(searches) == (needs == "a large findings table"), (scans, searches)
    assert _tables(pieces_dir) == _tables(whole_dir)


def _pass_tables(summary: PassSummary, lake_dir: str) -> dict[str, list[str]]:
    """Every table a pass gives, sorted: its rows in the summary and in the files it wrote into the
    lake (WRITTEN_TABLES; Delta keeps their `date` in the log: left out)."""
    rows = {name: [] for name in WRITTEN_TABLES}
    rows.update(raw_findings=summary.raw_findings.to_pylist(), tally=summary.tally.to_pylist())
    for name, adds in summary.written.items():
        rows[name] += [row for add in adds for row in pq.read_table(os.path.join(lake_dir, name, add.path)).to_pylist()]
    return {"came_back": [summary.came_back], "fallbacks": summary.fallbacks,
            **{name: sorted(json.dumps({k: v for k, v in row.items() if k != "date"}, sort_keys=True, default=str)
                            for row in table) for name, table in rows.items()}}


def test_the_pass_over_whole_connections_gives_sparks_tables_in_process(spark, traffic, tmp_path):  # noqa: F811
    """LocalExecutor.connection_pass: the frames laid out as Spark's shuffle and sort hand them to the
    pass, through the same partition code: every table and checkpoint as Spark's pass gives them."""
    frames, connections = traffic
    settings = Settings(10, DEFAULT_OVERDUE_NS, LAB_THRESHOLDS)
    local_dir, spark_dir = str(tmp_path / "local"), str(tmp_path / "spark")
    for lake_dir in (local_dir, spark_dir):
        _append(lake_dir, "frames", frames, schema.FRAMES, "all")
        _append(lake_dir, "connections", connections, schema.CONNECTIONS, "all")
    version = DeltaTable(os.path.join(local_dir, "frames")).version()
    executor = local_executor.LocalExecutor(local_dir, SimpleNamespace(frames_version=version, new_files=()), settings)
    local = _pass_tables(executor.connection_pass(None), local_dir)
    on_spark = connection_pass(read_delta(spark, spark_dir, "frames", schema.FRAMES, version=version),
                               read_delta(spark, spark_dir, "connections", schema.CONNECTIONS), settings, version,
                               write_to=spark_dir)
    assert local == _pass_tables(summarised_pass(on_spark, carried=False), spark_dir)
    assert all(local[name] for name in (*TIMELINE_TABLES, "channel_metrics", STATE_TABLE, "raw_findings"))
    keys = sorted(set(frames["connection_id"].to_pylist()))[:3]
    some = _pass_tables(executor.connection_pass(keys), local_dir)
    assert sorted(json.loads(row)["connection_id"] for row in some[STATE_TABLE]) == keys


def test_ackscope_analyze_carries_a_small_append_on_without_starting_spark(spark, tmp_path):
    """The command: a scheduled run over a small append starts no JVM (Java is out of its reach),
    reports no Spark started and no Spark job, and ends with the tables of one run over everything."""
    from .test_timeline import T0, Conv

    a = Conv("10.9.0.41:40041>10.9.0.9:5672@1", start=T0)
    a.open(1)
    a.consume(1)
    for tag in range(1, 6):
        a.deliver(1, tag, msg=f"m{tag}")
    held = len(a.rows)
    for tag in range(1, 6):
        a.ack(1, tag)
    b = Conv("10.9.0.42:40042>10.9.0.9:5672@2", start=T0)
    b.open(1)
    for conv in (a, b):   # as captured: the findings' packets are known without a scan of `frames`
        for row in conv.rows:
            row.update(source=f"{conv.id}.pcap", source_packet=1000 + row["seq"])
    whole_dir, pieces_dir = _lakes_split_at(spark, tmp_path, a, b, held)
    _append(pieces_dir, "frames", _frames(a.rows[held:]), schema.FRAMES, "second")
    thresholds = [f"--threshold={f.name}={getattr(LAB_THRESHOLDS, f.name)}" for f in fields(LAB_THRESHOLDS)]
    done = subprocess.run([ACKSCOPE, "analyze", "--lake", pieces_dir, "--json", *thresholds], capture_output=True,
                          text=True, env={**os.environ, "JAVA_HOME": "/nonexistent"})
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["delta_mode"] == NO_SPARK and report["spark_jobs"] == 0, report
    assert report["carried_connections"] == 1 and report["frames"] == len(a.rows) - held, report
    assert "1 connection(s): analysed by the driver" in done.stderr
    assert _tables(pieces_dir) == _tables(whole_dir)


def test_the_local_reads_refuse_a_table_whose_files_need_delta_spark(tmp_path):
    """Deletion vectors hide rows that are still in the Parquet files: the local executor's reads
    (pyarrow, analyzer.lake) refuse such a table, as the bridge does, rather than read them back."""
    DeltaTable.create(str(tmp_path / "frames"), schema.FRAMES, partition_by=["date"],
                      configuration={"delta.enableDeletionVectors": "true"})
    refused = "deletionVectors.*--delta-mode native"
    with pytest.raises(RuntimeError, match=refused):
        lake.read_table(str(tmp_path), "frames", schema.FRAMES)
    with pytest.raises(RuntimeError, match=refused):
        list(lake.scan(str(tmp_path), "frames", schema.FRAMES, ["seq"]))
    with pytest.raises(RuntimeError, match=refused):
        analyze(None, str(tmp_path))
