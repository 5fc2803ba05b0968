"""A scheduled run carried on by the driver without Spark (spark_jobs/local_executor.py): the
same tables as Spark's carried pass after every append, none of Spark's jobs; Spark's path where a
connection must be analysed whole (nothing written before it), and Spark started late where the
findings need it. Real Spark for the reference runs, real Delta tables, generated and recorded
traffic (test_incremental.py's)."""

import io
import json
import os
import subprocess
from dataclasses import fields

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from analyzer import lake, schema
from analyzer.connection_analysis import Settings
from analyzer.timeline.records import DEFAULT_OVERDUE_NS
from spark_jobs import local_executor
from spark_jobs.analyze import NO_SPARK, analyze, analyze_without_spark, planned_run
from spark_jobs.connection_pass import PASS_TABLES, STATE_TABLE, connection_pass
from spark_jobs.delta_io import read_delta
from spark_jobs.timeline.tables import TIMELINE_TABLES
from spark_jobs.timeline.wide import rows_from_wide
from spark_jobs import findings
from spark_jobs.run_scope import NEW_DATA

from .findings_check import LAB_THRESHOLDS
from .test_analyze import ACKSCOPE
from .test_incremental import _append, _frames, _lakes_split_at, _pieces, _stray_files, _tables, _versions, traffic  # noqa: F401

STATE_KEY = [("connection_id", "ascending")]


def _state(lake_dir: str) -> list[dict]:
    """The checkpoints, by connection."""
    table = lake.read_table(lake_dir, STATE_TABLE, schema.ANALYSIS_STATE)
    return table.sort_by(STATE_KEY).to_pylist()


def _in_driver(spark, lake_dir: str, thresholds=LAB_THRESHOLDS):
    """`ackscope analyze`'s run without Spark: (its report, None where it is Spark's run, and what it printed)."""
    progress = io.StringIO()
    plan = planned_run(lake_dir, None, None, False, 10, DEFAULT_OVERDUE_NS, thresholds)
    report = analyze_without_spark(lake_dir, plan, 0.0, progress=progress, thresholds=thresholds,
                                   start_spark=lambda: spark)
    return report, progress.getvalue()


@pytest.fixture(scope="module")
def both_paths(spark, traffic, tmp_path_factory):  # noqa: F811
    """The traffic appended in pieces into two lakes, analysed after each append: one by the
    driver where it can (Spark's run otherwise, the first), one by Spark's path. Each append's
    tables and checkpoints of both, and the driver's reports."""
    frames, connections = traffic
    driver_dir, spark_dir = (str(tmp_path_factory.mktemp(name)) for name in ("driver", "spark"))
    seen, steps = set(), []
    for number, piece in enumerate(_pieces(frames)):
        ids = set(piece["connection_id"].to_pylist())
        new = connections.filter(pc.is_in(connections["connection_id"], pa.array(sorted(ids - seen))))
        seen |= ids
        for lake_dir in (driver_dir, spark_dir):
            _append(lake_dir, "frames", piece, schema.FRAMES, f"piece-{number}")
            _append(lake_dir, "connections", new, schema.CONNECTIONS, f"piece-{number}")
        report, said = _in_driver(spark, driver_dir)
        if report is None:
            analyze(spark, driver_dir, thresholds=LAB_THRESHOLDS)
        analyze(spark, spark_dir, thresholds=LAB_THRESHOLDS)
        steps.append((report, said, _tables(driver_dir), _state(driver_dir), _tables(spark_dir), _state(spark_dir)))
    return driver_dir, steps


def test_the_driver_carries_scheduled_runs_on_to_sparks_tables_without_a_spark_job(both_paths):
    driver_dir, steps = both_paths
    first, *later = steps
    assert first[0] is None   # the first run analyses whole: Spark's
    for report, said, driver_tables, driver_state, spark_tables, spark_state in later:
        assert report is not None, said
        assert report.delta_mode == NO_SPARK and report.spark_jobs == 0 and report.scope == NEW_DATA, report
        assert report.carried_connections == report.connections > 0 and report.frames > 0, report
        assert "carried on by the driver" in said and "Spark jobs)" in said
        assert report.rows["deliveries"] > 0 and report.findings_by_kind, report
        assert driver_tables == spark_tables
        assert driver_state == spark_state
    assert not _stray_files(driver_dir)


def test_a_run_of_too_many_new_frames_is_sparks(spark, traffic, tmp_path, monkeypatch):  # noqa: F811
    """local_executor.DRIVER_FRAMES bounds the new frame rows (the Delta log's count) the driver takes."""
    frames, connections = traffic
    first, second, _ = _pieces(frames)
    lake_dir = str(tmp_path)
    _append(lake_dir, "frames", first, schema.FRAMES, "one")
    _append(lake_dir, "connections", connections, schema.CONNECTIONS, "all")
    analyze(spark, lake_dir, thresholds=LAB_THRESHOLDS)
    _append(lake_dir, "frames", second, schema.FRAMES, "two")
    monkeypatch.setattr(local_executor, "DRIVER_FRAMES", second.num_rows - 1)
    before = _versions(lake_dir)
    report, said = _in_driver(spark, lake_dir)
    assert report is None and said == ""
    assert _versions(lake_dir) == before
    monkeypatch.setattr(local_executor, "DRIVER_FRAMES", second.num_rows)
    report, said = _in_driver(spark, lake_dir)
    assert report is not None and report.frames == second.num_rows and report.delta_mode == NO_SPARK, said


