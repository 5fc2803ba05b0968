"""A capture in pieces (issue 61): files read as one capture, scheduled ingests continuing the
lake's saved flows, `--watch` following a ring, and the flow state as checked data.

The reference is always the same traffic ingested whole: frame rows (their packet numbered in
the whole capture) and connection rows equal, whatever the cuts."""

from __future__ import annotations

import copy
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from analyzer import lake, schema
from analyzer.connection import AmqpConnection
from analyzer.flow_lake import TABLE as FLOW_STATE
from analyzer.fingerprint import fingerprint
from analyzer.flow_state import FlowStateError, dumps, loads
from analyzer.ingest import ingest_files
from analyzer.pieces import Capture
from analyzer.rows import RowSink
from tests.findings_check import analysed_as_the_command_does
from tests.pieces_support import cut, packet_count, tables

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")
# Captures whose connections span many packets each way, with content, closes and mid-stream starts.
CUT_EXAMPLES = ["lost_confirms", "requeue_loop", "mid_stream", "redelivery_after_close", "out_of_order_confirms",
                "clean_async_confirms", "channel_reuse", "transactions"]
ACKSCOPE = os.path.join(os.path.dirname(sys.executable), "ackscope")


def example(name: str) -> str:
    return os.path.join(EXAMPLES, f"{name}.pcapng")


def whole_tables(path: str, lake_dir: str):
    """The capture ingested as it is, as pieces_support.tables reads it."""
    assert not ingest_files([path], lake_dir)[0].errors
    return tables(lake_dir, {path: 0})


def frame_identity(row: dict, with_connection: bool = True) -> tuple:
    """What a decoded frame says, not when it was decoded nor in which row."""
    return ((row["connection_id"] if with_connection else None), row["direction"], row["channel"], row["method"],
            row["delivery_tag"], row["message_identity"], row["content_complete"])


def notes_of(reports) -> str:
    return "\n".join(note for report in reports for note in report.notes)


# -- the flow's state as data ------------------------------------------------------------------------

def open_flows(path: str, stop_before: int) -> list[dict]:
    """The snapshots of the flows open after the first `stop_before` packets of a capture."""
    pieces, _ = cut(path, [stop_before], os.path.join(os.environ.get("TMPDIR", "/tmp"), f"flows-{os.getpid()}"))
    capture = Capture(lambda batch: None, agent_id="", broker_ports=(5672,), max_frame=1 << 20)
    capture.read(pieces[0], None, _Report(), 0)
    _, saved, _, _, _ = capture.close([])
    return [loads(text) for _, text in saved]


class _Report:
    def __init__(self):
        self.notes, self.errors, self.frames_by_method = [], [], __import__("collections").Counter()
        self.damaged = self.unreadable = False
        self.packets, self.last_ts_ns, self.gaps = 0, None, 0


def restore(doc) -> AmqpConnection:
    return AmqpConnection.restore(doc, sink=RowSink(), counts={}, errors=[], max_frame=1 << 20)


def test_a_saved_flow_is_plain_json_and_restores_to_the_same_state():
    docs = open_flows(example("lost_confirms"), 30)
    assert docs, "the cut leaves a connection open"
    for doc in docs:
        assert json.loads(dumps(doc)) == doc  # plain JSON values only
        assert doc["tls"] is None  # plaintext: the TLS layer's slot (issue 59) is empty
        again = restore(doc).snapshot()
        assert again == doc


