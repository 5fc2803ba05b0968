"""A damaged or forged checkpoint never wedges a run (issue 60): whatever one field of the document
holds instead of what the machine wrote (another type, an integer past int64 or below zero, deep
nesting, a key missing or added), the reader refuses it as a StateError naming the field, or the
connection carries on to exactly the records and raw findings of one analysis of all its frames.
Nothing else (a TypeError in carry.py, an int64 conversion in rows.py) may come out of it.
tests/test_incremental.py's test_hostile_checkpoints_in_the_lake... holds whole runs to it."""

from __future__ import annotations

import json

from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

from analyzer import schema
from analyzer.connection_analysis import ANALYSIS_COLUMNS, carry_on_connection
from analyzer.timeline.carry import _key, dump, load
from analyzer.detectors.state import VOCABULARY as DETECTORS
from analyzer.timeline.state import TIMELINE, StateError, from_doc

from .findings_check import LAB_THRESHOLDS
from .test_local_executor import _in_driver
from .test_detector_state import SETTINGS, comparable
from .test_incremental import (_append, _tables, analysed_but_the_last_piece, replace_states,  # noqa: F401
                               traffic, whole)
from .test_detectors_python import random_connections

DEEP = "DEEP-NESTING-HERE"
# What a field may hold instead of its value, by the JSON kind of that value.
_INSTEAD = {
    int: lambda v: [str(v), v + 0.5, True, 1 << 63, 1 << 70, -1 - v, -(1 << 63) - 1, ["L", []], {"k": v}, DEEP],
    str: lambda v: [11, 1.5, False, 1 << 70, ["L", [v]], {"k": v}, DEEP],
    bool: lambda v: [int(v), str(v).lower(), 1 << 70, ["L", []], DEEP],
    float: lambda v: [str(v), 1 << 70, DEEP],
    type(None): lambda v: [1 << 70, -(1 << 63) - 1, ["X", []], DEEP],
    list: lambda v: [7, "x", None if v and v[0] in ("O", "R") else 1 << 70, ["X", v[1:]], *_retagged(v), DEEP],
    dict: lambda v: ["x", ["L", []], DEEP],
}


def _retagged(v: list) -> list:
    """The same body under another container tag (a list where a tuple was, a set of a dict's pairs...)."""
    if not v or type(v[0]) is not str:
        return []
    return [[tag, *v[1:]] for tag in ("L", "T", "S", "M", "D", "O", "R") if tag != v[0]]


def _places(doc, path=()):
    """Every position in the document: (path, value)."""
    yield path, doc
    if type(doc) is dict:
        for key, value in doc.items():
            yield from _places(value, (*path, key))
    elif type(doc) is list:
        for at, value in enumerate(doc):
            yield from _places(value, (*path, at))


def _replaced(doc, path, value):
    if not path:
        return value
    copy = dict(doc) if type(doc) is dict else list(doc)
    copy[path[0]] = _replaced(doc[path[0]], path[1:], value)
    return copy


@st.composite
def damaged(draw, doc: dict) -> bytes:
    places = [(path, value) for path, value in _places(doc) if path]
    path, value = draw(st.sampled_from(places), label="where")
    parent = _follow(doc, path[:-1])
    choices = [("replace", v) for v in _INSTEAD[type(value)](value)]
    if type(parent) is dict:
        choices += [("drop", None), ("add", None)]
    how, instead = draw(st.sampled_from(choices), label="damage")
    if how == "drop":
        forged = _replaced(doc, path[:-1], {k: v for k, v in parent.items() if k != path[-1]})
    elif how == "add":
        forged = _replaced(doc, path[:-1], {**parent, "extra": 1})
    else:
        forged = _replaced(doc, path, instead)
    text = json.dumps(forged)
    # json.dumps would recurse too deep on it: spliced in as text.
    return text.replace(json.dumps(DEEP), '["L",[' * 100_000 + ']]' * 100_000).encode()


def _follow(doc, path):
    for step in path:
        doc = doc[step]
    return doc


def _stored(first, then) -> dict:
    """The rows the two runs leave: the first run's, the second's stale ones taken out, its own put in."""
    rows = {_key(x): x for x in first.final + first.open}
    for x in then.done.stale:
        rows.pop(_key(x), None)
    rows.update({_key(x): x for x in then.final + then.open})
    return rows


@settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_a_damaged_checkpoint_is_refused_or_carries_on_exactly(data):
    rows, cut, connection, first = _first_piece(data)
    forged = data.draw(damaged(json.loads(dump(first.done.checkpoint))), label="checkpoint")
    _refused_or_exact(forged, rows, cut, first, connection)


