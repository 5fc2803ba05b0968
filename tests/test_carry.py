"""Carrying a connection's timeline across runs (analyzer/timeline/carry.py), without Spark: a
connection fed in pieces, its checkpoint stored as bytes and read back between them, patching the
stored rows as an incremental run does (delete the last run's provisional rows, write the new ones),
must end with exactly the records of one replay over all its frames. Random traffic of every
variant the Spark tests use (valid, reordered, mid-stream, gaps, bad acks, transactions) and the
recorded examples; cut anywhere, including inside open channels."""

import glob
import os
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from analyzer import lake, schema
from analyzer.ingest import ingest_file
from analyzer.timeline import INPUT_COLUMNS, replay
from analyzer.timeline import records as r
from analyzer.timeline.carry import Checkpoint, StateError, continue_connection, dump, load

from .conftest import ROOT
from .variants import VARIANTS
from .test_timeline import renumbered, valid_traffic

BUCKET_NS = 10_000_000  # rows are 1 ms apart: a bucket of 10 rows, so runs cut buckets
KEY = {r.Delivery: ("seq",), r.Publish: ("seq",), r.ChannelFacts: ("channel", "incarnation"),
       r.Violation: ("channel", "incarnation", "seq", "kind")}


def _key(x):
    return (type(x).__name__, *[getattr(x, k) for k in KEY[type(x)]])


def carried_in_pieces(rows: list[dict], cuts: list[int], bucket_ns: int = BUCKET_NS):
    """The stored records after one run per piece, and the runs that had to fall back (None: all carried)."""
    stored, checkpoint, fallbacks, ended = {}, None, [], False
    for start, stop in zip([0, *cuts], [*cuts, len(rows)]):
        piece = rows[start:stop]
        if not piece:
            continue
        done = None if ended else continue_connection(checkpoint, piece, bucket_ns)
        if done is None or done.fallback:
            fallbacks.append(done.fallback if done is not None else "ended")
            # What a fallback run does (and the run after the connection ended): the connection from
            # its start, replayed whole.
            done = continue_connection(None, rows[:stop], bucket_ns)
            assert done.fallback is None
            stored = {}
        for x in done.stale:
            del stored[_key(x)]
        for x in done.rows:
            assert _key(x) not in stored, x
            stored[_key(x)] = x
        # An ended connection keeps no checkpoint: its records are final, as a whole analysis has them.
        ended = done.checkpoint is None
        checkpoint = None if ended else load(dump(done.checkpoint))
    return stored, fallbacks


def replayed(rows):
    return {_key(x): x for x in replay(rows)}


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_a_connection_carried_across_runs_ends_with_the_records_of_one_replay(data):
    variant = data.draw(st.sampled_from(sorted(VARIANTS)), label="variant")
    traffic = valid_traffic(data, transactions=data.draw(st.booleans()))
    connection_id = "10.0.0.1:40000>10.0.0.2:5672@1"
    rows = [dict(row, connection_id=connection_id) for row in traffic.conv.rows]
    if VARIANTS[variant] is not None:
        rows = [dict(row, connection_id=connection_id) for row in VARIANTS[variant](data, rows)]
    rows = [{c: row.get(c) for c in INPUT_COLUMNS} for row in renumbered(rows)]
    cuts = sorted(data.draw(st.lists(st.integers(1, len(rows)), max_size=6), label="cuts"))
    stored, _ = carried_in_pieces(rows, cuts)
    assert stored == replayed(rows)


def test_recorded_captures_carried_in_ten_runs(tmp_path):
    for capture in sorted(glob.glob(os.path.join(ROOT, "examples", "*.pcapng"))):
        ingest_file(capture, str(tmp_path))
    frames = lake.read_table(str(tmp_path), "frames", schema.FRAMES).select(INPUT_COLUMNS)
    frames = frames.sort_by([("connection_id", "ascending"), ("seq", "ascending")]).to_pylist()
    by_connection = {}
    for row in frames:
        by_connection.setdefault(row["connection_id"], []).append(row)
    carried = 0
    for rows in by_connection.values():
        cuts = [len(rows) * k // 10 for k in range(1, 10)]
        stored, fallbacks = carried_in_pieces(rows, cuts, bucket_ns=10**9)
        assert stored == replayed(rows)
        carried += not fallbacks
    assert carried >= len(by_connection) // 2, (carried, len(by_connection))


def test_new_frames_not_after_the_last_analysed_seq_fall_back():
    rows = renumbered([{"connection_id": "c", "agent_id": "a", "direction": "to_broker", "channel": 1,
                        "method": "channel.open"}] * 3)
    done = continue_connection(None, rows[:2], BUCKET_NS)
    again = continue_connection(load(dump(done.checkpoint)), rows[1:], BUCKET_NS)
    assert again.fallback and "not after the last analysed seq" in again.fallback


def test_a_damaged_or_forged_checkpoint_is_refused_with_its_reason():
    done = continue_connection(None, renumbered(
        [{"connection_id": "c", "direction": "to_broker", "channel": 1, "method": "channel.open"}]), BUCKET_NS)
    good = dump(done.checkpoint)
    assert isinstance(load(good), Checkpoint)
    with pytest.raises(StateError, match="not a checkpoint"):
        load(good[: len(good) // 2])
    doc = json.loads(good)
    with pytest.raises(StateError, match="version"):
        load(json.dumps(dict(doc, version=doc["version"] + 1)).encode())
    with pytest.raises(StateError, match="provisional: .* is not a \\['T', ...\\] value"):
        load(json.dumps(dict(doc, provisional=["L", [1]])).encode())
