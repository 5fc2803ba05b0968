"""The native lane (analyzer/_lane.c, analyzer/native.py) against the Python path, on the same captures.

Every test decodes the same file twice, with the lane and with ACKSCOPE_PURE_PYTHON=1, and requires
the same frame rows (sorted by connection and seq: rows within a batch come in no promised order),
the same report (packets, flows, frames by method, gaps, errors) and the same connection rows. The
files are the bundled examples, the public corpus and its negative controls, the benchmark captures
when they are recorded, and the generated conversations of test_fuzz and test_fast_paths written
out as pcap and pcapng files, clean and damaged: packets dropped, repeated, reordered and cut by a
snap length, payloads mutated (bit flips, huge frame sizes), garbage, captures starting mid-stream.

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


def test_the_lane_is_built_in_ci():
    check_built(native.available(), LANE_MISSING)


needs_lane = needs_built(native.available(), LANE_MISSING)


def _decoded(path: str, lane: bool, monkeypatch) -> tuple:
    monkeypatch.setenv("ACKSCOPE_PURE_PYTHON", "0" if lane else "1")
    batches = []
    report, connections = decode(path, batches.append)
    table = pa.concat_tables(batches) if batches else None
    rows = table.sort_by([("connection_id", "ascending"), ("seq", "ascending")]).to_pylist() if table else []
    summary = report.as_json()
    summary.pop("seconds")
    return rows, summary, connections


def assert_same_both_ways(path: str, monkeypatch) -> tuple:
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
        lane = _decoded(path, True, patched)
    python = _decoded(path, False, monkeypatch)
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
