"""The one pass (spark_jobs/connection_pass.py) on a real local Spark: every connection through the
reference state machine must give exactly what replaying it alone gives, whatever the partitioning
and however the Arrow batches cut the connections; and each open connection's checkpoint must be
the one carrying it on from its frames gives.

Random traffic comes from tests/test_timeline.py's generator with tests/variants.py's damage; each
Spark run takes many connections at once (a Spark job costs seconds whatever its size)."""

import glob
import os

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from analyzer import lake, schema
from analyzer.ingest import ingest_file
from analyzer.timeline import INPUT_COLUMNS, replay, replay_frames, to_tables
from analyzer.timeline.carry import continue_connection, load
from spark_jobs.connection_pass import STATE_TABLE, connection_pass, pass_rows
from spark_jobs.timeline.tables import TIMELINE_TABLES

from .conftest import ROOT
from .test_timeline import renumbered, valid_traffic
from .variants import VARIANTS

INPUT_SCHEMA = pa.schema([schema.FRAMES.field(name) for name in INPUT_COLUMNS])
KEYS = {"deliveries": ("connection_id", "channel", "incarnation", "seq"),
        "publishes": ("connection_id", "channel", "incarnation", "seq"),
        "channels": ("connection_id", "channel", "incarnation"),
        "violations": ("connection_id", "channel", "incarnation", "seq", "kind")}
OVERDUE_NS = 15_000_000  # rows are 1 ms apart: some open publishes are overdue, some not
BUCKET_NS = 10_000_000


@pytest.fixture
def small_batches(spark):
    """Arrow batches of 7 rows: connections cross batch boundaries everywhere."""
    key = "spark.sql.execution.arrow.maxRecordsPerBatch"
    before = spark.conf.get(key)
    spark.conf.set(key, "7")
    yield
    spark.conf.set(key, before)


def run_pass(spark, frames: pa.Table, overdue_ns: int, partitions: int, flush_records: int = 50_000):
    # combine_chunks: Spark 4.2 drops every chunk after an empty one of a chunked Arrow table.
    wide = connection_pass(spark.createDataFrame(frames.combine_chunks()), BUCKET_NS, overdue_ns,
                           frames_version=7, partitions=partitions, flush_records=flush_records).persist()
    got = {name: pass_rows(wide, name).toArrow().sort_by([(k, "ascending") for k in KEYS[name]])
           for name in TIMELINE_TABLES}
    states = {row["connection_id"]: row for row in pass_rows(wide, STATE_TABLE).toArrow().to_pylist()}
    tally = {row["connection_id"]: row["frames"] for row in pass_rows(wide, "tally").toArrow().to_pylist()}
    wide.unpersist()
    return got, states, tally


def assert_same_tables(got: dict, expected: dict):
    for name in TIMELINE_TABLES:
        assert got[name].schema == expected[name].schema, name
        if not got[name].equals(expected[name]):
            rows, want = got[name].to_pylist(), expected[name].to_pylist()
            assert len(rows) == len(want), (name, len(rows), len(want))
            for row, wanted in zip(rows, want):
                assert row == wanted, (name, {k: (row[k], wanted[k]) for k in row if row[k] != wanted[k]})


def assert_checkpoints(states: dict, by_connection: dict, overdue_ns: int):
    assert set(states) == set(by_connection)
    for connection_id, rows in by_connection.items():
        state = states[connection_id]
        assert (state["last_seq"], state["last_ts_ns"], state["frames_version"]) == \
            (rows[-1]["seq"], rows[-1]["ts_ns"], 7)
        carried = continue_connection(None, rows, BUCKET_NS, overdue_ns, keep_rows=False)
        ended = any((row["channel"] or 0) == 0 and row["method"] in ("connection.close", "connection.close-ok",
                                                                     "tcp.fin", "tcp.rst")
                    and not row.get("malformed") for row in rows)
        if ended or carried.fallback:
            assert state["checkpoint"] is None, connection_id
            continue
        mine = load(state["checkpoint"])
        assert (mine.provisional, mine.boundary, mine.boundary_ns) == \
            (carried.checkpoint.provisional, carried.checkpoint.boundary, carried.checkpoint.boundary_ns)


def _by_connection(rows: list[dict]) -> dict:
    out = {}
    for row in sorted(rows, key=lambda r: (r["connection_id"], r["seq"])):
        out.setdefault(row["connection_id"], []).append(row)
    return out


# No shrinking: each example is a Spark run of many connections; a failure names its rows anyway.
@settings(max_examples=2, deadline=None, suppress_health_check=list(HealthCheck),
          phases=[Phase.explicit, Phase.reuse, Phase.generate])
@given(data=st.data())
def test_the_pass_equals_the_reference_model_on_random_traffic(spark, small_batches, data):
    rows = []
    for i in range(36):
        variant = data.draw(st.sampled_from(sorted(VARIANTS)), label="variant")
        traffic = valid_traffic(data, transactions=data.draw(st.booleans()))
        connection_id = f"10.0.0.1:{40000 + i}>10.0.0.2:5672@{i}"
        conn = [dict(row, connection_id=connection_id) for row in traffic.conv.rows]
        if VARIANTS[variant] is not None:
            conn = [dict(row, connection_id=connection_id) for row in VARIANTS[variant](data, conn)]
        rows += renumbered(conn)
    rows = [{c: row.get(c) for c in INPUT_COLUMNS} | {"agent_id": row.get("agent_id", "test")} for row in rows]
    # Records leave in batches of 1 to 50,000: a connection's records cross many flushes.
    got, states, tally = run_pass(spark, pa.Table.from_pylist(rows, schema=INPUT_SCHEMA), OVERDUE_NS,
                                  partitions=data.draw(st.sampled_from([1, 3, 8]), label="partitions"),
                                  flush_records=data.draw(st.sampled_from([1, 3, 50_000]), label="flush"))
    assert_same_tables(got, to_tables(replay(sorted(rows, key=lambda r: (r["connection_id"], r["seq"])),
                                             OVERDUE_NS)))
    by_connection = _by_connection(rows)
    assert tally == {k: len(v) for k, v in by_connection.items()}
    assert_checkpoints(states, by_connection, OVERDUE_NS)


def test_the_pass_equals_the_reference_model_on_recorded_captures(spark, tmp_path, corpus_dir):
    """Every example and every capture of the public corpus, in one run."""
    captures = sorted(glob.glob(os.path.join(ROOT, "examples", "*.pcapng")))
    captures += sorted(p for p in glob.glob(os.path.join(corpus_dir, "**", "*"), recursive=True)
                       if p.endswith((".pcap", ".pcapng")))
    for capture in captures:
        ingest_file(capture, str(tmp_path))
    frames = lake.read_table(str(tmp_path), "frames", schema.FRAMES)
    got, states, tally = run_pass(spark, frames.select(INPUT_COLUMNS), 60 * 10**9, partitions=4, flush_records=5)
    assert_same_tables(got, replay_frames(frames))
    by_connection = _by_connection(frames.select(INPUT_COLUMNS).to_pylist())
    assert tally == {k: len(v) for k, v in by_connection.items()}
    assert_checkpoints(states, by_connection, 60 * 10**9)