def test_a_connection_to_analyse_whole_leaves_the_run_to_spark_with_nothing_written(spark, tmp_path):
    """A connection that ended (closed) gets new frames: it has no checkpoint to carry on from, so
    the driver's pass gives up, deletes what it wrote and leaves the run to Spark, which ends with
    one run's tables."""
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
    before = _versions(pieces_dir)
    report, said = _in_driver(spark, pieces_dir)
    assert report is None, report
    assert "to analyse whole: Spark takes the run" in said
    assert _versions(pieces_dir) == before and not _stray_files(pieces_dir)
    report = analyze(spark, pieces_dir, thresholds=LAB_THRESHOLDS)
    assert a.id in report.reason
    analyze(spark, whole_dir, thresholds=LAB_THRESHOLDS)
    assert _tables(pieces_dir) == _tables(whole_dir)


@pytest.mark.parametrize("late_spark_for", ["packets", "a large findings table"])
def test_spark_starts_late_where_the_drivers_findings_need_it(spark, tmp_path, monkeypatch, late_spark_for):
    """The driver carries the connections on; the findings' evidence packets of frames neither the
    stored findings nor the new frames hold are found by a scan of `frames` (Spark, started then);
    a findings table too large for the driver to rewrite whole (a bound of -1) is patched by Spark
    (findings.py). Both end with one run's tables."""
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
    if late_spark_for == "a large findings table":
        monkeypatch.setattr(findings, "REWRITTEN_WHOLE_BYTES", -1)
    _append(pieces_dir, "frames", _frames(a.rows[held:]), schema.FRAMES, "second")
    started = []

    def start():
        started.append(spark)
        return spark

    plan = planned_run(pieces_dir, None, None, False, 10, DEFAULT_OVERDUE_NS, LAB_THRESHOLDS)
    progress = io.StringIO()
    report = analyze_without_spark(pieces_dir, plan, 0.0, progress=progress, thresholds=LAB_THRESHOLDS,
                                   start_spark=start)
    assert report is not None and report.carried_connections == 1, progress.getvalue()
    assert started and report.spark_jobs > 0 and report.delta_mode != NO_SPARK, (report, progress.getvalue())
    assert "start Spark" in progress.getvalue()
    assert _tables(pieces_dir) == _tables(whole_dir)


def _pass_tables(wide: pa.Table, lake_dir: str) -> dict[str, list[str]]:
    """Every table a pass gives (connection_pass.PASS_TABLES), sorted: its rows in the wide table and
    in the files it wrote into the lake (Delta keeps their `date` in the log: left out of both)."""
    rows = {name: rows_from_wide(wide, name).to_pylist() for name in PASS_TABLES if name not in ("files", "counts")}
    for file in rows_from_wide(wide, "files").to_pylist():
        rows[file["table"]] += pq.read_table(os.path.join(lake_dir, file["table"], file["path"])).to_pylist()
    rows["came_back"] = [pc.sum(rows_from_wide(wide, "counts")["came_back"]).as_py()]
    return {name: sorted(json.dumps({k: v for k, v in row.items() if k != "date"}, sort_keys=True, default=str)
                         for row in table) if name != "came_back" else table for name, table in rows.items()}


def test_the_pass_over_whole_connections_gives_sparks_tables_in_process(spark, traffic, tmp_path):  # noqa: F811
    """local_executor.whole_pass: the frames laid out as Spark's shuffle and sort hand them to the
    pass, through the same partition code: every table and checkpoint as Spark's pass gives them."""
    frames, connections = traffic
    settings = Settings(10, DEFAULT_OVERDUE_NS, LAB_THRESHOLDS)
    local_dir, spark_dir = str(tmp_path / "local"), str(tmp_path / "spark")
    for lake_dir in (local_dir, spark_dir):
        _append(lake_dir, "frames", frames, schema.FRAMES, "all")
        _append(lake_dir, "connections", connections, schema.CONNECTIONS, "all")
    version = DeltaTable(os.path.join(local_dir, "frames")).version()
    local = _pass_tables(local_executor.whole_pass(local_dir, None, settings, version), local_dir)
    on_spark = connection_pass(read_delta(spark, spark_dir, "frames", schema.FRAMES, version=version),
                               read_delta(spark, spark_dir, "connections", schema.CONNECTIONS), settings, version,
                               write_to=spark_dir)
    assert local == _pass_tables(on_spark.toArrow(), spark_dir)
    assert all(local[name] for name in (*TIMELINE_TABLES, "channel_metrics", STATE_TABLE, "raw_findings"))
    keys = sorted(set(frames["connection_id"].to_pylist()))[:3]
    some = _pass_tables(local_executor.whole_pass(local_dir, keys, settings, version), local_dir)
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
    assert "carried on by the driver" in done.stderr
    assert _tables(pieces_dir) == _tables(whole_dir)
