"""The detectors' state in the checkpoint (analyzer/detectors/state.py): it survives the round trip
as data, a connection carried on in pieces (its checkpoint stored as bytes and read back between
them, the detectors resumed from it) gives exactly the raw findings of one analysis of all its
frames, and state this code did not write, or wrote under other thresholds, is refused with its
reason and the connection analysed whole."""

from __future__ import annotations

import glob
import json
import os
from dataclasses import asdict, replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from analyzer import lake, schema
from analyzer.connection_analysis import ANALYSIS_COLUMNS, ConnectionAnalysis, Settings, carry_on_connection
from analyzer.detectors import ConnectionDetectors
from analyzer.detectors import state as detector_state
from analyzer.ingest import ingest_file
from analyzer.timeline.carry import dump, load
from analyzer.timeline.state import StateError

from .conftest import ROOT
from .findings_check import LAB_THRESHOLDS as LAB
from .test_detectors_python import fed_case, random_connections
from .test_state import shape_digest
from .detector_cases import hand_built_cases

SETTINGS = Settings(1, 15_000_000, LAB)
# The shape of DETECTORS_VERSION: a change to a stored class's fields must bump the version (old
# checkpoints are then analysed whole once, not misread) and update this line.
SHAPE = {1: "937163039c", 2: "97d8286649", 3: "34abc8ff9f"}


def test_the_version_names_the_shape():
    assert SHAPE.get(detector_state.DETECTORS_VERSION) == shape_digest(detector_state.FIELDS), \
        "the detectors' stored fields changed: bump DETECTORS_VERSION and record the new shape here"


def comparable(raw: list) -> list:
    return sorted((json.dumps(asdict(f), sort_keys=True) for f in raw))


def round_tripped(detectors: ConnectionDetectors, connection: dict) -> ConnectionDetectors:
    doc = json.loads(json.dumps(detector_state.to_state(detectors)))
    return detector_state.from_state(doc, connection, LAB)


def test_every_detectors_state_round_trips_on_the_hand_built_cases():
    """Each case holds a kind's finding; its state, stored and read back, gives the same findings and state."""
    for case in hand_built_cases():
        detectors, _, connection = fed_case(case)
        again = round_tripped(detectors, connection)
        assert detector_state.to_state(again) == detector_state.to_state(detectors), case.name
        again.context.connection = detectors.context.connection = connection
        assert comparable(again.raw_findings()) == comparable(detectors.raw_findings()), case.name


def analysed_whole(rows: list[dict], connection: dict, advance_every: int = 4096) -> list:
    analysis = ConnectionAnalysis(connection["connection_id"], rows[0].get("agent_id"), SETTINGS,
                                  lambda record: None, lambda metrics: None, advance_every)
    for row in rows:
        analysis.feed(row)
    return analysis.finish(connection).raw_findings


def carried_in_pieces(rows: list[dict], connection: dict, cuts: list[int]) -> tuple[list, list[str]]:
    """The raw findings of the last of the runs, one per piece, each resuming the checkpoint the one
    before stored (a run that falls back analyses the connection from its start, as Spark does)."""
    checkpoint, fallbacks, raw, ended = None, [], None, False
    for start, stop in zip([0, *cuts], [*cuts, len(rows)]):
        if start == stop:
            continue
        # A connection that ended keeps no checkpoint: frames after its end are analysed with all before.
        carried = carry_on_connection(checkpoint, rows[start:stop], SETTINGS, connection) if not ended else None
        if carried is None or carried.done.fallback:
            fallbacks.append(carried.done.fallback if carried is not None else "ended")
            carried = carry_on_connection(None, rows[:stop], SETTINGS, connection)
        raw = carried.done.raw_findings
        ended = carried.done.checkpoint is None
        checkpoint = None if ended else load(dump(carried.done.checkpoint))
    return raw, fallbacks


@settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_random_connections_carried_in_pieces_give_the_findings_of_one_analysis(data):
    frames, connections = random_connections(data, 2)
    for connection in connections:
        rows = [{c: row.get(c) for c in ANALYSIS_COLUMNS}
                for row in frames if row["connection_id"] == connection["connection_id"]]
        cuts = sorted(data.draw(st.lists(st.integers(1, len(rows)), max_size=5), label="cuts"))
        whole = analysed_whole(rows, connection, data.draw(st.sampled_from([1, 7, 4096]), label="advance"))
        raw, _ = carried_in_pieces(rows, connection, cuts)
        assert comparable(raw) == comparable(whole)