def _first_piece(data):
    """A random connection's rows, where they are cut, its connection row, and its run up to the cut."""
    frames, (connection,) = random_connections(data, 1)
    rows = [{c: row.get(c) for c in ANALYSIS_COLUMNS} for row in frames]
    cut = data.draw(st.integers(1, len(rows) - 1), label="cut") if len(rows) > 1 else 1
    first = carry_on_connection(None, rows[:cut], SETTINGS, connection)
    assume(first.done.checkpoint is not None and cut < len(rows))
    return rows, cut, connection, first


def _refused_or_exact(forged: bytes, rows: list, cut: int, first, connection: dict) -> None:
    """The forged checkpoint refused as it is read or as its connection carries on (then analysed
    whole), or carried on to the records and raw findings of one analysis of all the rows."""
    try:
        checkpoint = load(forged)
    except StateError as refused:
        assert str(refused)
        event("refused")
        return
    then = carry_on_connection(checkpoint, rows[cut:], SETTINGS, connection)
    if then.done.fallback is not None:
        event("fell back")
        return  # refused on the way (the detectors' state, a check of carry.py): analysed whole
    event("carried on")
    whole = carry_on_connection(None, rows, SETTINGS, connection)
    assert _stored(first, then) == {_key(x): x for x in whole.final + whole.open}
    assert comparable(then.done.raw_findings) == comparable(whole.done.raw_findings)


# The detectors' evidence in a checkpoint (detectors/state.py): the sort keys of Firsts' (key, item)
# pairs and the fields of each kind of frame rows held for the end of the connection.
_KEYED = ("Firsts", "ViolationFirsts")
_FRAMES = ("FramesByIncarnation", "Returns", "Consumes", "ChannelFlows")


def _evidence_places(doc: dict) -> list:
    """(path, value, also) of each sort key (and each value in it) and each frame field of the
    detectors' state; `also`: values of its own JSON kind that are wrong there too (a key is
    made from its item, so any other key is wrong; a frame field may hold another value of its type)."""
    places = []
    for n, (name, fields) in enumerate(doc["detectors"]["objects"] if "detectors" in doc else ()):
        base = ("detectors", "objects", n, 1)
        if name in _KEYED:
            for i, (_, (key, _item)) in enumerate(fields["_items"][1]):
                places += [((*base, "_items", 1, i, 1, 0, *path), value, True) for path, value in _places(key)]
        elif name in _FRAMES:
            for i, (_, row) in enumerate(fields["rows"][1]):
                places += [((*base, "rows", 1, i, 1, 4, 1, j), value, False) for j, value in enumerate(row[4][1])]
    return places


def _of_its_kind(v) -> list:
    """Other values of v's own JSON kind."""
    return {int: lambda: [v + 1, max(v - 1, 0), 0], str: lambda: [v + "x", ""], bool: lambda: [not v],
            type(None): lambda: []}.get(type(v), lambda: [])()


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_forged_evidence_in_the_detectors_state_is_refused_or_carries_on_exactly(data):
    """A sort key or a frame field of the detectors' state holding a value of another type, or a key
    another value of its own type: refused (the field named), never carried on to other findings."""
    rows, cut, connection, first = _first_piece(data)
    doc = json.loads(dump(first.done.checkpoint))
    places = _evidence_places(doc)
    assume(places)
    path, value, keyed = data.draw(st.sampled_from(places), label="where")
    instead = [v for v in _INSTEAD[type(value)](value) if v != DEEP] + (_of_its_kind(value) if keyed else [])
    assume(instead)
    forged = _replaced(doc, path, data.draw(st.sampled_from(instead), label="instead"))
    _refused_or_exact(json.dumps(forged).encode(), rows, cut, first, connection)


