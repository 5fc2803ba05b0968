"""bench/frames_generator.py at small scale: the synthetic lake the analysis benchmark times must be
valid AMQP traffic in the agent's exact table format, and the reference model must derive from it
the outcomes the generator says it made."""

import dataclasses
import importlib.util
import os
import sys
from collections import Counter

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from analyzer import lake, schema
from analyzer.timeline import replay_frames
from spark_jobs.requeue_related import REQUEUE_RELATED, with_flags

from .conftest import ROOT

# bench/ is scripts, not a package: load the module from its file.
_spec = importlib.util.spec_from_file_location("bench_frames_generator",
                                               os.path.join(ROOT, "bench", "frames_generator.py"))
gen = sys.modules.setdefault("bench_frames_generator", importlib.util.module_from_spec(_spec))
_spec.loader.exec_module(gen)

# Small, but with every incarnation kind, a connection still open at the end and a consumer closed
# with deliveries unacked (asserted below, so a change of plan cannot quietly lose them).
PARAMS = gen.Params(frames=30_000, hot_deliveries=4_000, seed=3, connections=12, duration_s=900)


@pytest.fixture(scope="module")
def generated():
    frames, stats = gen.frames_table(PARAMS)
    return frames, stats, replay_frames(frames)


def test_rows_are_frames_rows(generated):
    frames, stats, _ = generated
    assert frames.schema == schema.FRAMES
    assert stats["frames"] == frames.num_rows
    assert abs(frames.num_rows - PARAMS.frames) < 0.05 * PARAMS.frames
    assert frames.num_rows == sum(stats["methods"].values())
    # The window crosses midnight UTC: both date partitions, each row's date from its ts.
    assert set(frames["date"].to_pylist()) == {"2026-03-14", "2026-03-15"}
    assert frames["date"].equals(pc.strftime(frames["ts"], "%Y-%m-%d"))
    assert pc.all(pc.equal(pc.cast(frames["ts"], pa.int64()), pc.divide(frames["ts_ns"], 1000))).as_py()
    for column in ("connection_id", "seq", "ts_ns", "direction", "channel", "method", "agent_id", "source"):
        assert frames[column].null_count == 0, column
    assert set(frames["direction"].to_pylist()) == {"to_broker", "to_client"}
    # Everything inside the capture window (a connection running past it would make open publishes overdue).
    t0 = gen.Generator(PARAMS).t0_ns
    assert t0 <= pc.min(frames["ts_ns"]).as_py() and pc.max(frames["ts_ns"]).as_py() <= t0 + PARAMS.duration_s * gen.S


def test_seq_and_time_per_connection(generated):
    frames = generated[0]
    ids = frames["connection_id"].to_numpy(zero_copy_only=False)
    seq, ts = frames["seq"].to_numpy(), frames["ts_ns"].to_numpy()
    for cid in np.unique(ids):
        mine = ids == cid
        assert (seq[mine] == np.arange(1, mine.sum() + 1)).all(), cid
        assert (np.diff(ts[mine]) >= 0).all(), cid
    assert len(np.unique(ids)) == PARAMS.connections + 1


def test_directions_of_methods(generated):
    frames = generated[0]
    pairs = Counter(zip(frames["method"].to_pylist(), frames["direction"].to_pylist()))
    to_client = {"basic.deliver", "basic.get-ok", "basic.get-empty", "basic.return", "basic.consume-ok",
                 "channel.open-ok", "confirm.select-ok", "basic.qos-ok", "connection.start", "connection.tune"}
    to_broker = {"basic.publish", "basic.get", "basic.consume", "basic.qos", "confirm.select", "channel.open",
                 "basic.reject", "connection.start-ok", "connection.tune-ok", "amqp.protocol-header"}
    for (method, direction) in pairs:
        if method in to_client:
            assert direction == "to_client", method
        if method in to_broker:
            assert direction == "to_broker", method


def test_reference_model_finds_no_violation_and_the_planned_outcomes(generated):
    frames, stats, out = generated
    assert out["violations"].num_rows == 0
    deliveries, publishes, channels = out["deliveries"], out["publishes"], out["channels"]
    assert dict(Counter(deliveries["outcome"].to_pylist())) == stats["deliveries"]
    assert dict(Counter(publishes["outcome"].to_pylist())) == {k: v for k, v in stats["publishes"].items() if v}
    assert set(stats["deliveries"]) <= {"ack", "nack", "reject", "auto", "channel_closed", "open"}
    assert set(stats["publishes"]) <= {"acked", "nacked", "open", "untracked"}
    assert pc.sum(deliveries["redelivered"]).as_py() == stats["redeliveries"]
    assert pc.sum(publishes["out_of_order"]).as_py() == stats["out_of_order_confirms"]
    assert publishes["return_seq"].null_count == publishes.num_rows - stats["returns"]
    assert channels.num_rows == stats["incarnations"]
    assert sum(stats["kinds"].values()) == stats["incarnations"]
    # Every kind made it in, and the ends that leave things open or closed with unacked deliveries.
    assert set(stats["kinds"]) == set(gen.KINDS) | {"hot"}
    assert stats["deliveries"].get("channel_closed") and stats["deliveries"].get("open")
    assert stats["publishes"].get("open") and stats["publishes"].get("nacked")
    assert stats["redeliveries"] and stats["returns"] and stats["out_of_order_confirms"] and stats["republishes"]
    assert set(channels["ended_by"].to_pylist()) == {"channel.close", "end_of_data"}
    assert channels.filter(pc.equal(channels["closed_by"], "broker"))["close_code"].to_pylist() == \
        [404] * stats["kinds"]["failed_declare"]