def test_recorded_captures_carried_in_ten_runs_give_the_findings_of_one_analysis(tmp_path):
    for capture in sorted(glob.glob(os.path.join(ROOT, "examples", "*.pcapng"))):
        ingest_file(capture, str(tmp_path))
    frames = lake.read_table(str(tmp_path), "frames", schema.FRAMES).select(list(ANALYSIS_COLUMNS))
    frames = frames.sort_by([("connection_id", "ascending"), ("seq", "ascending")]).to_pylist()
    by_connection: dict[str, list] = {}
    for row in frames:
        by_connection.setdefault(row["connection_id"], []).append(row)
    carried = 0
    for connection_id, rows in by_connection.items():
        connection = {"connection_id": connection_id}
        cuts = [len(rows) * k // 10 for k in range(1, 10)]
        raw, fallbacks = carried_in_pieces(rows, connection, cuts)
        assert comparable(raw) == comparable(analysed_whole(rows, connection))
        carried += not fallbacks
    assert carried >= len(by_connection) // 2, (carried, len(by_connection))


def _checkpoint_of_a_connection():
    rows = [{"connection_id": "c", "agent_id": "a", "seq": 1, "ts_ns": 1, "direction": "to_broker", "channel": 1,
             "method": "channel.open"}]
    carried = carry_on_connection(None, rows, SETTINGS, {"connection_id": "c"})
    return carried.done.checkpoint, [dict(rows[0], seq=2, ts_ns=2, method="basic.qos")]


def test_damaged_forged_or_missing_detectors_state_falls_back_with_its_reason():
    checkpoint, more = _checkpoint_of_a_connection()
    good = checkpoint.detectors
    assert carry_on_connection(load(dump(checkpoint)), more, SETTINGS, {"connection_id": "c"}).done.raw_findings == []
    cases = {
        "holds no detectors' state": None,
        "version": dict(good, version=good["version"] + 1),
        "version 1": dict(good, version=1),  # the profile's shape before version 2
        "not a checkpoint of ackscope.detectors.state": dict(good, format="something.else"),
        "lost: ['L', []] is not an object reference": dict(good, lost=["L", []]),
        "buildup: [7] is not an object reference": dict(good, buildup=[7]),
        "has fields": dict(good, objects=[["Tally", {"n": 1}]] + good["objects"][1:]),
    }
    for reason, doc in cases.items():
        forged = load(dump(replace(checkpoint, detectors=doc)))
        carried = carry_on_connection(forged, more, SETTINGS, {"connection_id": "c"})
        assert carried.done.raw_findings is None and reason in carried.done.fallback, (reason, carried.done)
    other = Settings(1, 15_000_000, replace(LAB, unacked_age_seconds=LAB.unacked_age_seconds + 1))
    carried = carry_on_connection(load(dump(checkpoint)), more, other, {"connection_id": "c"})
    assert "other thresholds" in carried.done.fallback


def test_a_forged_evidence_key_or_frame_field_is_refused_naming_its_field():
    """In every hand-built case's state: a sort key other than its item's (of its own type, or another),
    and a frame field of another type, are refused with the field they were in."""
    forged = 0
    for case in hand_built_cases():
        detectors, _, connection = fed_case(case)
        doc = json.loads(json.dumps(detector_state.to_state(detectors)))
        for name, fields in doc["objects"]:
            if name in ("Firsts", "ViolationFirsts"):
                places = [(pair[1], 0, instead) for pair in fields["_items"][1]
                          for instead in _other_keys(pair[1][0])]
                where = f"{name}._items"
            elif name in ("Returns", "Consumes", "ChannelFlows"):
                places = [(row[1][4][1], 0, "7") for row in fields["rows"][1]]
                where = f"{name}.rows"
            else:
                continue
            for holder, at, instead in places:
                good, holder[at] = holder[at], instead
                with pytest.raises(StateError, match=f"checkpoint {where}: "):
                    detector_state.from_state(doc, connection, LAB)
                holder[at] = good
                forged += 1
    assert forged > 10


def _other_keys(key) -> list:
    """Keys other than `key`: of its own type (its seq, or its violation's seq, one more) and of another."""
    if type(key) is int:
        return [key + 1, str(key)]
    (seq_tag, (present, seq)), *rest = key[1]   # nulls_first's pairs: (1, seq) first
    return [["T", [[seq_tag, [present, seq + 1]], *rest]], ["T", []]]