@pytest.mark.parametrize("field, value, named", [
    (("version",), 2, "connection.version"),
    (("tcp", 0, "next_seq"), -1, "connection.tcp[0].next_seq"),
    (("tcp", 1, "next_seq"), 1 << 32, "connection.tcp[1].next_seq"),
    (("tcp", 0, "pending"), [[5, "not base64!"]], "connection.tcp[0].pending[0].data"),
    (("framers", 1, "state"), "dancing", "connection.framers[1].state"),
    (("framers", 0, "offset"), "12", "connection.framers[0].offset"),
    (("facts", "client_port"), "5672", "connection.facts.client_port"),
    (("facts", "heartbeats"), 1 << 70, "connection.facts.heartbeats"),
    (("facts", "password"), "secret", "connection.facts.password"),
    (("id",), "10.0.0.1:1>10.0.0.2:5672@1", "connection.id"),
    (("client",), ["not an address", 1], "connection.client"),
    (("seq",), True, "connection.seq"),
    (("tls",), {"version": "TLS1.3"}, "connection.tls"),
])
def test_a_saved_flow_that_fails_any_check_is_refused_naming_the_field(field, value, named):
    (doc,) = open_flows(example("lost_confirms"), 30)[:1]
    bad = copy.deepcopy(doc)
    target = bad
    for key in field[:-1]:
        target = target[key]
    target[field[-1]] = value
    with pytest.raises(FlowStateError) as refused:
        restore(bad)
    assert named in str(refused.value)
    assert isinstance(refused.value, ValueError)


def test_a_missing_field_and_a_non_object_are_refused():
    (doc,) = open_flows(example("lost_confirms"), 30)[:1]
    for key in ("seq", "tcp", "framers", "content", "facts"):
        bad = copy.deepcopy(doc)
        del bad[key]
        with pytest.raises(FlowStateError, match=f"connection.{key}: missing"):
            restore(bad)
    with pytest.raises(FlowStateError, match="not an object"):
        restore([doc])
    with pytest.raises(FlowStateError, match="not JSON"):
        loads("{'pickle': true}")


def test_a_flow_holding_part_of_a_credential_exchange_is_not_saved():
    """A start-ok cut by the end of a file: its bytes (the SASL response) are never stored, so the
    flow is not saved and ends as at the end of any capture."""
    (doc,) = open_flows(example("lost_confirms"), 30)[:1]
    start_ok = bytes.fromhex("01000000000100") + b"\x00\x0a\x00\x0b" + b"\x00" * 20  # a method frame, cut short
    doc["framers"][0].update(state="frames", held=__import__("base64").b64encode(start_ok).decode(),
                             need=len(start_ok) + 200, frame_len=len(start_ok) + 200)
    capture = Capture(lambda batch: None, agent_id="", broker_ports=(5672,), max_frame=1 << 20)
    notes = []
    capture.restore([(doc["id"], dumps(doc))], [], "restored.pcap", notes)
    _, saved, _, still_open, _ = capture.close(notes)
    assert still_open == set() and saved == []  # it ends for good: its rows are final, not provisional
    assert "credential" in "\n".join(notes)


def test_a_refused_saved_flow_starts_again_mid_stream_and_nothing_false_is_found(tmp_path):
    """A saved state broken in the lake: the next ingest says so and decodes that flow as a capture
    starting mid-stream would; every content row it makes is one the whole capture has."""
    path = example("lost_confirms")
    whole, _ = whole_tables(path, str(tmp_path / "whole"))
    pieces, offsets = cut(path, [30], str(tmp_path / "pieces"))
    lake_dir = str(tmp_path / "lake")
    ingest_files(pieces[:1], lake_dir)
    table = lake.read_table(lake_dir, FLOW_STATE, __import__("analyzer.schema").schema.FLOW_STATE)
    rows = table.to_pylist()
    for row in rows:
        if row["connection_id"]:
            doc = json.loads(row["state"])
            doc["framers"][0]["held"] = "%%%"
            row["state"] = json.dumps(doc)
    from analyzer.flow_lake import save, load
    state = load(lake_dir, rows[0]["source"], [])
    state.flows = [(r["connection_id"], r["state"]) for r in rows if r["connection_id"]]
    save(lake_dir, rows[0]["source"], state, ["test-broken-state"], {})
    reports = ingest_files(pieces[1:], lake_dir)
    assert "its saved state was refused" in notes_of(reports) and "framers[0].held" in notes_of(reports)
    frames, _ = tables(lake_dir, offsets)
    known = {(r["method"], r["delivery_tag"], r["message_identity"], r["ts_ns"]) for r in whole}
    contents = [r for r in frames if r["method"] in ("basic.publish", "basic.ack", "basic.deliver")]
    assert contents and all((r["method"], r["delivery_tag"], r["message_identity"], r["ts_ns"]) in known
                            for r in contents)


