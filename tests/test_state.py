"""The state machine's state as data (analyzer/timeline/state.py): every state the machine reaches
on random traffic and on the recorded captures survives the round trip and carries on exactly;
anything but a checkpoint this code wrote is refused with its reason and without side effects."""

import glob
import json
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from analyzer import lake, schema
from analyzer.detectors import ConnectionDetectors
from analyzer.detectors.state import to_state as detectors_to_state
from analyzer.ingest import ingest_file
from analyzer.timeline import INPUT_COLUMNS, state
from analyzer.timeline.carry import Checkpoint, continue_connection, dump, load
from analyzer.timeline.channel import ChannelLife
from analyzer.timeline.connection import ConnectionTimeline
from analyzer.timeline.consumer import ConsumerSide
from analyzer.timeline.publisher import PublisherSide
from analyzer.timeline.state import StateError

from analyzer.detectors.thresholds import Thresholds

from .conftest import ROOT
from .variants import VARIANTS
from .test_timeline import renumbered, valid_traffic

BUCKET_NS = 10_000_000
# The shape of version STATE_VERSION. A change to a state class's fields must bump the version
# (old checkpoints are then analysed whole once, not misread) and update this line.
SHAPE = {2: "7415487ac8",  # 2: same classes, the checkpoint has the detectors' state too
         3: "ce9ce32166"}  # 3: an incarnation's consumer and publisher sides are objects of their own
STATE_CLASSES = (ConnectionTimeline, ChannelLife, ConsumerSide, PublisherSide)


def shape_digest(fields: dict) -> str:
    """A digest of a state vocabulary's classes and their stored fields (tests/test_detector_state.py too)."""
    import hashlib
    text = ";".join(f"{cls.__name__}:{','.join(names)}" for cls, names in fields.items())
    return hashlib.sha256(text.encode()).hexdigest()[:10]


def test_the_version_names_the_shape():
    assert SHAPE.get(state.STATE_VERSION) == shape_digest(state.FIELDS), \
        "the state's fields changed: bump state.STATE_VERSION and record the new shape here"


def test_slotted_state_classes_store_every_slot():
    """The encoder cannot see a slot FIELDS forgets (it reads no __slots__, so that a compiled
    build runs the same code): this does."""
    for cls, names in state.FIELDS.items():
        if "__slots__" in vars(cls):
            assert tuple(cls.__slots__) == tuple(names) + state.NOT_STORED.get(cls, ()), cls.__name__


def checkpoint_after(rows: list[dict]) -> Checkpoint:
    """The checkpoint after `rows`; once the connection has ended (no checkpoint is kept then), its
    state alone as one: every state the machine reaches must round-trip."""
    done = continue_connection(None, rows, BUCKET_NS)
    assert done.fallback is None
    if done.checkpoint is not None:
        return done.checkpoint
    timeline = ConnectionTimeline(rows[0]["connection_id"], rows[0].get("agent_id"), lambda record: None)
    for row in rows:
        timeline.feed(row)
    timeline.emit = None
    return Checkpoint(timeline)


def _rows(data):
    variant = data.draw(st.sampled_from(sorted(VARIANTS)), label="variant")
    traffic = valid_traffic(data, transactions=data.draw(st.booleans()))
    rows = [dict(row, connection_id="c1") for row in traffic.conv.rows]
    if VARIANTS[variant] is not None:
        rows = [dict(row, connection_id="c1") for row in VARIANTS[variant](data, rows)]
    return [{c: row.get(c) for c in INPUT_COLUMNS} for row in renumbered(rows)]


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_any_state_round_trips_and_goes_on_as_the_original(data):
    rows = _rows(data)
    cut = data.draw(st.integers(1, len(rows)), label="cut")
    stored = dump(checkpoint_after(rows[:cut]))
    assert dump(load(stored)) == stored  # nothing lost or added by reading it back
    again = checkpoint_after(rows[:cut])  # an untouched twin of the original
    resumed = continue_connection(load(stored), rows[cut:], BUCKET_NS) if cut < len(rows) else None
    twin = continue_connection(again, rows[cut:], BUCKET_NS) if cut < len(rows) else None
    if resumed is not None:
        assert (resumed.fallback, resumed.rows, resumed.stale) == (twin.fallback, twin.rows, twin.stale)


def test_shared_objects_stay_shared():
    """A mandatory confirm-mode publish waits for its confirm and for a return at once: one object."""
    rows = renumbered([
        {"connection_id": "c", "direction": "to_broker", "channel": 1, "method": "channel.open"},
        {"connection_id": "c", "direction": "to_client", "channel": 1, "method": "channel.open-ok"},
        {"connection_id": "c", "direction": "to_broker", "channel": 1, "method": "confirm.select"},
        {"connection_id": "c", "direction": "to_client", "channel": 1, "method": "confirm.select-ok"},
        {"connection_id": "c", "direction": "to_broker", "channel": 1, "method": "basic.publish",
         "mandatory": True, "exchange": "x", "routing_key": "k"}])
    life = load(dump(checkpoint_after(rows))).timeline.lives[1]
    (waiting,) = life.publisher.pending.values()
    assert [waiting] == list(life.publisher.awaiting_return.values()) and life.connection.lives[1] is life
    assert life.publisher.life is life and life.consumer.life is life


