"""The one pass (spark_jobs/connection_pass.py) on a real local Spark: every connection through the
reference state machine must give exactly what replaying it alone gives (its timeline tables, its
channel_metrics and its findings about one connection), whatever the partitioning and however the
Arrow batches cut the connections; and each open connection's checkpoint must be the one carrying
it on from its frames gives.

Random traffic comes from tests/test_timeline.py's generator with tests/variants.py's damage; each
Spark run takes many connections at once (a Spark job costs seconds whatever its size)."""

import glob
import os
import tempfile

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from analyzer import lake, schema
from analyzer.connection_analysis import ANALYSIS_COLUMNS, Settings
from analyzer.detectors import detect_connection
from analyzer.ingest import ingest_file
from analyzer.rows import dicts_to_table
from analyzer.timeline import INPUT_COLUMNS, replay, to_tables
from analyzer.timeline.tables import RECORD_TYPES
from analyzer.timeline.carry import continue_connection, load
from analyzer.timeline.metrics import channel_metrics
from analyzer.timeline.metrics import to_table as metrics_table
from spark_jobs.connection_pass import STATE_TABLE, WRITTEN_TABLES, connection_pass, summarised_pass
from spark_jobs.evidence_packets import PACKETS
from spark_jobs.findings import Changed, refresh_findings
from spark_jobs.provisional import PROVISIONAL
from spark_jobs.requeue_related import REQUEUE_RELATED
from spark_jobs.timeline.plans import arrow_batches_by_rows, conf_meanwhile
from spark_jobs.timeline.tables import TIMELINE_TABLES

from .conftest import ROOT
from .findings_check import LAB_THRESHOLDS
from .test_detectors_python import assert_same, packets_from, random_connections
from .test_timeline import renumbered, valid_traffic
from .variants import VARIANTS

FRAME_COLUMNS = (*ANALYSIS_COLUMNS, "source_packet", "source")
INPUT_SCHEMA = pa.schema([schema.FRAMES.field(name) for name in FRAME_COLUMNS])
# What the findings step reads of `frames`: each frame's packet and source, by day.
PACKET_FRAMES = pa.schema([schema.FRAMES.field(name) for name in ("date", *PACKETS)])
KEYS = {"deliveries": ("connection_id", "channel", "incarnation", "seq"),
        "publishes": ("connection_id", "channel", "incarnation", "seq"),
        "channels": ("connection_id", "channel", "incarnation"),
        "violations": ("connection_id", "channel", "incarnation", "seq", "kind"),
        "channel_metrics": ("connection_id", "channel", "incarnation", "bucket_start_ns")}
OVERDUE_NS = 15_000_000  # rows are 1 ms apart: some open publishes are overdue, some not
BUCKET_SECONDS = 1
BUCKET_NS = BUCKET_SECONDS * 10**9


@pytest.fixture
def small_batches(spark):
    """Arrow batches of 7 rows: connections cross batch boundaries everywhere."""
    with conf_meanwhile(spark, "spark.sql.execution.arrow.maxRecordsPerBatch", "7"):
        yield


