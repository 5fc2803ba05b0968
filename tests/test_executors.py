"""The two executors of the analysis held to one result: the local one (no JVM:
spark_jobs/local_executor.py) and Spark's (spark_executor.py), each given an identical
lake, appended to in pieces and analysed after every append, must leave identical tables
(deliveries, publishes, channels, violations, channel_metrics, findings) and checkpoints
(analysis_state), row for row, after every run.

The inputs, all in the same two lakes, each cut by its own clock at CUTS (test_incremental's cut:
inside connections and channels, some living through every append; the generated traffic across
two UTC days):
- every example capture (examples/*.pcapng: the lab's recordings bundled with the project; the
  lab's other four scenarios are recorded live, minutes with the broker, test_lab.py), ingested
  whole by the ingest `ackscope ingest` runs, its frame rows then cut. Not the pieces of a capture
  ingested one by one: an ingest that continues a capture's flows takes out the rows it had ended
  them with (provisional frames files), so the next run is a full one (run_scope.py: frames files
  deleted), Spark's in both lakes;
- the generated traffic of the incremental tests (bench/frames_generator.py, seeded);
- random traffic in every variant of tests/variants.py (reordered, mid-stream, a capture gap, bad
  acks), drawn by Hypothesis derandomized: the same on every run of the suite;
- a lockstep publisher, for the one kind of finding the others hold none of.
The lab thresholds, so that findings of every kind appear.

Each executor is driven through one function here (`run_locally`, `run_on_spark`): the local
executor takes every run of these small lakes (analyze.local_takes), the first, a full one, and the
runs with a connection analysed whole (it ended, then got frames) too.

This replaces the per-route equivalence tests (the driver's carried runs against Spark's tables);
test_local_executor.py holds what is the local executor's own (its bounds, no JVM, no Spark job).
"""

from __future__ import annotations

import glob
import os
from collections import Counter

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from analyzer import lake, schema
from analyzer.ingest import ingest_file
from analyzer.published import RUNS_TABLE
from analyzer.rows import dicts_to_table
from spark_jobs.analyze import NO_SPARK, OUTPUT_TABLES, AnalysisReport, analyze
from spark_jobs.connection_pass import STATE_TABLE
from spark_jobs.run_scope import FULL

from .conftest import ROOT
from .findings_check import LAB_THRESHOLDS
from .test_detectors_python import random_connections
from .test_incremental import PARAMS, _append, _frames, _stray_files, gen

EXAMPLES = sorted(glob.glob(os.path.join(ROOT, "examples", "*.pcapng")))
# Where every input is cut into the appends: quantiles of its frames' times (gen.as_appended).
CUTS = [0.3, 0.55, 0.8]
RANDOM_EXAMPLES, RANDOM_CONNECTIONS = 4, 12
# What the log of runs says of a run that is the same whichever executor made it.
LOGGED = ("scope", "frames_version", "baseline_version", "connections", "frames", "bucket_seconds", "overdue_ns",
          "thresholds")


def run_locally(lake_dir: str) -> AnalysisReport:
    """The local executor's run: no Spark session to start."""
    return analyze(None, lake_dir, thresholds=LAB_THRESHOLDS)


def run_on_spark(spark, lake_dir: str) -> AnalysisReport:
    return analyze(spark, lake_dir, thresholds=LAB_THRESHOLDS)


# -- the inputs ---------------------------------------------------------------------------------------

def recorded_traffic(staging: str) -> tuple[list[pa.Table], pa.Table]:
    """Every example ingested as `ackscope ingest` ingests it: its frames, capture by capture (each
    recorded at a time of its own, so each is cut by its own clock), and the connections rows."""
    for capture in EXAMPLES:
        assert not ingest_file(capture, staging).errors, capture
    frames = lake.read_table(staging, "frames", schema.FRAMES)
    by_capture = [frames.filter(pc.equal(frames["source"], source))
                  for source in sorted(set(frames["source"].to_pylist()))]
    assert len(by_capture) == len(EXAMPLES)
    return by_capture, lake.read_table(staging, "connections", schema.CONNECTIONS)