def test_a_frame_row_is_written_with_every_column_the_machine_reads_and_read_only_so():
    """A stored frame row lacking a column would read as null there, a value the writer never wrote
    (a forged checkpoint dropping a publish row's message_id took it from the records): the writer
    writes every column the timelines read (null where the machine's row lacked it) and the reader
    refuses a row without one."""
    rows = renumbered([
        {"connection_id": "c", "direction": "to_broker", "channel": 1, "method": "channel.open"},
        {"connection_id": "c", "direction": "to_client", "channel": 1, "method": "channel.open-ok"},
        {"connection_id": "c", "direction": "to_broker", "channel": 1, "method": "confirm.select"},
        {"connection_id": "c", "direction": "to_client", "channel": 1, "method": "confirm.select-ok"},
        {"connection_id": "c", "direction": "to_broker", "channel": 1, "method": "basic.publish",
         "exchange": "x", "routing_key": "k", "message_id": "p1"}])
    doc = json.loads(dump(checkpoint_after(rows)))
    stored = [fields["row"][1] for name, fields in doc["objects"] if name == "_Publish"]
    assert [set(row) >= set(INPUT_COLUMNS) for row in stored] == [True] and stored[0]["message_id"] == "p1"
    assert load(json.dumps(doc).encode()).timeline.lives[1].publisher.pending
    for name, fields in doc["objects"]:
        if name == "_Publish":
            del fields["row"][1]["message_id"]
    with pytest.raises(StateError, match="message_id"):
        load(json.dumps(doc).encode())


def test_recorded_captures_round_trip(tmp_path):
    for capture in sorted(glob.glob(os.path.join(ROOT, "examples", "*.pcapng"))):
        ingest_file(capture, str(tmp_path))
    frames = lake.read_table(str(tmp_path), "frames", schema.FRAMES).select(INPUT_COLUMNS)
    by_connection = {}
    for row in frames.sort_by([("connection_id", "ascending"), ("seq", "ascending")]).to_pylist():
        by_connection.setdefault(row["connection_id"], []).append(row)
    for rows in by_connection.values():
        stored = dump(checkpoint_after(rows))
        assert dump(load(stored)) == stored


def _checkpoint() -> dict:
    rows = renumbered([{"connection_id": "c", "direction": "to_broker", "channel": 1, "method": "channel.open"},
                       {"connection_id": "c", "direction": "to_client", "channel": 1, "method": "channel.open-ok"}])
    return json.loads(dump(checkpoint_after(rows)))


def _forged(doc) -> bytes:
    return json.dumps(doc).encode()


@pytest.mark.parametrize("damage, reason", [
    (lambda d: d.update(objects=[["Path", {}]]), "is not \\[state class, fields\\]"),
    (lambda d: d["objects"][0][1].update(__class__=["M", {}]), "has fields"),
    (lambda d: d["objects"][2][1].pop("outstanding"), "has fields"),
    (lambda d: d.update(timeline=["O", 99]), "timeline: .* is not an object reference"),
    (lambda d: d.update(boundary=["T", [["R", "Delivery", [1, 2]]]]), "record Delivery has 2 fields"),
    (lambda d: d.update(boundary=["X", []]), "boundary: .* is not a \\['T', ...\\] value"),
    (lambda d: d.update(boundary={"__reduce__": 1}), "boundary: .* is not a \\['T', ...\\] value"),
    (lambda d: d.update(timeline=["O", 1]), "object 1 is a ChannelLife, not a ConnectionTimeline"),
    (lambda d: d.update(version=0), "version 0"),
    (lambda d: d.update(version=2), "version 2"),  # before the incarnation's sides were objects
    (lambda d: d.update(format="pickle"), "not a checkpoint"),
    (lambda d: d.update(extra=1), "checkpoint fields"),
])
def test_forged_checkpoints_are_refused_without_side_effects(damage, reason):
    doc = _checkpoint()
    damage(doc)
    before = {cls: dict(vars(cls)) for cls in STATE_CLASSES}
    with pytest.raises(StateError, match=reason):
        load(_forged(doc))
    assert {cls: dict(vars(cls)) for cls in STATE_CLASSES} == before


def test_deep_nesting_and_garbage_are_refused():
    head = json.dumps(dict(_checkpoint(), boundary="HERE"))
    deep = head.replace('"HERE"', '["L",[' * 100_000 + ']]' * 100_000)  # json.dumps would recurse too deep
    with pytest.raises(StateError, match="nested too deeply|not a checkpoint"):
        load(deep.encode())
    for garbage in (b"", b"\x80\x04K\x01.", b"[]", b'{"format": 1}'):
        with pytest.raises(StateError):
            load(garbage)


def test_a_state_with_an_undeclared_field_is_not_written():
    """The timeline's state classes are slotted (they cannot gain a field); the encoder refuses an
    object of a class with a __dict__ (the detectors' state) that gained one."""
    rows = renumbered([{"connection_id": "c", "direction": "to_broker", "channel": 1, "method": "channel.open"}])
    checkpoint = checkpoint_after(rows)
    with pytest.raises(AttributeError, match="new_thing"):
        checkpoint.timeline.lives[1].new_thing = 1
    assert all("__slots__" in vars(cls) for cls in state.FIELDS)
    detectors = ConnectionDetectors({"connection_id": "c"}, Thresholds())
    with pytest.raises(AttributeError, match="new_thing"):  # slotted, as the C folds read it (analyzer/folds.py)
        detectors.buildup.new_thing = 1
    detectors.lost.new_thing = 1
    with pytest.raises(TypeError, match="new_thing"):
        detectors_to_state(detectors)