# -- pieces equal the whole (property-style: random packet boundaries) -----------------------------------

@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_pieces_cut_anywhere_give_the_whole_captures_tables(tmp_path_factory, data):
    name = data.draw(st.sampled_from(CUT_EXAMPLES), label="capture")
    scheduled = data.draw(st.booleans(), label="one ingest per file")
    path = example(name)
    n = packet_count(path)
    cuts = data.draw(st.lists(st.integers(1, n - 1), min_size=1, max_size=6, unique=True), label="cuts")
    tmp = tmp_path_factory.mktemp("cut")
    whole = whole_tables(path, str(tmp / "whole"))
    pieces, offsets = cut(path, cuts, str(tmp / "pieces"))
    lake_dir = str(tmp / "lake")
    reports = []
    if scheduled:
        for piece in pieces:
            reports += ingest_files([piece], lake_dir)
    else:
        reports = ingest_files(pieces, lake_dir)
    assert [r.errors for r in reports] == [[] for _ in reports]
    got = tables(lake_dir, offsets)
    assert got[1] == whole[1]
    assert got[0] == whole[0]


@pytest.mark.parametrize("ending", ["rst", "fin"])
def test_a_flow_that_ended_in_the_last_piece_keeps_its_stragglers_out_of_the_next(tmp_path, ending):
    """Data the broker sent before it saw the client's reset (or a segment sent again after both FINs)
    arrives after the flow ended. One capture drops such stragglers; a capture whose cut falls just
    after the end must too, not take them for a connection starting mid-stream (a TLS one when the
    bytes look like records: CI met that on the amqps lab capture)."""
    from pamqp import commands
    from tests.wire import Conversation, handshake, method, write_pcap

    conv = Conversation()
    segments = conv.open() + conv.script(handshake(name="straggler") + [
        (0, method(commands.Basic.Qos(prefetch_count=10)))])
    late = method(commands.Basic.QosOk())
    if ending == "rst":
        segments.append(conv.rst(0))
        segments += conv.send(1, late)  # in flight when the reset was sent
        segments.append(conv.rst(0))    # and the client's answer to it
    else:
        segments += conv.send(1, late) + [conv.fin(0), conv.fin(1)]
        conv.next[1] -= len(late) + 1
        segments += conv.send(1, late)  # the broker's segment sent again after both FINs
    cut_at = len(segments) - (2 if ending == "rst" else 1)
    again = Conversation(client_isn=77_000)  # the same ends again: a new connection, from its SYN
    segments += again.open() + again.script(handshake(name="reused"))
    whole_path = str(tmp_path / "whole.pcap")
    write_pcap(whole_path, segments)
    whole = whole_tables(whole_path, str(tmp_path / "whole"))
    pieces, offsets = cut(whole_path, [cut_at], str(tmp_path / "pieces"))
    lake_dir = str(tmp_path / "lake")
    reports = [r for piece in pieces for r in ingest_files([piece], lake_dir)]
    assert [r.errors for r in reports] == [[], []]
    assert tables(lake_dir, offsets) == whole
    assert [c["connection_name"] for c in whole[1]] == ["straggler", "reused"]


@pytest.mark.parametrize("client, named", [([167772161, 40000], "source.ended[0].client: not an IP address"),
                                           (["10.0.0.1", 70000], "source.ended[0].client: not a TCP port"),
                                           ("10.0.0.1", "source.ended[0].client: not a list")])