def random_traffic() -> tuple[list[dict], list[dict]]:
    """RANDOM_EXAMPLES draws of RANDOM_CONNECTIONS random connections (test_detectors_python's, in
    tests/variants.py's variants), derandomized: the same every run; each connection numbered apart."""
    drawn = []

    @settings(max_examples=RANDOM_EXAMPLES, derandomize=True, database=None, deadline=None,
              suppress_health_check=list(HealthCheck), phases=[Phase.generate])
    @given(data=st.data())
    def draw(data):
        drawn.append(random_connections(data, RANDOM_CONNECTIONS))

    draw()
    frames, connections = [], []
    for number, (some_frames, some_connections) in enumerate(drawn):
        for i, connection in enumerate(some_connections):
            j = number * RANDOM_CONNECTIONS + i
            renamed = dict(connection_id=f"10.0.0.1:{40000 + j}>10.0.0.2:5672@{j}", client_port=40000 + j,
                           source=f"random/{j}.pcapng", connection_name=f"random-{j}")
            connections.append(dict(connection, **renamed))
            frames += [dict(row, connection_id=renamed["connection_id"], source=renamed["source"])
                       for row in some_frames if row["connection_id"] == connection["connection_id"]]
    return frames, connections


def lockstep_publisher() -> tuple[pa.Table, pa.Table]:
    """A publisher waiting for each confirm before its next publish (test_timeline's Conv): the one
    kind of finding, synchronous_confirms, that neither the examples nor the random traffic hold.
    Its frames and connections row."""
    from .test_timeline import T0, Conv

    conv = Conv("10.0.2.1:41000>10.0.2.2:5672@1", start=T0 + 3600 * 10**9)
    conv.open(1)
    conv.c(1, "confirm.select")
    conv.b(1, "confirm.select-ok")
    for tag in range(1, 2 * LAB_THRESHOLDS.synchronous_min_publishes + 1):
        conv.publish(1, f"lockstep-{tag}")
        conv.confirm(1, tag)
    for row in conv.rows:
        row.update(source="lockstep.pcap", source_packet=row["seq"])
    connection = {"connection_id": conv.id, "agent_id": "test", "source": "lockstep.pcap",
                  "connection_name": "lockstep", "first_ts_ns": conv.rows[0]["ts_ns"],
                  "last_ts_ns": conv.rows[-1]["ts_ns"]}
    return _frames(conv.rows), dicts_to_table([connection], schema.CONNECTIONS, schema.CONNECTION_TIMESTAMPS,
                                              schema.CONNECTION_DATE_FROM)


def in_pieces(staging: str) -> tuple[list[pa.Table], pa.Table]:
    """Every input's frames cut by its own time at CUTS (gen.as_appended: inside connections and
    channels, each connection's rows in seq order), the pieces of all of them appended together;
    and every input's connections rows."""
    captures, capture_connections = recorded_traffic(staging)
    generated, generated_connections = gen.lake_tables(PARAMS)
    random_frames, random_connections_ = random_traffic()
    lockstep, lockstep_connection = lockstep_publisher()
    inputs = [*captures, generated, _frames(random_frames), lockstep]
    connections = pa.concat_tables([capture_connections, generated_connections, dicts_to_table(
        random_connections_, schema.CONNECTIONS, schema.CONNECTION_TIMESTAMPS, schema.CONNECTION_DATE_FROM),
        lockstep_connection])
    pieces = [gen.as_appended(frames, CUTS) for frames in inputs]
    return [pa.concat_tables(same_append) for same_append in zip(*pieces)], connections


# -- what the runs leave ------------------------------------------------------------------------------