def run_pass(spark, frames: pa.Table, connections: pa.Table, overdue_ns: int, partitions: int, write_to: str,
             flush_records: int = 50_000, advance_every: int = 4096, file_rows: int | None = None):
    """The pass's tables, read back from the files it wrote into `write_to` (as a full run commits
    them), `file_rows` rows a file (None: wide_writes.FILE_ROWS)."""
    # combine_chunks: Spark 4.2 drops every chunk after an empty one of a chunked Arrow table.
    frames_df = spark.createDataFrame(frames.combine_chunks())
    summary = summarised_pass(connection_pass(
        frames_df, spark.createDataFrame(connections.combine_chunks()),
        Settings(BUCKET_SECONDS, overdue_ns, LAB_THRESHOLDS), frames_version=7, write_to=write_to,
        partitions=partitions, flush_records=flush_records, advance_every=advance_every, file_rows=file_rows), carried=False)
    written = {name: pa.concat_tables([table_schema.empty_table(), *[
        lake.TableWriter(write_to, name, table_schema).read_file(add.path, add.partition_values["date"])
        for add in summary.written.get(name, [])]]) for name, table_schema in WRITTEN_TABLES.items()}
    # Nothing in the folders but the files the summary names (a table's rows taken back left none behind).
    assert {name: sorted(add.path for add in summary.written.get(name, [])) for name in WRITTEN_TABLES} == {
        name: sorted(os.path.relpath(path, os.path.join(write_to, name))
                     for path in glob.glob(os.path.join(write_to, name, "*", "*.parquet")))
        for name in WRITTEN_TABLES}
    got = {name: written[name].sort_by([(k, "ascending") for k in KEYS[name]])
           for name in [*TIMELINE_TABLES, "channel_metrics"]}
    got["findings"] = finished(summary.raw_findings, frames, os.path.join(write_to, "findings step"))
    states = {row["connection_id"]: row for row in written[STATE_TABLE].to_pylist()}
    tally = {row["connection_id"]: row["frames"] for row in summary.tally.to_pylist()}
    assert summary.rows == {name: table.num_rows for name, table in got.items() if name != "findings"} | {
        STATE_TABLE: len(states), "raw_findings": len(got["findings"])}
    assert (summary.frames, summary.connections) == (sum(tally.values()), len(tally))
    known = [d for d in got["deliveries"].to_pylist() if d["message_identity"] is not None]
    assert summary.came_back == sum(1 for d in known if d["redelivered"] or (d["x_death_count"] or 0) > 0)
    redone = sorted(row["connection_id"] for row in summary.tally.to_pylist() if row["metrics_redo"] is not None)
    return got, states, tally, redone


def finished(raw: pa.Table, frames: pa.Table, lake_dir: str) -> list[dict]:
    """The pass's raw findings finished by the pipeline's findings step (findings.refresh_findings,
    as a full run calls it: the packets its evidence names found by its scan of `frames`), over a
    lake holding these frames; its findings table read back."""
    day = pc.cast(pc.cast(frames["ts_ns"], pa.timestamp("ns", tz="UTC")), pa.date32()).cast(pa.string())
    writer = lake.TableWriter(lake_dir, "frames", PACKET_FRAMES)
    writer.write(frames.select(list(PACKETS)).add_column(0, "date", day).cast(PACKET_FRAMES))
    writer.commit("test-frames")
    refresh_findings(lake_dir, raw, None, Changed(), LAB_THRESHOLDS, (), None)
    return lake.read_table(lake_dir, "findings", schema.FINDINGS).to_pylist()


def expected_outputs(frames: list[dict], connections: list[dict], overdue_ns: int) -> dict:
    """What the reference parts give, each connection alone: the timeline tables, channel_metrics
    and the findings about one connection."""
    by_connection = _by_connection(frames)
    rows_of = {c["connection_id"]: c for c in connections}
    records, findings = [], []
    for connection_id, rows in by_connection.items():
        mine = replay([{c: row.get(c) for c in INPUT_COLUMNS} for row in rows], overdue_ns)
        records += mine
        findings += detect_connection(mine, rows, rows_of.get(connection_id, {"connection_id": connection_id}),
                                      LAB_THRESHOLDS, packets_from(rows))
    expected = to_tables(records)
    expected["channel_metrics"] = metrics_table(channel_metrics(records, BUCKET_SECONDS)).sort_by(
        [(k, "ascending") for k in KEYS["channel_metrics"]])
    expected["findings"] = findings
    return expected


def assert_same_tables(got: dict, expected: dict, states: dict):
    """The pass's tables are the reference's, plus `provisional` (assert_provisional) and the
    deliveries' `requeue_related` (tests/test_detectors.py checks it)."""
    assert_same(got["findings"], expected["findings"])
    assert_provisional(got, states)
    got = {name: got[name].drop_columns([c for c in (PROVISIONAL, REQUEUE_RELATED) if c in got[name].column_names])
           for name in [*TIMELINE_TABLES, "channel_metrics"]}
    for name in [*TIMELINE_TABLES, "channel_metrics"]:
        assert got[name].schema == expected[name].schema, name
        if not got[name].equals(expected[name]):
            rows, want = got[name].to_pylist(), expected[name].to_pylist()
            assert len(rows) == len(want), (name, len(rows), len(want))
            for row, wanted in zip(rows, want):
                assert row == wanted, (name, {k: (row[k], wanted[k]) for k in row if row[k] != wanted[k]})