def test_a_source_row_whose_ended_flows_fail_a_check_is_refused_naming_the_field(tmp_path, client, named):
    import pyarrow as pa
    from deltalake import write_deltalake

    from analyzer import flow_lake
    from analyzer.schema import FLOW_STATE as FLOW_STATE_SCHEMA

    path = example("lost_confirms")
    pieces, _ = cut(path, [packet_count(path) - 1], str(tmp_path / "pieces"))
    lake_dir = str(tmp_path / "lake")
    ingest_files([pieces[0]], lake_dir, source="s")
    rows = lake.read_table(lake_dir, FLOW_STATE, FLOW_STATE_SCHEMA).to_pylist()
    own = next(row for row in rows if row["connection_id"] == flow_lake.SOURCE_ROW)
    doc = json.loads(own["state"])
    saved = flow_lake.load(lake_dir, "s", []).ended  # the capture's last connection ended near its end
    assert saved and doc["ended"][0]["client"] == ["127.0.0.1", saved[0][0][1]]
    doc["ended"] = [{"client": client, "server": ["10.0.0.2", 5672], "last_ts_ns": 1}]
    own["state"] = json.dumps(doc)
    write_deltalake(f"{lake_dir}/{FLOW_STATE}", pa.Table.from_pylist(rows, FLOW_STATE_SCHEMA), mode="overwrite")
    notes = []
    assert flow_lake.load(lake_dir, "s", notes) is None
    assert named in notes[0] and "start again mid-stream" in notes[0]


def test_a_flow_silent_past_three_heartbeats_is_taken_for_dead_and_not_saved_yet_keeps_its_rows(tmp_path):
    """A connection whose FIN was never captured is not carried from piece to piece for ever: silent
    past three heartbeat intervals (and the idle timeout), it ends at the end of its piece, its
    connection row and ending rows final (not provisional rows the next piece would take back)."""
    from tests.wire import Conversation, handshake, write_pcap

    heartbeat = b"\x08\x00\x00\x00\x00\x00\x00\xce"
    dead = Conversation(client=(bytes([10, 0, 0, 1]), 40001))
    alive = Conversation(client=(bytes([10, 0, 0, 1]), 40002))
    segments = dead.open() + dead.script(handshake(name="dead")) + alive.open() + alive.script(handshake(name="alive"))
    times = [i / 1000 for i in range(len(segments))]
    for at in range(50, 701, 50):  # the broker's heartbeats keep the other connection alive
        segments += alive.send(1, heartbeat)
        times.append(float(at))
    cut_at = len(segments)
    segments += alive.send(1, heartbeat) + [alive.fin(0), alive.fin(1)]
    times += [710.0, 710.001, 710.002]
    whole_path = str(tmp_path / "whole.pcap")
    write_pcap(whole_path, segments, times=times)
    whole = whole_tables(whole_path, str(tmp_path / "whole"))
    pieces, offsets = cut(whole_path, [cut_at], str(tmp_path / "pieces"))
    lake_dir = str(tmp_path / "lake")
    first = ingest_files([pieces[0]], lake_dir)
    assert "taken for dead" in notes_of(first) and "three heartbeat intervals" in notes_of(first)
    saved = lake.read_table(lake_dir, FLOW_STATE, __import__("analyzer.schema").schema.FLOW_STATE)
    assert sorted(cid.split(">")[0] for cid in saved["connection_id"].to_pylist() if cid) == ["10.0.0.1:40002"]
    assert "continues the 1 open flow" in notes_of(ingest_files([pieces[1]], lake_dir))
    assert tables(lake_dir, offsets) == whole
    assert {c["connection_name"]: c["ended_by"] for c in whole[1]} == {"dead": "end-of-capture", "alive": "tcp.fin"}