def test_delivery_tags_and_the_hot_channel(generated):
    _, stats, out = generated
    deliveries, channels = out["deliveries"], out["channels"]
    by_life = {}
    for row in deliveries.select(["connection_id", "channel", "incarnation", "seq", "delivery_tag"]).to_pylist():
        by_life.setdefault((row["connection_id"], row["channel"], row["incarnation"]), []).append(
            (row["seq"], row["delivery_tag"]))
    for life, rows in by_life.items():
        assert [tag for _, tag in sorted(rows)] == list(range(1, len(rows) + 1)), life
    hot = [len(rows) for (cid, ch, _), rows in by_life.items()
           if cid == stats["hot_connection_id"] and ch == stats["hot_channel"]]
    assert hot == [PARAMS.hot_deliveries] == [max(len(rows) for rows in by_life.values())]
    # Deliveries never exceed the prefetch the channel asked for.
    limited = channels.filter(pc.greater(channels["consumer_prefetch"], 0))
    assert limited.num_rows and pc.all(pc.less_equal(limited["peak_unacked"], limited["consumer_prefetch"])).as_py()


def test_a_quiet_lake_has_nothing_the_message_kinds_read():
    """--quiet (bench/README: an incremental run on a lake without requeues): the same traffic,
    but no delivery bounced, redelivered, dead-lettered before or left at a channel's close: none
    the message kinds read (requeue_related.with_flags)."""
    frames, stats = gen.frames_table(dataclasses.replace(PARAMS, quiet=True))
    deliveries = replay_frames(frames)["deliveries"]
    assert deliveries.num_rows > PARAMS.hot_deliveries and stats["deliveries"]["ack"]
    assert pc.sum(deliveries["redelivered"]).as_py() == 0 == stats["redeliveries"]
    assert not pc.any(pc.fill_null(frames["requeue"], False)).as_py()
    assert "channel_closed" not in stats["deliveries"] and "channel_closed" not in deliveries["outcome"].to_pylist()
    assert not {"nack", "reject"} & set(deliveries["outcome"].to_pylist())
    assert pc.max(deliveries["x_death_count"]).as_py() in (None, 0)
    assert not pc.any(with_flags(deliveries)[REQUEUE_RELATED]).as_py()


def test_same_seed_same_data_other_seed_other_data():
    small = gen.Params(frames=5_000, hot_deliveries=1_000, seed=5, duration_s=300)
    a, _ = gen.frames_table(small)
    b, _ = gen.frames_table(small)
    c, _ = gen.frames_table(gen.Params(frames=5_000, hot_deliveries=1_000, seed=6, duration_s=300))
    assert a.equals(b)
    assert not a.equals(c)


def test_written_lake_reads_back(tmp_path):
    params = gen.Params(frames=8_000, hot_deliveries=1_500, seed=2, connections=6, duration_s=600, commits=3)
    stats = gen.write_lake(str(tmp_path), params)
    frames = lake.read_table(str(tmp_path), "frames", schema.FRAMES)
    connections = lake.read_table(str(tmp_path), "connections", schema.CONNECTIONS)
    assert frames.num_rows == stats["frames"]
    assert connections.num_rows == stats["connections"] == params.connections + 1
    assert lake.open_table(str(tmp_path), "frames").version() == params.commits   # version 0 creates it
    assert set(lake.open_table(str(tmp_path), "frames").metadata().partition_columns) == {"date"}
    assert sorted(set(connections["connection_id"].to_pylist())) == sorted(set(frames["connection_id"].to_pylist()))
    assert stats["bytes_on_disk"]["frames"] > 0
    direct, _ = gen.frames_table(params)
    key = [("connection_id", "ascending"), ("seq", "ascending")]
    assert frames.sort_by(key).equals(direct.sort_by(key))


def test_slicing_does_not_change_rows(monkeypatch):
    small = gen.Params(frames=5_000, hot_deliveries=2_000, seed=4, duration_s=300)
    whole, _ = gen.frames_table(small)
    monkeypatch.setattr(gen, "SLICE_ROWS", 777)
    sliced, _ = gen.frames_table(small)
    assert sliced.equals(whole)
