"""The native lane (analyzer/_lane.c, analyzer/native.py) against the Python path, on the same captures.

Every test decodes the same file twice, with the lane and with ACKSCOPE_PURE_PYTHON=1, and requires
the same frame rows (sorted by connection and seq: rows within a batch come in no promised order),
the same report (packets, flows, frames by method, gaps, errors) and the same connection rows. The
files are the bundled examples, the public corpus and its negative controls, the benchmark captures
when they are recorded, and the generated conversations of test_fuzz and test_fast_paths written
out as pcap and pcapng files, clean and damaged: packets dropped, repeated, reordered and cut by a
snap length, payloads mutated (bit flips, huge frame sizes), garbage, captures starting mid-stream;
and the same streams inside real TLS 1.2 and 1.3 (the lane cuts a TLS connection's records and
frames their plaintext), with the recorded TLS benchmark captures and their key logs.

Under CI=true the lane must be built: a machine where it does not compile fails here, loudly,
instead of testing the Python path twice.
"""

import glob
import os
import struct

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from analyzer import native
from analyzer.ingest import decode
from analyzer.packets import Segment

from .conftest import CORPUS, ROOT, check_built, needs_built
from .test_fast_paths import _damaged, busy_conversations
from .test_fuzz import FUZZ, Wire, conversations, isns, mutate

LANE_MISSING = "the native lane is not built (pip install -e . compiles analyzer/_lane.c)"


@pytest.mark.c_twin
def test_the_lane_is_built_in_ci():
    check_built(native.available(), LANE_MISSING)


needs_lane = needs_built(native.available(), LANE_MISSING)


def _decoded(path: str, lane: bool, monkeypatch, keylog=None) -> tuple:
    monkeypatch.setenv("ACKSCOPE_PURE_PYTHON", "0" if lane else "1")
    batches = []
    report, connections = decode(path, batches.append, tls_keylog=keylog)
    table = pa.concat_tables(batches) if batches else None
    rows = table.sort_by([("connection_id", "ascending"), ("seq", "ascending")]).to_pylist() if table else []
    summary = report.as_json()
    summary.pop("seconds")
    return rows, summary, connections


def assert_same_both_ways(path: str, monkeypatch, keylog=None) -> tuple:
    """Decode `path` with the lane and without it; everything must be equal. Returns the lane's result."""
    assert native.available(), LANE_MISSING
    taken = []
    real = native.NativeLane.pcapng, native.NativeLane.pcap

    def counted(method):
        def wrapper(self, buf, pos, number, *args):
            out = method(self, buf, pos, number, *args)
            taken.append(out[1] - number)
            return out
        return wrapper

    with monkeypatch.context() as patched:
        patched.setattr(native.NativeLane, "pcapng", counted(real[0]))
        patched.setattr(native.NativeLane, "pcap", counted(real[1]))
        lane = _decoded(path, True, patched, keylog)
    python = _decoded(path, False, monkeypatch, keylog)
    assert lane[1] == python[1]
    assert lane[2] == python[2]
    assert len(lane[0]) == len(python[0])
    for mine, theirs in zip(lane[0], python[0]):
        assert mine == theirs
    return lane, sum(taken)


# -- recorded captures -------------------------------------------------------------------------------

def _captures(*patterns: str) -> list[str]:
    return sorted(p for pattern in patterns for p in glob.glob(pattern, recursive=True))


EXAMPLES = _captures(os.path.join(ROOT, "examples", "*.pcap*"))
CORPUS_FILES = _captures(os.path.join(CORPUS, "**", "*.pcap"), os.path.join(CORPUS, "**", "*.pcapng"))
BENCH = _captures(os.path.join(ROOT, "bench", "out", "*.pcapng"))


@needs_lane
@pytest.mark.parametrize("path", EXAMPLES, ids=os.path.basename)
def test_examples_decode_the_same_both_ways(path, monkeypatch):
    assert_same_both_ways(path, monkeypatch)


@needs_lane
@pytest.mark.parametrize("path", CORPUS_FILES, ids=lambda p: os.path.relpath(p, CORPUS))
def test_public_corpus_decodes_the_same_both_ways(path, monkeypatch):
    assert_same_both_ways(path, monkeypatch)