def assert_provisional(got: dict, states: dict):
    """Flagged provisional: exactly the rows of the checkpoint's provisional records (what was open
    when the data ended), and the channel_metrics buckets of the incarnations still open from the
    checkpoint's boundary bucket on; nothing of a connection without a checkpoint."""
    table_of = {record_type: name for name, record_type in RECORD_TYPES.items()}
    open_keys, live, boundary = {name: set() for name in TIMELINE_TABLES}, set(), {}
    for connection_id, state in states.items():
        if state["checkpoint"] is None:
            continue
        checkpoint = load(state["checkpoint"])
        boundary[connection_id] = checkpoint.boundary_ns
        for record in checkpoint.provisional:
            name = table_of[type(record)]
            open_keys[name].add((connection_id, *(getattr(record, k) for k in KEYS[name][1:])))
            if name == "channels":
                live.add((connection_id, record.channel, record.incarnation))
    for name in TIMELINE_TABLES:
        flagged = {tuple(row[k] for k in KEYS[name]) for row in got[name].to_pylist() if row[PROVISIONAL]}
        assert flagged == open_keys[name], name
        assert None not in got[name].column(PROVISIONAL).to_pylist(), name
    for row in got["channel_metrics"].to_pylist():
        where = (row["connection_id"], row["channel"], row["incarnation"])
        assert row[PROVISIONAL] == (where in live and row["bucket_start_ns"] >= boundary[row["connection_id"]]), row


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
# Twelve connections an example, not more: Hypothesis draws from a bounded buffer, and at 36 most
# attempts ran out of it (17 to 93 discarded per run, 0.3-0.8 s each), so the examples that got
# through were the smallest (the first, always: every connection the same few frames).
@settings(max_examples=4, deadline=None, suppress_health_check=list(HealthCheck),
          phases=[Phase.explicit, Phase.reuse, Phase.generate])
@given(data=st.data())
def test_the_pass_equals_the_reference_model_on_random_traffic(spark, small_batches, tmp_path_factory, data):
    """12 connections of random traffic (tests/variants.py's damage, flow control, uneven clocks)."""
    frames, connections = random_connections(data, 12)
    frames = [{c: row.get(c) for c in FRAME_COLUMNS} for row in frames]
    # Records leave in batches of 1 to 50,000: a connection's records cross many flushes; metric
    # buckets are let out after every row, every 7 rows or as in production.
    got, states, tally, _redo = run_pass(spark, pa.Table.from_pylist(frames, schema=INPUT_SCHEMA),
                                  connection_table(connections), OVERDUE_NS,
                                  partitions=data.draw(st.sampled_from([1, 3, 8]), label="partitions"),
                                  flush_records=data.draw(st.sampled_from([1, 3, 50_000]), label="flush"),
                                  advance_every=data.draw(st.sampled_from([1, 7, 4096]), label="advance"),
                                  file_rows=data.draw(st.sampled_from([2, None]), label="file rows"),
                                  write_to=tempfile.mkdtemp(dir=tmp_path_factory.getbasetemp()))
    assert_same_tables(got, expected_outputs(frames, connections, OVERDUE_NS), states)
    by_connection = _by_connection(frames)
    assert tally == {k: len(v) for k, v in by_connection.items()}
    assert_checkpoints(states, by_connection, OVERDUE_NS)