def test_several_workers_read_the_pieces_as_one_worker_does(tmp_path):
    path = example("requeue_loop")
    whole = whole_tables(path, str(tmp_path / "whole"))
    n = packet_count(path)
    pieces, offsets = cut(path, [n // 5, n // 2, n - 7], str(tmp_path / "pieces"))
    ingest_files(pieces[:2], str(tmp_path / "lake"), workers=2)
    ingest_files(pieces[2:], str(tmp_path / "lake"), workers=2)
    assert tables(str(tmp_path / "lake"), offsets) == whole


def test_the_command_line_reads_files_in_time_order_and_says_so(tmp_path):
    path = example("redelivery_after_close")
    whole = whole_tables(path, str(tmp_path / "whole"))
    pieces, offsets = cut(path, [20, 45, 70], str(tmp_path / "pieces"))
    shuffled = [pieces[2], pieces[0], pieces[3], pieces[1]]
    result = subprocess.run([ACKSCOPE, "ingest", *shuffled, "--lake", str(tmp_path / "lake"), "--json"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert [f["file"] for f in report["files"]] == pieces
    assert any("order of their first packets" in note for note in report["notes"])
    assert tables(str(tmp_path / "lake"), offsets) == whole


# -- scheduled ingests: repeated, missing, out of order, overlapping, two sources ------------------------

def test_a_file_ingested_again_adds_nothing(tmp_path):
    path = example("lost_confirms")
    whole = whole_tables(path, str(tmp_path / "whole"))
    pieces, offsets = cut(path, [25, 50], str(tmp_path / "pieces"))
    lake_dir = str(tmp_path / "lake")
    ingest_files(pieces[:2], lake_dir)
    versions = {name: lake.open_table(lake_dir, name).version() for name in ("frames", "connections", FLOW_STATE)}
    again = ingest_files([pieces[1], pieces[0]], lake_dir) + ingest_files([pieces[1]], lake_dir)
    assert all(r.skipped for r in again)
    assert {name: lake.open_table(lake_dir, name).version() for name in versions} == versions
    copy_of_last = str(tmp_path / "copy.pcap")
    shutil.copyfile(pieces[2], copy_of_last)
    twice = ingest_files([pieces[2], copy_of_last], lake_dir)
    assert "the same bytes as" in notes_of(twice)
    assert tables(lake_dir, offsets) == whole


def test_a_missing_file_is_a_capture_gap_and_nothing_false(tmp_path):
    path = example("requeue_loop")
    whole, whole_connections = whole_tables(path, str(tmp_path / "whole"))
    n = packet_count(path)
    pieces, offsets = cut(path, [n // 3, n // 3 + 12, 2 * n // 3], str(tmp_path / "pieces"))
    lake_dir = str(tmp_path / "lake")
    for piece in (pieces[0], pieces[2], pieces[3]):  # pieces[1] lost (a ring deleted it before it was read)
        assert not ingest_files([piece], lake_dir)[0].errors
    frames, connections = tables(lake_dir, offsets)
    assert any(r["method"] == "capture.gap" for r in frames)
    assert {c["connection_id"] for c in connections} <= {c["connection_id"] for c in whole_connections}
    # Every message and ack it decoded is one of the whole capture's, in the same connection (its time
    # may be later: bytes after a hole wait in reassembly until the hole is known lost, as in one file).
    known = {frame_identity(r) for r in whole}
    decoded = [r for r in frames if r["method"].startswith("basic.")]
    assert decoded and all(frame_identity(r) in known for r in decoded)


def test_files_out_of_order_and_overlapping_are_said_and_lose_nothing(tmp_path):
    path = example("requeue_loop")
    whole, _ = whole_tables(path, str(tmp_path / "whole"))
    n = packet_count(path)
    pieces, offsets = cut(path, [n // 3, 2 * n // 3], str(tmp_path / "pieces"))
    lake_dir = str(tmp_path / "lake")
    ingest_files([pieces[1]], lake_dir)
    late = ingest_files([pieces[0]], lake_dir)  # older than what the source holds
    assert "before what source" in notes_of(late) and not late[0].errors
    ingest_files([pieces[2]], lake_dir)
    frames, _ = tables(lake_dir, offsets)
    known = {frame_identity(r, with_connection=False) for r in whole}
    decoded = [r for r in frames if r["method"].startswith("basic.")]
    assert all(frame_identity(r, with_connection=False) in known for r in decoded)
    # Nothing lost: every message of the whole capture is in the lake (its first piece's own mid-stream start aside).
    assert {(r["method"], r["ts_ns"]) for r in whole if r["method"] == "basic.publish"} <= \
        {(r["method"], r["ts_ns"]) for r in decoded}
    # Two files that overlap in time, in one command: read apart, and said.
    overlapping, _ = cut(path, [n // 2], str(tmp_path / "overlap"), stem="overlap")
    reports = ingest_files([overlapping[0], pieces[1]], str(tmp_path / "overlapping"))
    assert "overlapping files" in notes_of(reports)


def test_two_sources_share_a_lake_and_each_continues_its_own_flows(tmp_path):
    first, second = example("lost_confirms"), example("out_of_order_confirms")
    expected_frames, expected_connections = [], []
    offsets = {}
    schedule = []
    for name, path in (("a", first), ("b", second)):
        frames, connections = whole_tables(path, str(tmp_path / f"whole-{name}"))
        expected_frames += frames
        expected_connections += connections
        n = packet_count(path)
        pieces, piece_offsets = cut(path, [n // 4, n // 2, 3 * n // 4], str(tmp_path / name))
        offsets.update(piece_offsets)
        schedule.append([(name, piece) for piece in pieces])
    lake_dir = str(tmp_path / "lake")
    for a, b in zip(*schedule):  # interleaved, as two capture points' scheduled ingests would be
        for source, piece in (a, b):
            assert not ingest_files([piece], lake_dir, source=f"point-{source}")[0].errors
    frames, connections = tables(lake_dir, offsets)
    assert frames == sorted(expected_frames, key=lambda r: (r["connection_id"], r["seq"]))
    assert connections == sorted(expected_connections, key=lambda r: r["connection_id"])
    assert sorted(__import__("analyzer.flow_lake").flow_lake.sources(lake_dir)) == ["point-a", "point-b"]


def test_a_file_beyond_continue_within_ends_the_flows_as_today(tmp_path):
    path = example("lost_confirms")
    pieces, offsets = cut(path, [30], str(tmp_path / "pieces"))
    apart = str(tmp_path / "apart")
    ingest_files([pieces[0]], apart, continue_within_s=0.0)
    reports = ingest_files([pieces[1]], apart, continue_within_s=0.0)
    assert "more than --continue-within" in notes_of(reports)
    by_itself = str(tmp_path / "by-itself")
    ingest_files([pieces[0]], by_itself)
    first_alone = tables(by_itself, offsets)
    frames, connections = tables(apart, offsets)
    # The first file's connections end there, exactly as an ingest of it alone ends them.
    ids = {c["connection_id"] for c in first_alone[1]}
    assert [c for c in connections if c["connection_id"] in ids] == first_alone[1]
    assert [r for r in frames if r["connection_id"] in ids] == first_alone[0]


# -- --watch ----------------------------------------------------------------------------------------------

def _watcher(ring: str, lake_dir: str) -> subprocess.Popen:
    return subprocess.Popen([ACKSCOPE, "ingest", "--watch", ring, "--pattern", "piece_*.pcap", "--lake", lake_dir],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _drop(piece: str, ring: str, k: int) -> None:
    """A ring writer's next file: copied in, with a modification time after the last one's."""
    target = os.path.join(ring, os.path.basename(piece))
    shutil.copyfile(piece, target)
    os.utime(target, ns=(10**18 + k * 10**9, 10**18 + k * 10**9))


def _wait_for_files(lake_dir: str, files: list[str], timeout: float = 60.0) -> None:
    """Until every one of these files is in the lake (all three tables committed)."""
    ids = [f"ackscope-ingest-{fingerprint(path)}" for path in files]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(lake.committed(lake_dir, name, i) for i in ids for name in ("frames", "connections", FLOW_STATE)):
            return
        time.sleep(0.2)
    raise AssertionError(f"the watcher did not ingest {files} in {timeout}s")


def test_watch_follows_a_ring_survives_a_restart_and_stops_on_sigterm(tmp_path):
    path = example("requeue_loop")
    whole = whole_tables(path, str(tmp_path / "whole"))
    n = packet_count(path)
    pieces, offsets = cut(path, [n // 6, n // 3, n // 2, 2 * n // 3, 5 * n // 6], str(tmp_path / "pieces"))
    ring, lake_dir = str(tmp_path / "ring"), str(tmp_path / "lake")
    os.makedirs(ring)
    watcher = _watcher(ring, lake_dir)
    try:
        for k, piece in enumerate(pieces[:3]):
            _drop(piece, ring, k)
        _wait_for_files(lake_dir, pieces[:2])  # the third is the one being written
    finally:
        watcher.send_signal(signal.SIGTERM)
        out, err = watcher.communicate(timeout=60)
    assert watcher.returncode == 0, err
    assert "stopped watching" in err
    watcher = _watcher(ring, lake_dir)  # restarted: resumes from the lake
    try:
        for k, piece in enumerate(pieces[3:], start=3):
            _drop(piece, ring, k)
            time.sleep(0.3)
        _drop(cut(path, [], str(tmp_path / "newer"), stem="piece_99999")[0][0], ring, 99)  # the writer rotates on
        _wait_for_files(lake_dir, pieces)
    finally:
        watcher.send_signal(signal.SIGINT)
        out, err = watcher.communicate(timeout=60)
    assert watcher.returncode == 0, err
    assert "continues" in out
    in_ring = {os.path.join(ring, os.path.basename(piece)): offset for piece, offset in offsets.items()}
    assert tables(lake_dir, in_ring) == whole


KEY_LINE = "CLIENT_RANDOM " + "ab" * 32 + " " + "cd" * 48 + "\n"


def test_a_key_log_that_vanishes_between_ingests_is_a_note_and_the_watcher_goes_on(tmp_path):
    """`ingest --watch --tls-keylog` reads the key log again for each ingest: a file rotated away in
    between used to raise out of the watcher. Now the ingest goes on with the keys read before, and
    stderr names the file and why (never a line of it)."""
    path = example("requeue_loop")
    n = packet_count(path)
    pieces, _ = cut(path, [n // 3, 2 * n // 3], str(tmp_path / "pieces"))
    ring, lake_dir, keys = str(tmp_path / "ring"), str(tmp_path / "lake"), str(tmp_path / "keys.log")
    os.makedirs(ring)
    with open(keys, "w") as f:
        f.write(KEY_LINE)
    os.chmod(keys, 0o600)
    watcher = subprocess.Popen([ACKSCOPE, "ingest", "--watch", ring, "--pattern", "piece_*.pcap", "--lake", lake_dir,
                                "--tls-keylog", keys], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _drop(pieces[0], ring, 0)
        _drop(pieces[1], ring, 1)
        _wait_for_files(lake_dir, pieces[:1])
        os.remove(keys)
        _drop(pieces[2], ring, 2)  # the second file is closed now: ingested without the file
        _wait_for_files(lake_dir, pieces[:2])
    finally:
        watcher.send_signal(signal.SIGTERM)
        out, err = watcher.communicate(timeout=60)
    assert watcher.returncode == 0, err
    assert "Traceback" not in err and "stopped watching" in err
    assert f"note: cannot read the TLS key log {keys} (No such file or directory): the 1 key line(s) read from it " \
           "before are used" in err
    assert "cdcdcdcd" not in err + out


def test_the_watcher_keeps_the_keys_of_a_key_log_it_can_no_longer_read(tmp_path):
    from analyzer.watch import KeyLogFiles

    kept, gone = str(tmp_path / "kept.log"), str(tmp_path / "gone.log")
    for name, random in ((kept, "ab"), (gone, "ef")):
        with open(name, "w") as f:
            f.write(KEY_LINE.replace("ab" * 32, random * 32))
    files = KeyLogFiles([kept, gone])
    keylog, notes = files.read()
    assert notes == [] and keylog.lines == 2
    os.remove(gone)
    keylog, notes = files.read()
    assert keylog.secrets(bytes.fromhex("ef" * 32)) == {"CLIENT_RANDOM": bytes.fromhex("cd" * 48)}
    assert keylog.secrets(bytes.fromhex("ab" * 32)) and keylog.lines == 2
    assert notes == [f"cannot read the TLS key log {gone} (No such file or directory): the 1 key line(s) read "
                     "from it before are used"]
    with open(gone, "w") as f:  # replaced (an application restarted): its new keys, not the old ones
        f.write(KEY_LINE.replace("ab" * 32, "12" * 32))
    keylog, notes = files.read()
    assert notes == [] and not keylog.secrets(bytes.fromhex("ef" * 32)) and keylog.secrets(bytes.fromhex("12" * 32))
    never = KeyLogFiles([str(tmp_path / "never.log")])
    keylog, notes = never.read()
    assert len(keylog) == 0 and notes == [f"cannot read the TLS key log {tmp_path / 'never.log'} "
                                          "(No such file or directory): no keys from it"]
    assert KeyLogFiles([]).read() == (None, [])


# -- findings over a capture in pieces ----------------------------------------------------------------------

def _findings(spark, lake_dir: str) -> list[dict]:
    analysed_as_the_command_does(spark, lake_dir)
    result = subprocess.run([ACKSCOPE, "findings", "--lake", lake_dir, "--json"], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    return sorted(json.loads(result.stdout), key=lambda f: f["finding_id"])


def test_a_findings_evidence_in_two_files_names_each_packets_file(spark, tmp_path):
    """Each file of a capture in pieces numbers its packets from 1: a finding whose evidence frames
    are in two files names each packet's file (`source_files`), where `source` alone would send a
    reader to packets of the wrong file. An analysis after each piece ends with the same findings."""
    path = example("requeue_loop")
    whole = _findings(spark, _ingested(path, tmp_path / "whole"))
    loop = max((f for f in whole if f["kind"] == "requeue_loop"), key=lambda f: len(set(f["evidence"]["source_packets"])))
    packets = sorted(set(loop["evidence"]["source_packets"]))
    assert not [f for f in whole if "source_files" in f["evidence"]] and len(packets) > 2
    pieces, _ = cut(path, [packets[len(packets) // 2] - 1], str(tmp_path / "pieces"))  # packets count from 1
    at_once = _findings(spark, _ingested(pieces, tmp_path / "at-once"))
    (loop,) = [f for f in at_once if f["finding_id"] == loop["finding_id"]]
    evidence = loop["evidence"]
    assert set(evidence["source_files"]) == set(pieces) and loop["source"] == pieces[0]
    frames = lake.read_table(str(tmp_path / "at-once"), "frames", schema.FRAMES,
                             columns=["connection_id", "seq", "source", "source_packet"]).to_pylist()
    where = {(f["connection_id"], f["seq"]): (f["source"], f["source_packet"]) for f in frames}
    assert [where[(loop["connection_id"], seq)] for seq in evidence["seqs"]] == list(
        zip(evidence["source_files"], evidence["source_packets"]))
    one_by_one = tmp_path / "one-by-one"
    _ingested(pieces[0], one_by_one)
    _findings(spark, str(one_by_one))
    assert _findings(spark, _ingested(pieces[1], one_by_one)) == at_once  # the second run finishes from stored findings


def _ingested(paths, lake_dir) -> str:
    paths = [paths] if isinstance(paths, str) else paths
    result = subprocess.run([ACKSCOPE, "ingest", *paths, "--lake", str(lake_dir)], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    return str(lake_dir)
