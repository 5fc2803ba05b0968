"""The Spark timeline job (spark_jobs.timeline) against the reference state machine
(analyzer.timeline): the same frames must give the same four tables, row for row and type for type.

Random traffic comes from tests/test_timeline.py's generator: valid connections, the same with
acks and confirms the capture shows before their frame, mid-stream starts, bytes lost in one
direction, and invalid acks and confirms thrown in. Each Spark run takes many connections at once
(a Spark job costs seconds whatever its size). Valid traffic without transactions or
basic.recover must take the vectorised path: the reference fallback is for the rest.
"""

import glob
import os

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from analyzer import lake, schema
from analyzer.ingest import ingest_file
from analyzer.timeline import INPUT_COLUMNS, replay, replay_frames, to_tables
from spark_jobs.timeline import blocks, routed_timelines
from spark_jobs.timeline.incarnations import MAX_TAG_STEP
from spark_jobs.timeline.tables import TIMELINE_TABLES

from .conftest import ROOT
from .test_timeline import Conv, _swappable, renumbered, valid_traffic

INPUT_SCHEMA = pa.schema([schema.FRAMES.field(name) for name in INPUT_COLUMNS])
KEYS = {"deliveries": ("connection_id", "channel", "incarnation", "seq"),
        "publishes": ("connection_id", "channel", "incarnation", "seq"),
        "channels": ("connection_id", "channel", "incarnation"),
        "violations": ("connection_id", "channel", "incarnation", "seq", "kind")}
OVERDUE_NS = 15_000_000  # rows are 1 ms apart: some open publishes are overdue, some not
NOT_VECTORISED = ("tx.", "basic.recover")


def spark_tables(spark, frames: pa.Table, overdue_ns: int):
    # combine_chunks: Spark 4.2 drops every chunk after an empty one of a chunked Arrow table.
    tables, irregular = routed_timelines(spark.createDataFrame(frames.combine_chunks()), overdue_ns)
    got = {name: df.toArrow().sort_by([(k, "ascending") for k in KEYS[name]]) for name, df in tables.items()}
    return got, {row.connection_id for row in irregular.collect()}


def assert_same_tables(got: dict, expected: dict):
    for name in TIMELINE_TABLES:
        assert got[name].schema == expected[name].schema, name
        if not got[name].equals(expected[name]):
            rows, want = got[name].to_pylist(), expected[name].to_pylist()
            assert len(rows) == len(want), (name, len(rows), len(want))
            for row, wanted in zip(rows, want):
                assert row == wanted, (name, {k: (row[k], wanted[k]) for k in row if row[k] != wanted[k]})


# -- transformations of one connection's rows ---------------------------------------------------------

def swapped(data, rows):
    rows, i = list(rows), 0
    while i < len(rows) - 1:
        if _swappable(rows[i], rows[i + 1]) and data.draw(st.booleans()):
            rows[i], rows[i + 1] = rows[i + 1], rows[i]
            i += 1
        i += 1
    return rows


def mid_stream(data, rows):
    cut = data.draw(st.integers(1, len(rows)), label="cut")
    head = [{"connection_id": rows[0]["connection_id"], "direction": d, "channel": 0, "method": "capture.midstream"}
            for d in ("to_client", "to_broker")]
    return head + rows[cut:]


def with_gap(data, rows):
    direction = data.draw(st.sampled_from(["to_broker", "to_client"]))
    start = data.draw(st.integers(1, len(rows)))
    kept = [row for i, row in enumerate(rows) if not (start <= i < start + 6 and row["direction"] == direction)]
    kept.insert(min(start, len(kept)), {"connection_id": rows[0]["connection_id"], "direction": direction,
                                        "channel": 0, "method": "capture.gap", "gap_bytes": 100})
    return kept


def with_bad_acks(data, rows):
    """Acks and confirms naming random tags on random channels, anywhere."""
    rows = list(rows)
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(1, len(rows)))
        to_broker = data.draw(st.booleans())
        rows.insert(at, {"connection_id": rows[0]["connection_id"], "agent_id": "test",
                         "direction": "to_broker" if to_broker else "to_client", "channel": data.draw(st.integers(1, 3)),
                         "method": data.draw(st.sampled_from(["basic.ack", "basic.nack", "basic.reject"]
                                                             if to_broker else ["basic.ack", "basic.nack"])),
                         "delivery_tag": data.draw(st.integers(0, 8)), "multiple": data.draw(st.booleans()),
                         "requeue": data.draw(st.booleans())})
    return rows