def outputs(lake_dir: str) -> dict[str, list[dict]]:
    """Every output table and the checkpoints, their rows sorted (by their text: a total order);
    and what the log of runs says of each run (not its id and times), the next run's plan."""
    out = {}
    for name, table_schema in {**OUTPUT_TABLES, STATE_TABLE: schema.ANALYSIS_STATE}.items():
        out[name] = sorted(lake.read_table(lake_dir, name, table_schema).to_pylist(), key=repr)
    out[RUNS_TABLE] = sorted(lake.read_table(lake_dir, RUNS_TABLE, schema.ANALYSIS_RUNS, columns=list(LOGGED)
                                             ).to_pylist(), key=repr)
    return out


def differences(local: list[dict], spark: list[dict]) -> str:
    only_local, only_spark = Counter(map(repr, local)) - Counter(map(repr, spark)), \
        Counter(map(repr, spark)) - Counter(map(repr, local))
    return (f"{len(local)} rows locally, {len(spark)} by Spark\nonly local:\n  " + "\n  ".join(sorted(only_local)[:10])
            + "\nonly Spark:\n  " + "\n  ".join(sorted(only_spark)[:10]))


@pytest.fixture(scope="module")
def both_executors(spark, tmp_path_factory):
    """The inputs appended in pieces into two lakes, each analysed after every append: one by the
    local executor, one by Spark's. Per run: both reports and both lakes' outputs; and the files
    left in either lake that no commit names."""
    root = tmp_path_factory.mktemp("executors")
    local_dir, spark_dir = str(root / "local"), str(root / "spark")
    pieces, connections = in_pieces(str(root / "staging"))
    seen, runs = set(), []
    for number, piece in enumerate(pieces):
        ids = set(piece["connection_id"].to_pylist())
        new = connections.filter(pc.is_in(connections["connection_id"], pa.array(sorted(ids - seen), pa.string())))
        seen |= ids
        for lake_dir in (local_dir, spark_dir):
            _append(lake_dir, "frames", piece, schema.FRAMES, f"piece-{number}")
            _append(lake_dir, "connections", new, schema.CONNECTIONS, f"piece-{number}")
        spark_report = run_on_spark(spark, spark_dir)
        report = run_locally(local_dir)
        runs.append((report, spark_report, outputs(local_dir), outputs(spark_dir)))
    return runs, _stray_files(local_dir) + _stray_files(spark_dir)


def test_both_executors_report_the_same_runs(both_executors):
    runs, _ = both_executors
    assert runs[0][1].scope == FULL
    for report, on_spark, _, _ in runs:
        assert report.delta_mode == NO_SPARK and report.spark_jobs == 0, report
        assert on_spark.delta_mode != NO_SPARK and on_spark.spark_jobs > 0, on_spark
        for key in ("scope", "reason", "connections", "carried_connections", "frames", "rows"):
            assert getattr(report, key) == getattr(on_spark, key), (key, report, on_spark)
    # Not vacuous: runs carried every connection on, and one analysed a connection whole beside them.
    assert any(0 < r.carried_connections == r.connections for r, *_ in runs), [r.reason for r, *_ in runs]
    assert any(0 < r.carried_connections < r.connections for r, *_ in runs), [r.reason for r, *_ in runs]


def test_both_executors_leave_the_same_tables_and_checkpoints_after_every_run(both_executors):
    runs, stray = both_executors
    for number, (_, on_spark, local, spark) in enumerate(runs):
        for name in local:
            assert local[name] == spark[name], (f"run {number} ({on_spark.scope}: {on_spark.reason}), {name}: "
                                                + differences(local[name], spark[name]))
    # Not vacuous: every table and the checkpoints have rows, and there are findings of every kind.
    *_, last, _ = runs[-1]
    assert all(last[name] for name in last), [name for name in last if not last[name]]
    assert {row["kind"] for row in last["findings"]} == set(schema.FINDING_KINDS)
    # No run left a file behind that no commit names.
    assert stray == []