def test_the_values_issue_60_found_are_refused_with_the_field_they_were_in():
    frames = [{"connection_id": "c", "agent_id": "a", "seq": seq, "ts_ns": seq, "direction": direction, "channel": 1,
               "method": method, "delivery_tag": tag}
              for seq, direction, method, tag in [(1, "to_broker", "channel.open", None),
                                                  (2, "to_client", "channel.open-ok", None),
                                                  (3, "to_broker", "basic.consume", None),
                                                  (4, "to_client", "basic.deliver", 11)]]
    doc = json.loads(dump(carry_on_connection(None, frames, SETTINGS, {"connection_id": "c"}).done.checkpoint))
    timeline = next(fields for name, fields in doc["objects"] if name == "ConnectionTimeline")
    delivery = next(fields for name, fields in doc["objects"] if name == "_Delivery")
    for field, holder, value, reason in [("last_seq", timeline, "93", "ConnectionTimeline.last_seq: '93' is not an"),
                                         ("tag", delivery, 1 << 70, "_Delivery.tag: 1180591620717411303424 is not"),
                                         ("tag", delivery, "11", "_Delivery.tag: '11' is not an integer"),
                                         ("tag", delivery, -11, "_Delivery.tag: -11 is not an integer in \\[0")]:
        good = holder[field]
        holder[field] = value
        try:
            load(json.dumps(doc).encode())
        except StateError as refused:
            assert reason.replace("\\", "") in str(refused), refused
        else:
            raise AssertionError(f"{field}={value!r} was read")
        holder[field] = good
    for document in (doc, doc["detectors"]):  # a document without its objects (hypothesis found the first)
        objects = document.pop("objects")
        try:
            from_doc(document, {key: None for key in document if key not in ("format", "version")},
                     DETECTORS if document is doc["detectors"] else TIMELINE)
        except StateError as refused:
            assert "objects" in str(refused), refused
        else:
            raise AssertionError("a checkpoint without its objects was read")
        document["objects"] = objects


def test_an_evidence_item_missing_a_field_its_kind_writes_is_refused():
    """Hypothesis found it (a KeyError as the finding was made): an unconfirmed persistent publish's
    evidence item without its exchange. The item's fields are each typed, so only its owner knows them."""
    frames = [{"connection_id": "c", "agent_id": "a", "seq": seq, "ts_ns": seq, "direction": "to_broker",
               "channel": 1, "method": method, "exchange": "", "routing_key": "q", "delivery_mode": mode}
              for seq, method, mode in [(1, "channel.open", None), (2, "basic.publish", 2), (3, "basic.publish", 2)]]
    done = carry_on_connection(None, frames[:2], SETTINGS, {"connection_id": "c"}).done
    doc = json.loads(dump(done.checkpoint))
    items = [fields["_items"][1] for name, fields in doc["detectors"]["objects"] if name == "Firsts" and fields["_items"][1]]
    assert items and "exchange" in items[0][0][1][1][1]
    del items[0][0][1][1][1]["exchange"]
    then = carry_on_connection(load(json.dumps(doc).encode()), frames[2:], SETTINGS, {"connection_id": "c"})
    assert "an evidence item of UnconfirmedPersistentPublish has fields" in str(then.done.fallback)


def _hostile(doc: dict, how: int) -> bytes:
    """One of the checkpoints issue 60 saw wedge every run (and deep nesting), forged from `doc`."""
    objects = doc["objects"]
    timeline = next(fields for name, fields in objects if name == "ConnectionTimeline")
    tagged = [fields for name, fields in objects if name in ("_Delivery", "_EarlyAck")]
    if how == 0:
        timeline["last_seq"] = str(timeline["last_seq"])
    elif how == 1:
        (tagged[0] if tagged else timeline)["tag" if tagged else "overdue_ns"] = 1 << 70
    elif how == 2:
        (tagged[0] if tagged else timeline)["tag" if tagged else "last_ts_ns"] = "11"
    else:
        return json.dumps(dict(doc, boundary=DEEP)).replace(json.dumps(DEEP), '["T",[' * 100_000 + ']]' * 100_000
                                                              ).encode()
    return json.dumps(doc).encode()


def test_hostile_checkpoints_in_the_lake_are_refused_and_the_run_ends_as_a_full_one(spark, whole, traffic, tmp_path):
    """Checkpoints in analysis_state holding "last_seq":"93", a tag of 2^70, "tag":"11" or deep
    nesting: the run, the local executor's as on any small lake, analyses those connections whole,
    and the tables end as one run's (each of these exited 5, every run after)."""
    lake_dir = str(tmp_path / "lake")
    last, states = analysed_but_the_last_piece(spark, traffic, lake_dir)
    states = states[:4]
    assert len(states) == 4
    replace_states(lake_dir, [dict(row, checkpoint=_hostile(json.loads(row["checkpoint"]), how))
                              for how, row in enumerate(states)])
    _append(lake_dir, "frames", last, schema.FRAMES, "last")
    report, _ = _in_driver(spark, lake_dir)
    assert report.delta_mode == "none" and report.connections > report.carried_connections > 0, report
    for row in states:
        assert f"{row['connection_id']}: checkpoint refused: " in report.reason, report.reason
    assert _tables(lake_dir) == whole