if BENCH:  # recorded by bench/decode.py (bench/out is not in the repository): a fresh clone has none
    @needs_lane
    @pytest.mark.parametrize("path", BENCH, ids=os.path.basename)
    def test_benchmark_captures_decode_the_same_both_ways(path, monkeypatch):
        """The busy streams the lane was written for. It must take nearly every packet, or the
        comparison says little."""
        (_, summary, _), taken = assert_same_both_ways(path, monkeypatch)
        assert taken > 0.95 * summary["packets"]


def test_the_corpus_and_examples_are_there():
    assert EXAMPLES and CORPUS_FILES


# -- generated conversations, written as capture files --------------------------------------------

ETHERNET_IPV4 = b"\x00" * 12 + b"\x08\x00"


def ethernet_frame(seg: Segment) -> bytes:
    tcp = struct.pack("!HHIIBBHHH", seg.sport, seg.dport, seg.seq, seg.ack, 5 << 4, seg.flags, 65535, 0, 0)
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 40 + len(seg.payload), 1, 0x4000, 64, 6, 0, seg.src, seg.dst)
    return ETHERNET_IPV4 + ip + tcp + seg.payload


def write_capture(path: str, frames: list[bytes], pcapng: bool, snaplen: int = 262144) -> None:
    """frames as Ethernet packets of a pcap or pcapng file; packets longer than snaplen are cut."""
    out = []
    if pcapng:
        out.append(struct.pack("<IIIHHq", 0x0A0D0D0A, 28, 0x1A2B3C4D, 1, 0, -1) + struct.pack("<I", 28))
        out.append(struct.pack("<IIHHI", 1, 20, 1, 0, snaplen) + struct.pack("<I", 20))
    else:
        out.append(struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, snaplen, 1))
    for n, frame in enumerate(frames, 1):
        captured = frame[:snaplen]
        ts = 1_700_000_000_000_000 + n  # µs
        if pcapng:
            pad = b"\x00" * (-len(captured) % 4)
            length = 32 + len(captured) + len(pad)
            out.append(struct.pack("<IIIIIII", 6, length, 0, ts >> 32, ts & 0xFFFFFFFF, len(captured), len(frame))
                       + captured + pad + struct.pack("<I", length))
        else:
            out.append(struct.pack("<IIII", ts // 1_000_000, ts % 1_000_000, len(captured), len(frame)) + captured)
    with open(path, "wb") as f:
        f.write(b"".join(out))


def _capture_of(packets: list[Segment], data, tmp_path) -> str:
    frames = [ethernet_frame(seg) for seg in packets]
    pcapng = data.draw(st.booleans(), label="pcapng")
    snaplen = data.draw(st.sampled_from([262144] * 5 + [60, 200]), label="snap length")
    path = str(tmp_path / ("capture.pcapng" if pcapng else "capture.pcap"))
    write_capture(path, frames, pcapng, snaplen)
    return path


def _same_both_ways(path: str) -> None:
    """assert_same_both_ways for hypothesis tests, which cannot take the monkeypatch fixture."""
    with pytest.MonkeyPatch.context() as patched:
        assert_same_both_ways(path, patched)


def _damage(packets: list[Segment], data) -> list[Segment]:
    """None, or the packets dropped, repeated, swapped, started mid-stream, payloads mutated."""
    kind = data.draw(st.sampled_from(["clean", "clean", "reorder", "midstream", "mutate"]), label="damage")
    if kind == "reorder":
        packets = _damaged(packets, data)
    elif kind == "midstream":
        packets = packets[data.draw(st.integers(0, max(0, len(packets) - 1)), label="start"):]
    elif kind == "mutate":
        packets = [Segment(s.src, s.dst, s.sport, s.dport, s.seq, s.ack, s.flags,
                           mutate(data.draw, s.payload, 131072) if s.payload and data.draw(st.integers(0, 3)) == 0
                           else s.payload, 0) for s in packets]
    return packets


@needs_lane
@FUZZ
@given(conversation=conversations(), data=st.data())
def test_conversations_decode_the_same_both_ways(conversation, data, tmp_path_factory):
    _same_both_ways(_capture_of(_damage(conversation[1], data), data, tmp_path_factory.mktemp("conversation")))


@needs_lane
@FUZZ
@given(conversation=busy_conversations(), data=st.data())
def test_busy_conversations_decode_the_same_both_ways(conversation, data, tmp_path_factory):
    _same_both_ways(_capture_of(_damage(conversation[1], data), data, tmp_path_factory.mktemp("busy")))


@needs_lane
@FUZZ
@given(payloads=st.lists(st.binary(max_size=600), min_size=1, max_size=20), data=st.data())
def test_garbage_on_the_broker_port_decodes_the_same_both_ways(payloads, data, tmp_path_factory):
    wire = Wire(data.draw(isns), data.draw(isns))
    if data.draw(st.booleans(), label="handshake"):
        wire.handshake()
    for payload in payloads:
        wire.send(data.draw(st.sampled_from([0, 1])), payload or b"\x00", 1500)
    _same_both_ways(_capture_of(wire.packets, data, tmp_path_factory.mktemp("garbage")))


@needs_lane
@FUZZ
@given(conversation=busy_conversations(), data=st.data())
def test_damaged_capture_files_decode_the_same_both_ways(conversation, data, tmp_path_factory):
    """Bytes of the file itself flipped or cut: record and block headers, IP and TCP headers."""
    _, packets = conversation
    path = _capture_of(packets, data, tmp_path_factory.mktemp("file"))
    raw = bytearray(open(path, "rb").read())
    for _ in range(data.draw(st.integers(1, 6), label="flips")):
        at = data.draw(st.integers(0, len(raw) - 1), label="at")
        raw[at] ^= 1 << data.draw(st.integers(0, 7))
    raw = raw[:data.draw(st.integers(len(raw) // 2, len(raw)), label="cut at")]
    with open(path, "wb") as f:
        f.write(raw)
    _same_both_ways(path)


@needs_lane
def test_the_lane_takes_the_packets_of_a_busy_stream(tmp_path, monkeypatch):
    """The differential tests would pass if the lane never took anything: make sure it does."""
    from pamqp import body as pamqp_body
    from pamqp import commands

    from . import amqp_bytes as ab
    from .test_fuzz import broker_opening, client_opening

    wire = Wire(1000, 2000)
    wire.handshake()
    wire.send(0, b"".join(client_opening()), 1500)
    wire.send(1, b"".join(broker_opening()), 1500)
    for tag in range(1, 301):
        wire.send(1, ab.marshal(commands.Basic.Deliver("ctag", tag, False, "ex", "rk"), 1)
                  + ab.marshal(ab.content_header(5, message_id=f"m-{tag}"), 1)
                  + ab.marshal(pamqp_body.ContentBody(b"hello"), 1), 1500)
        wire.send(0, ab.marshal(commands.Basic.Ack(tag), 1), 1500)
    path = str(tmp_path / "busy.pcapng")
    write_capture(path, [ethernet_frame(seg) for seg in wire.packets], pcapng=True)
    (rows, summary, _), taken = assert_same_both_ways(path, monkeypatch)
    assert taken >= 590 and summary["frames_by_method"]["basic.deliver"] == 300
    assert sorted(r["message_identity"] for r in rows if r["method"] == "basic.deliver") == sorted(
        f"id:m-{tag}" for tag in range(1, 301))


@needs_lane
@FUZZ
@given(buf=st.binary(max_size=400), pos=st.integers(-50, 450), number=st.integers(0, 5000),
       ticks=st.sampled_from([0, 1, 1_000_000, 2**64 - 1]), linktype=st.sampled_from([1, 0, 101, 276]))
def test_the_engine_reads_any_bytes_at_any_position_without_harm(buf, pos, number, ticks, linktype):
    """Records that are not records, positions outside the buffer, odd interfaces: the engine stops
    without taking anything (no connection is armed) and never reads outside what it was given."""
    from analyzer.rows import RowSink
    from analyzer.flows import FlowTable

    lane = native.NativeLane(FlowTable(sink=RowSink(), counts={}, errors=[], source="fuzz"))
    for call in (lambda: lane.engine.pcapng(buf, pos, number, ((linktype, ticks),), 1024),
                 lambda: lane.engine.pcap(buf, pos, number, linktype, False, 1024)):
        assert call() == (pos, number, None, 0, None)
    assert lane.engine.rows() == 0 and lane.engine.release_all() == []


@needs_lane
def test_tls_connections_beside_the_lane_and_a_plain_one_on_their_ports_after_them(tmp_path, monkeypatch):
    """A TLS connection is the lane's once its handshake is done (its records opened by its TLS
    layer, their plaintext framed in C), and so is a plaintext connection on the same ports after it
    ends: all of it as the Python path decodes it."""
    import ssl

    from pamqp import body as pamqp_body
    from pamqp import commands

    from analyzer.tls.keylog import read_keylog

    from . import amqp_bytes as ab
    from .test_fuzz import broker_opening, client_opening
    from .tls_sessions import Conversation

    def deliveries(tags: range) -> tuple[bytes, bytes]:
        down = b"".join(ab.marshal(commands.Basic.Deliver("ctag", tag, False, "ex", "rk"), 1)
                        + ab.marshal(ab.content_header(5, message_id=f"m-{tag}"), 1)
                        + ab.marshal(pamqp_body.ContentBody(b"hello"), 1) for tag in tags)
        return down, b"".join(ab.marshal(commands.Basic.Ack(tag), 1) for tag in tags)

    keys = tmp_path / "keys.log"
    tls = Conversation(keys, ssl.TLSVersion.TLSv1_3)
    tls.send(0, b"".join(client_opening()))
    tls.send(1, b"".join(broker_opening()))
    for first in range(1, 201, 10):  # ten deliveries, then their acks, a record each
        down, up = deliveries(range(first, first + 10))
        tls.send(1, down)
        tls.send(0, up)
    wire = Wire(7000, 9000)
    wire.handshake()
    for direction, data in tls.wire:
        wire.send(direction, data, 1400)
    wire.fin(0)
    wire.fin(1)
    plain = Wire(123_456, 654_321)  # the same ports, after the TLS connection ended
    plain.handshake()
    plain.send(0, b"".join(client_opening()), 1500)
    plain.send(1, b"".join(broker_opening()), 1500)
    down, up = deliveries(range(1, 101))
    plain.send(1, down, 1500)
    plain.send(0, up, 1500)
    path = str(tmp_path / "tls-then-plain.pcapng")
    write_capture(path, [ethernet_frame(seg) for seg in wire.packets + plain.packets], pcapng=True)
    (rows, summary, connections), taken = assert_same_both_ways(path, monkeypatch, read_keylog(str(keys)))
    assert [(c["protocol"], c["tls_decrypted"]) for c in sorted(connections, key=lambda c: c["first_ts_ns"])] == [
        ("amqp-0-9-1", True), ("amqp-0-9-1", None)]
    assert summary["frames_by_method"]["basic.deliver"] == 300
    assert taken >= 40 + 5  # the TLS connection's records of deliveries and acks, and the plain one's


# -- AMQP inside TLS, generated ------------------------------------------------------------------------

TLS_SUITES = [("1.3", None), ("1.2", "ECDHE-RSA-AES256-GCM-SHA384"), ("1.2", "ECDHE-RSA-CHACHA20-POLY1305"),
              ("1.2", "ECDHE-RSA-AES128-SHA256")]


def _inside_tls(data, keylog) -> list[Segment]:
    """busy_conversations' streams inside real TLS (OpenSSL at both ends, tests/tls_sessions.py): each
    chunk of frames one write, so records cut frames anywhere; the records cut into segments."""
    import ssl

    from .test_fast_paths import message_streams
    from .test_fuzz import broker_opening, client_opening
    from .tls_sessions import Conversation

    version, ciphers = data.draw(st.sampled_from(TLS_SUITES), label="TLS")
    tls = Conversation(keylog, ssl.TLSVersion.TLSv1_3 if version == "1.3" else ssl.TLSVersion.TLSv1_2, ciphers)
    wire = Wire(data.draw(isns), data.draw(isns))
    wire.handshake()
    queues = {0: client_opening() + data.draw(message_streams(0)), 1: broker_opening() + data.draw(message_streams(1))}
    sent = 0
    while True:
        for direction, records in tls.wire[sent:]:
            wire.send(direction, records, data.draw(st.sampled_from([40, 300, 1448, 65000]), label="segment size"))
        sent = len(tls.wire)
        if not (queues[0] or queues[1]):
            break
        direction = data.draw(st.sampled_from([d for d in queues if queues[d]]), label="direction")
        take = data.draw(st.integers(1, 40), label="frames")
        chunk, queues[direction] = b"".join(queues[direction][:take]), queues[direction][take:]
        tls.send(direction, chunk)
    if data.draw(st.booleans(), label="fin"):
        wire.fin(0)
        wire.fin(1)
    return wire.packets


@needs_lane
@FUZZ
@given(data=st.data())
def test_busy_conversations_inside_tls_decode_the_same_both_ways(data, tmp_path_factory):
    """The lane's TLS part (records cut in C, opened by the connection's TLS layer, the plaintext
    framed in C; a frame or record it does not take handed back) against the Python path, on TLS
    1.3 and 1.2 (AES-GCM, ChaCha20-Poly1305, and CBC, which opens the same way), clean and damaged."""
    from analyzer.tls.keylog import read_keylog

    tmp = tmp_path_factory.mktemp("tls")
    keylog = tmp / "keys.log"
    path = _capture_of(_damage(_inside_tls(data, keylog), data), data, tmp)
    with pytest.MonkeyPatch.context() as patched:
        assert_same_both_ways(path, patched, read_keylog(str(keylog)))


TLS_BENCH = _captures(os.path.join(ROOT, "bench", "out", "tls", "*.pcapng"))

if TLS_BENCH:  # recorded by bench/tls.py, each beside its key log
    @needs_lane
    @pytest.mark.parametrize("path", TLS_BENCH, ids=os.path.basename)
    def test_tls_benchmark_captures_decode_the_same_both_ways(path, monkeypatch):
        from analyzer.tls.keylog import read_keylog

        (_, summary, _), taken = assert_same_both_ways(path, monkeypatch, read_keylog(path[:-len(".pcapng")] + ".keys.log"))
        assert taken > 0.95 * summary["packets"]


@needs_lane
@pytest.mark.parametrize("version", ["1.3", "1.2"])
def test_a_tls_connection_handed_back_inside_a_record_goes_on_from_the_same_byte(version, tmp_path, monkeypatch):
    """Records cut into 40-byte segments, one segment sent twice and two swapped: the lane hands the
    connection back at the retransmission and the swap holding part of a record, and Python
    reads that record on from the same byte (then the lane takes it again)."""
    import ssl

    from pamqp import body as pamqp_body
    from pamqp import commands

    from analyzer.tls.keylog import read_keylog

    from . import amqp_bytes as ab
    from .test_fuzz import broker_opening, client_opening
    from .tls_sessions import Conversation

    keys = tmp_path / "keys.log"
    tls = Conversation(keys, ssl.TLSVersion.TLSv1_3 if version == "1.3" else ssl.TLSVersion.TLSv1_2)
    tls.send(0, b"".join(client_opening()))
    tls.send(1, b"".join(broker_opening()))
    for first in range(1, 201, 10):
        tls.send(1, b"".join(ab.marshal(commands.Basic.Deliver("ctag", tag, False, "ex", "rk"), 1)
                             + ab.marshal(ab.content_header(5, message_id=f"m-{tag}"), 1)
                             + ab.marshal(pamqp_body.ContentBody(b"hello"), 1) for tag in range(first, first + 10)))
        tls.send(0, ab.marshal(commands.Basic.Ack(first + 9, multiple=True), 1))
    wire = Wire(7000, 9000)
    wire.handshake()
    for direction, data in tls.wire:
        wire.send(direction, data, 40)
    packets = wire.packets
    third, half = len(packets) // 3, len(packets) // 2
    packets = packets[:third] + [packets[third - 1]] + packets[third:half] + [packets[half + 1], packets[half]] + packets[half + 2:]
    path = str(tmp_path / "handed-back.pcapng")
    write_capture(path, [ethernet_frame(seg) for seg in packets], pcapng=True)
    (rows, summary, _), taken = assert_same_both_ways(path, monkeypatch, read_keylog(str(keys)))
    assert summary["frames_by_method"]["basic.deliver"] == 200 and summary["gaps"] == 0
    assert taken > 0.8 * summary["packets"]