def test_the_pass_equals_the_reference_model_on_recorded_captures(spark, tmp_path, corpus_dir):
    """Every example and every capture of the public corpus, in one run, as a full run makes it."""
    captures = sorted(glob.glob(os.path.join(ROOT, "examples", "*.pcapng")))
    captures += sorted(p for p in glob.glob(os.path.join(corpus_dir, "**", "*"), recursive=True)
                       if p.endswith((".pcap", ".pcapng")))
    for capture in captures:
        ingest_file(capture, str(tmp_path))
    frames = lake.read_table(str(tmp_path), "frames", schema.FRAMES).select(FRAME_COLUMNS)
    connections = lake.read_table(str(tmp_path), "connections", schema.CONNECTIONS)
    got, states, tally, _redo = run_pass(spark, frames, connections, 60 * 10**9, partitions=4, flush_records=5,
                                         advance_every=3, write_to=str(tmp_path / "written"))
    assert_same_tables(got, expected_outputs(frames.to_pylist(), connections.to_pylist(), 60 * 10**9), states)
    by_connection = _by_connection(frames.to_pylist())
    assert tally == {k: len(v) for k, v in by_connection.items()}
    assert_checkpoints(states, by_connection, 60 * 10**9)


def connection_table(rows: list[dict]) -> pa.Table:
    return dicts_to_table(rows, schema.CONNECTIONS, schema.CONNECTION_TIMESTAMPS, schema.CONNECTION_DATE_FROM)


@pytest.mark.parametrize("file_rows", [3, None], ids=["many files", "rows pending"])
def test_frame_times_going_back_make_the_metrics_of_that_connection_computed_again(spark, tmp_path, file_rows):
    """A capture whose clock steps back (merged captures): the streamed metric rows of the buckets
    already out would be wrong, so that connection's channel_metrics are computed again in its task
    from all its records (read back from the files it wrote, or not yet written), its streamed rows
    taken back out; the other connections keep theirs."""
    for capture in sorted(glob.glob(os.path.join(ROOT, "examples", "*.pcapng")))[:4]:
        ingest_file(capture, str(tmp_path))
    frames = lake.read_table(str(tmp_path), "frames", schema.FRAMES).select(FRAME_COLUMNS).to_pylist()
    by_connection = _by_connection(frames)
    stepped = max(by_connection, key=lambda k: len(by_connection[k]))
    rows = by_connection[stepped]
    half = len(rows) // 2
    back = {row["seq"] for row in rows[half:]}
    frames = [dict(row, ts_ns=row["ts_ns"] - 30 * BUCKET_NS) if row["connection_id"] == stepped and row["seq"] in back
              else row for row in frames]
    connections = lake.read_table(str(tmp_path), "connections", schema.CONNECTIONS)
    got, states, _tally, redo = run_pass(spark, pa.Table.from_pylist(frames, schema=INPUT_SCHEMA), connections,
                                         60 * 10**9, partitions=2, advance_every=1, flush_records=5,
                                         file_rows=file_rows, write_to=str(tmp_path / "written"))
    assert redo == [stepped]
    assert_same_tables(got, expected_outputs(frames, connections.to_pylist(), 60 * 10**9), states)


def test_the_pass_hands_python_arrow_batches_bounded_by_rows_only_and_gives_the_byte_bound_back(spark):
    """Under a byte bound Spark sizes each Arrow batch for Python after every row (a third of the
    JVM's time in the pass): the pass lifts it meanwhile (plans.arrow_batches_by_rows), so batches
    are cut by rows alone, and the session's bound holds again afterwards, even after a failure."""
    key = "spark.sql.execution.arrow.maxBytesPerBatch"

    def batch_sizes(batches):
        yield pa.RecordBatch.from_pydict({"rows": [len(batch) for batch in batches]})

    def sizes(df):
        return sorted(row.rows for row in df.mapInArrow(batch_sizes, "rows long").collect())

    rows = spark.range(0, 300, numPartitions=1).selectExpr("id", "repeat('x', 100) AS text")   # ~30 KB
    with conf_meanwhile(spark, key, "4k"):
        bounded = sizes(rows)
        assert sum(bounded) == 300 and max(bounded) < 300   # the 4 KB bound cuts batches of ~30 rows
        with arrow_batches_by_rows(spark):
            assert sizes(rows) == [300]                      # one batch: maxRecordsPerBatch is 10,000
        assert spark.conf.get(key) == "4k" and sizes(rows) == bounded
        with pytest.raises(RuntimeError), arrow_batches_by_rows(spark):
            raise RuntimeError("a failed pass")
        assert spark.conf.get(key) == "4k"