VARIANTS = {"valid": None, "swapped": swapped, "mid_stream": mid_stream, "gap": with_gap, "bad_acks": with_bad_acks}


# No shrinking: each example is a Spark run of many connections; a failure names its rows anyway.
# Running values are computed in blocks of seq (spark_jobs/timeline/blocks.py): with blocks of 5
# seqs, every channel's values cross many block boundaries.
@pytest.mark.parametrize("block_seqs", [blocks.BLOCK_SEQS, 5])
@settings(max_examples=2, deadline=None, suppress_health_check=list(HealthCheck),
          phases=[Phase.explicit, Phase.reuse, Phase.generate])
@given(data=st.data())
def test_spark_timelines_equal_the_reference_model_on_random_traffic(spark, monkeypatch, block_seqs, data):
    monkeypatch.setattr(blocks, "BLOCK_SEQS", block_seqs)
    rows, plain = [], set()
    for i in range(36):
        variant = data.draw(st.sampled_from(sorted(VARIANTS)), label="variant")
        traffic = valid_traffic(data, transactions=data.draw(st.booleans()))
        connection_id = f"10.0.0.1:{40000 + i}>10.0.0.2:5672@{i}"
        conn = [dict(row, connection_id=connection_id) for row in traffic.conv.rows]
        if VARIANTS[variant] is not None:
            conn = [dict(row, connection_id=connection_id) for row in VARIANTS[variant](data, conn)]
        conn = renumbered(conn)
        if variant == "valid" and not any(row["method"].startswith(NOT_VECTORISED) for row in conn):
            plain.add(connection_id)
        rows += conn
    rows = [dict(row, agent_id=row.get("agent_id", "test")) for row in rows]
    expected = to_tables(replay(rows, OVERDUE_NS))
    got, irregular = spark_tables(spark, pa.Table.from_pylist(rows, schema=INPUT_SCHEMA), OVERDUE_NS)
    assert_same_tables(got, expected)
    # Valid traffic without transactions or basic.recover is what the vectorised path is for.
    assert not plain & irregular, sorted(plain & irregular)


def test_delivery_tags_that_jump_take_the_reference_model(spark):
    """Tags jumping by more than MAX_TAG_STEP mean deliveries the data lacks; the vectorised path
    would also spell out every number a multiple ack reaches. Such a connection is replayed by the
    reference model; its neighbour, with the same frames and tags 1, 2, 3, stays vectorised."""
    jumpy, plain = Conv("10.0.0.1:40001>10.0.0.2:5672@1"), Conv("10.0.0.1:40002>10.0.0.2:5672@1")
    for conv, step in ((jumpy, MAX_TAG_STEP + 1), (plain, 1)):
        conv.open(1)
        conv.consume(1)
        for n in range(3):
            conv.deliver(1, 1 + n * step)
        conv.ack(1, 1 + 2 * step, multiple=True)
        conv.deliver(1, 1 + 3 * step)
    rows = jumpy.rows + plain.rows
    got, irregular = spark_tables(spark, pa.Table.from_pylist(rows, schema=INPUT_SCHEMA), OVERDUE_NS)
    assert_same_tables(got, to_tables(replay(rows, OVERDUE_NS)))
    assert irregular == {jumpy.id}
    assert [d["outcome"] for d in got["deliveries"].to_pylist() if d["connection_id"] == jumpy.id] == \
        ["ack", "ack", "ack", "open"]


def test_spark_timelines_equal_the_reference_model_on_recorded_captures(spark, tmp_path, corpus_dir):
    """Every example and every capture of the public corpus, in one run."""
    captures = sorted(glob.glob(os.path.join(ROOT, "examples", "*.pcapng")))
    captures += sorted(p for p in glob.glob(os.path.join(corpus_dir, "**", "*"), recursive=True)
                       if p.endswith((".pcap", ".pcapng")))
    for capture in captures:
        ingest_file(capture, str(tmp_path))
    frames = lake.read_table(str(tmp_path), "frames", schema.FRAMES)
    expected = replay_frames(frames)
    got, irregular = spark_tables(spark, frames, 60 * 10**9)
    assert_same_tables(got, expected)
    connections = set(frames.column("connection_id").to_pylist())
    assert len(irregular) < len(connections) / 2, (len(irregular), len(connections))
