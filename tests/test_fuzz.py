"""Property-based fuzzing of TCP reassembly, AMQP framing and the whole flow table.

What must hold whatever the capture did to the bytes (loss, reordering, retransmission, snap
length, garbage, sequence-number wrap-around):

- reassembly delivers every stream byte at most once, at its true place, and accounts for every
  byte it never saw with a Gap of at least one byte;
- the frame reader yields only frames that are really in the stream, at their place (every
  non-heartbeat frame below carries its own index as channel number, so a frame names its place),
  and after a loss yields all frames again from the first method or header frame it can see;
- nothing raises, and buffers stay within their caps.
"""

import os
import struct

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from pamqp import body as pamqp_body
from pamqp import commands

from analyzer import spec
from analyzer.connection import TO_BROKER, TO_CLIENT
from analyzer.flows import FlowTable
from analyzer.framing import FrameReader, ProtocolHeader, Synchronised, Unsupported
from analyzer.packets import TCP_ACK, TCP_FIN, TCP_SYN, Segment
from analyzer.reassembly import SEQ_MOD, Gap, TcpDirection
from analyzer.rows import RowSink

from . import amqp_bytes as ab

pytestmark = pytest.mark.filterwarnings("ignore:This command is deprecated:DeprecationWarning")

# Shrinking a failure can take minutes; CI wants the verdict fast. ACKSCOPE_FUZZ_SHRINK=1 shrinks.
PHASES = tuple(Phase) if os.environ.get("ACKSCOPE_FUZZ_SHRINK") else (Phase.explicit, Phase.reuse, Phase.generate)
FUZZ = settings(max_examples=60, deadline=None, derandomize=True, database=None, phases=PHASES,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much])
FRAME_SLACK = 16  # a frame header, its end octet and the reader's look-ahead, over max_frame
HEADER = spec.PROTOCOL_HEADER_091

isns = st.one_of(st.integers(0, SEQ_MOD - 1), st.integers(SEQ_MOD - 2000, SEQ_MOD - 1), st.integers(0, 50))
frame_lists = st.lists(ab.frames(), min_size=1, max_size=25).map(ab.with_unique_channels)


# -- building and cutting streams -----------------------------------------------------------------

def layout(frame_list: list, prefix: bytes = b"") -> tuple[bytes, list[tuple[int, int]]]:
    """The stream and, per frame, its (start, end) offsets."""
    parts, spans, pos = [prefix], [], len(prefix)
    for f in frame_list:
        raw = f.raw
        parts.append(raw)
        spans.append((pos, pos + len(raw)))
        pos += len(raw)
    return b"".join(parts), spans


@st.composite
def segmentations(draw, n: int, max_segments: int = 40) -> list[tuple[int, int]]:
    points = draw(st.lists(st.integers(1, max(1, n - 1)), max_size=min(max_segments, max(0, n - 1)), unique=True))
    bounds = [0] + sorted(p for p in points if 0 < p < n) + [n]
    return list(zip(bounds, bounds[1:]))


@st.composite
def intervals(draw, n: int, max_size: int = 8) -> list[tuple[int, int]]:
    """Retransmissions: arbitrary byte ranges of the stream, overlapping whatever they like."""
    out = []
    for _ in range(draw(st.integers(0, max_size))):
        a = draw(st.integers(0, n - 1))
        out.append((a, draw(st.integers(a + 1, min(n, a + 400)))))
    return out


def local_shuffle(draw, events: list, label: str) -> list:
    """Captures mostly keep order; swap some neighbours, and sometimes shuffle everything."""
    if draw(st.booleans(), label=f"{label}: full shuffle"):
        return draw(st.permutations(events), label=label)
    events = list(events)
    for i in draw(st.lists(st.integers(0, max(0, len(events) - 2)), max_size=len(events)), label=label):
        if i + 1 < len(events):
            events[i], events[i + 1] = events[i + 1], events[i]
    return events


class Reassembly:
    """Drives one TcpDirection over a stream given as offsets, checking its memory cap after every call."""

    def __init__(self, stream: bytes, isn: int, max_pending: int, syn: bool):
        self.stream, self.isn = stream, isn
        self.tcp = TcpDirection(max_pending=max_pending)
        self.items: list = []
        if syn:
            self._take(self.tcp.segment((isn - 1) % SEQ_MOD, b"", syn=True))

    def _take(self, out: list) -> None:
        assert self.tcp.pending_bytes <= self.tcp.max_pending, (self.tcp.pending_bytes, self.tcp.max_pending)
        assert self.tcp.pending_bytes == sum(len(v) for v in self.tcp.pending.values())
        self.items.extend(out)

    def segment(self, start: int, end: int, cut: int = 0) -> None:
        """Bytes [start, end) sent; the capture kept all but the last `cut` (a snap length)."""
        self._take(self.tcp.segment((self.isn + start) % SEQ_MOD, self.stream[start:end - cut], missing=cut))

    def ack(self, upto: int, times: int = 1) -> None:
        for _ in range(times):
            self._take(self.tcp.acked((self.isn + upto) % SEQ_MOD))

    def finish(self) -> None:
        self._take(self.tcp.finish())


def walk(items: list, stream: bytes) -> tuple[int, list[tuple[int, int]]]:
    """Check every item against the stream; returns (bytes accounted for, delivered runs between gaps)."""
    pos, runs, in_run = 0, [], False
    for item in items:
        if isinstance(item, Gap):
            assert item.nbytes > 0, f"a {item.nbytes}-byte gap at stream offset {pos}: {item}"
            pos += item.nbytes
            in_run = False
            continue
        assert isinstance(item, bytes), item
        if not item:
            continue
        assert item == stream[pos:pos + len(item)], f"bytes delivered at offset {pos} are not the stream's"
        if in_run:
            runs[-1] = (runs[-1][0], pos + len(item))
        else:
            runs.append((pos, pos + len(item)))
            in_run = True
        pos += len(item)
    return pos, runs


def covered(ranges) -> list[tuple[int, int]]:
    merged: list[list[int]] = []
    for a, b in sorted(r for r in ranges if r[1] > r[0]):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return [tuple(m) for m in merged]


def buffered(reader: FrameReader) -> int:
    return sum(len(c) for c in reader._chunks)


def read_frames(reader: FrameReader, items: list) -> tuple[list, list]:
    frames, notes = [], []
    for item in items:
        found = reader.gap(item.nbytes) if isinstance(item, Gap) else reader.feed(item)
        assert buffered(reader) <= reader.max_frame + FRAME_SLACK, (buffered(reader), reader.max_frame)
        for x in found:
            (frames if isinstance(x, tuple) else notes).append(x)
    for f in frames:
        assert f[0] in spec.FRAME_TYPES and len(f[2]) <= reader.max_frame, f
    return frames, notes


def check_frames(frames: list, frame_list: list, spans: list, runs: list, from_start: bool) -> None:
    """Frames yielded are genuine and in order, each whole inside one delivered run, and none is missed
    once the reader can see a method or header frame again."""
    originals = [f.as_tuple() for f in frame_list]
    heartbeats = [i for i, f in enumerate(frame_list) if f.ftype == ab.FRAME_HEARTBEAT]
    last, got = -1, []
    for f in frames:
        f = (f[0], f[1], bytes(f[2]))
        if f[0] == ab.FRAME_HEARTBEAT:
            later = [i for i in heartbeats if i > last]
            assert later and f == originals[later[0]], f"an invented heartbeat after frame {last}: {f}"
            index = later[0]
        else:
            index = f[1] - 1
            assert 0 <= index < len(originals) and f == originals[index], f"an invented frame after frame {last}: {f!r:.200}"
            assert index > last, f"frame {index} yielded again or out of order after {last}"
        start, end = spans[index]
        assert any(a <= start and end <= b for a, b in runs), f"frame {index} {spans[index]} is not inside one of {runs}"
        last = index
        got.append(index)
    # Nothing missed: in each run, every whole frame from where the reader found its footing. A reader
    # that hunts may sync earlier than a chain of whole frames proves (a method or header ending where a
    # segment ends is believable too, and segment ends are not known here), never later.
    for run_no, (a, b) in enumerate(runs):
        inside = [i for i, (s, e) in enumerate(spans) if a <= s and e <= b]
        mine = [i for i in got if i in inside]
        if run_no == 0 and from_start and a == 0:
            assert mine == inside, f"frames yielded {mine}, frames there to be read {inside}"
            continue
        latest = first_believable([frame_list[i] for i in inside])
        if mine:
            assert mine == inside[inside.index(mine[0]):], f"frames yielded {mine}: a gap inside {inside}"
            assert inside.index(mine[0]) <= latest, f"frames yielded {mine}, footing was there from {inside[latest]}"
        # A run that yields nothing at all is not asserted on: between two losses the reader can still be
        # skipping or waiting when the next gap comes (a known liveness gap; see the issue notes). What
        # it does yield is held to the rules above.


# -- a valid stream, however TCP carried it --------------------------------------------------------

@FUZZ
@given(data=st.data())
def test_valid_stream_reassembles_and_frames_exactly(data):
    from_client = data.draw(st.booleans(), label="from client")
    frame_list = data.draw(frame_lists, label="frames")
    stream, spans = layout(frame_list, HEADER if from_client else b"")
    isn = data.draw(isns, label="isn")
    segments = data.draw(segmentations(len(stream)), label="segments")
    extra = data.draw(intervals(len(stream)), label="retransmissions")
    dups = data.draw(st.lists(st.sampled_from(segments), max_size=5), label="duplicates")
    events = local_shuffle(data.draw, segments + extra + dups, "order")

    r = Reassembly(stream, isn, max_pending=1 << 22, syn=True)
    for a, b in events:
        r.segment(a, b)
    r.finish()

    assert not [i for i in r.items if isinstance(i, Gap)]
    assert b"".join(r.items) == stream
    reader = FrameReader(from_client, at_stream_start=True)
    frames, notes = read_frames(reader, r.items)
    assert frames == [f.as_tuple() for f in frame_list]
    assert notes == ([ProtocolHeader(HEADER, True)] if from_client else [])


@FUZZ
@given(data=st.data())
def test_any_chunking_frames_exactly(data):
    frame_list = data.draw(frame_lists, label="frames")
    stream, _ = layout(frame_list)
    cuts = data.draw(segmentations(len(stream), max_segments=len(stream)), label="chunks")
    at_start = data.draw(st.booleans(), label="at start")
    reader = FrameReader(from_client=False, at_stream_start=at_start)
    frames, notes = read_frames(reader, [stream[a:b] for a, b in cuts])
    expected = [f.as_tuple() for f in frame_list]
    if not at_start:  # mid-stream, the reader hunts for the first believable chain of frames
        expected = expected[first_believable(frame_list):]
    assert frames == expected
    assert [type(n) for n in notes] == ([Synchronised] if expected and not at_start else [])


def first_believable(frame_list: list) -> int:
    """Where a reader that starts mid-stream finds its footing: the first frame that opens three valid
    frames in a row, or two with a method or content header among them, or a method or content header
    chain that runs to the end of the stream (FrameReader._confident's rule, stated on whole frames)."""
    anchors = (ab.FRAME_METHOD, ab.FRAME_HEADER)
    for i, first in enumerate(frame_list):
        if first.ftype not in anchors and not (first.ftype == ab.FRAME_BODY and first.payload):
            continue
        frames, anchored = 0, False
        for frame in frame_list[i:]:
            frames += 1
            anchored = anchored or frame.ftype in anchors
            if frames >= 3 or (anchored and frames >= 2):
                return i
        if anchored:
            return i
    return len(frame_list)


@FUZZ
@given(data=st.data())
def test_midstream_sync_reports_every_byte_it_skipped(data):
    """Synchronised.skipped (the capture.midstream row's gap_bytes) counts all bytes before the first
    frame, however many feeds the hunt took."""
    frame_list = data.draw(frame_lists, label="frames")
    first = first_believable(frame_list)
    stream, spans = layout(frame_list)
    cuts = data.draw(segmentations(len(stream), max_segments=len(stream)), label="chunks")
    _, notes = read_frames(FrameReader(from_client=False, at_stream_start=False), [stream[a:b] for a, b in cuts])
    assert notes == ([Synchronised(spans[first][0], True)] if first < len(frame_list) else [])


@FUZZ
@given(data=st.data())
def test_retransmitted_bytes_counts_every_byte_seen_twice(data):
    stream = data.draw(st.binary(min_size=1, max_size=2000), label="stream")
    segments = data.draw(segmentations(len(stream)), label="segments")
    extra = data.draw(intervals(len(stream)), label="retransmissions")
    events = local_shuffle(data.draw, segments + extra, "order")
    r = Reassembly(stream, data.draw(isns, label="isn"), max_pending=1 << 22, syn=True)
    for a, b in events:
        r.segment(a, b)
    r.finish()
    assert b"".join(r.items) == stream
    assert r.tcp.retransmitted_bytes == sum(b - a for a, b in events) - len(stream)


# -- lost segments ------------------------------------------------------------------------------------

@FUZZ
@given(data=st.data())
def test_lost_segments_never_invent_frames(data):
    from_client = data.draw(st.booleans(), label="from client")
    frame_list = data.draw(st.lists(ab.frames(max_body=120), min_size=2, max_size=30).map(ab.with_unique_channels),
                           label="frames")
    prefix = HEADER if from_client else b""
    stream, spans = layout(frame_list, prefix)
    n = len(stream)
    isn = data.draw(isns, label="isn")
    segments = data.draw(segmentations(n), label="segments")
    kept = [s for s in segments if not data.draw(st.integers(0, 3), label=f"drop {s}") == 0]
    extra = data.draw(intervals(n, max_size=4), label="retransmissions")
    snap = data.draw(st.booleans(), label="snap length")
    acks = data.draw(st.booleans(), label="acks")
    events = [("seg", a, b, data.draw(st.integers(0, b - a), label="cut") if snap else 0) for a, b in kept + extra]
    if acks:
        bounds = sorted({a for a, _ in segments} | {n})
        events += [("ack", data.draw(st.sampled_from(bounds), label="ack"), data.draw(st.integers(1, 10), label="times"))
                   for _ in range(data.draw(st.integers(0, 6), label="acks"))]
    events = local_shuffle(data.draw, events, "order")
    small_buffer = data.draw(st.booleans(), label="small buffer")
    max_pending = data.draw(st.integers(1, 400), label="max pending") if small_buffer else 1 << 22
    syn = data.draw(st.booleans(), label="syn")

    r = Reassembly(stream, isn, max_pending, syn=syn)
    for event in events:
        if event[0] == "seg":
            r.segment(*event[1:])
        else:
            r.ack(*event[1:])
    if r.tcp.next_seq is not None:
        r.ack(n)  # the peer had it all; whatever the capture lacks is a gap
    r.finish()

    # Without a SYN, the first segment seen is where the stream starts for the reassembler.
    start = 0 if syn else next((e[1] for e in events if e[0] == "seg"), n)
    accounted, runs = walk(r.items, stream[start:])
    runs = [(a + start, b + start) for a, b in runs]
    assert accounted == n - start, f"{accounted} bytes accounted for, the stream has {n - start} from offset {start}"
    seen = covered((e[1], e[2] - e[3]) for e in events if e[0] == "seg")
    for a, b in runs:
        assert any(x <= a and b <= y for x, y in seen), f"bytes [{a}, {b}) delivered but never captured: {seen}"
    if syn and not snap and not acks and not small_buffer:
        assert runs == seen, "bytes the capture holds were not all delivered"

    frames, _ = read_frames(FrameReader(from_client, at_stream_start=syn), r.items)
    check_frames(frames, frame_list, spans, runs, from_start=syn)


def test_ack_onto_a_buffered_segment_delivers_it_without_a_zero_byte_gap():
    """next_seq=100, bytes [200, 300) buffered, [100, 200) lost: once the peer's ACKs for 200 pass the
    loss threshold, [100, 200) is a gap and [200, 300) must follow it at once, not a second, empty gap later."""
    stream = bytes(range(256)) + bytes(44)
    r = Reassembly(stream, isn=5000, max_pending=1 << 20, syn=True)
    r.segment(0, 100)
    r.segment(200, 300)
    r.ack(200, times=64)
    assert r.items[1:] == [Gap(100, "lost"), stream[200:300]]
    r.finish()
    walk(r.items, stream)  # no zero-byte gap


def test_truncated_retransmission_past_buffered_bytes_never_rewinds():
    """A snap-length-truncated retransmission that announces bytes beyond next_seq skips them as a gap;
    bytes already buffered inside that skipped range must not later produce a negative gap (a rewind)."""
    stream = bytes(range(200))
    r = Reassembly(stream, isn=7, max_pending=1 << 20, syn=True)
    r.segment(0, 100)            # next_seq = 100
    r.segment(150, 200)          # buffered, out of order
    r.segment(90, 200, cut=100)  # a retransmission of [90, 200) with only 10 bytes captured: [100, 200) is a gap
    r.finish()                   # must not step back to the buffered [150, 200)
    accounted, _ = walk(r.items, stream)
    assert accounted == len(stream)


# -- memory caps --------------------------------------------------------------------------------------

@FUZZ
@given(data=st.data())
def test_out_of_order_buffer_stays_within_max_pending(data):
    n = data.draw(st.integers(10, 5000), label="stream length")
    stream = bytes(i % 251 for i in range(n))
    max_pending = data.draw(st.integers(1, 600), label="max pending")
    segments = data.draw(segmentations(n, max_segments=80), label="segments")
    kept = [s for s in segments if data.draw(st.booleans(), label=f"keep {s}")]
    r = Reassembly(stream, data.draw(isns, label="isn"), max_pending, syn=True)
    for a, b in local_shuffle(data.draw, kept, "order"):
        r.segment(a, b)  # Reassembly checks the cap after every call
    r.finish()
    walk(r.items, stream)


def test_many_small_holes_cannot_grow_the_buffer_without_bound():
    r = Reassembly(bytes(10_000), isn=0, max_pending=100, syn=True)
    r.segment(0, 1)
    for i in range(10):
        r.segment(2 + 2 * i, 3 + 2 * i)  # ten 1-byte islands behind ten 1-byte holes
    for i in range(5):
        r.segment(1000 + 100 * i, 1090 + 100 * i)  # each over the cap; each skips only one hole


def mutate(draw, stream: bytes, max_frame: int) -> bytes:
    """Bit flips, inserted and deleted bytes, and frame sizes replaced by huge or capped ones."""
    data = bytearray(stream)
    for _ in range(draw(st.integers(0, 8), label="mutations")):
        if not data:
            data += draw(st.binary(min_size=1, max_size=16))
            continue
        kind = draw(st.sampled_from(["flip", "insert", "delete", "size", "size"]), label="kind")
        pos = draw(st.integers(0, len(data) - 1), label="at")
        if kind == "flip":
            data[pos] ^= 1 << draw(st.integers(0, 7))
        elif kind == "insert":
            data[pos:pos] = draw(st.binary(min_size=1, max_size=32))
        elif kind == "delete":
            del data[pos:pos + draw(st.integers(1, 32))]
        elif pos + 7 <= len(data):
            size = draw(st.sampled_from([0xFFFFFFFF, 0x7FFFFFFF, max_frame, max_frame + 1, max_frame - 1, 0]))
            data[pos + 3:pos + 7] = struct.pack("!I", size)
    return bytes(data)


@FUZZ
@given(data=st.data())
def test_garbage_and_mutated_streams_never_raise_and_stay_bounded(data):
    max_frame = data.draw(st.sampled_from([64, 300, 4096, 131072]), label="max frame")
    source = data.draw(st.sampled_from(["garbage", "mutated", "mutated", "size-bombs"]), label="source")
    if source == "garbage":
        stream = data.draw(st.binary(max_size=3000), label="garbage")
    else:
        frame_list = data.draw(st.lists(ab.frames(max_body=60), min_size=1, max_size=20), label="frames")
        stream = mutate(data.draw, layout(frame_list, HEADER if data.draw(st.booleans()) else b"")[0], max_frame)
        if source == "size-bombs":  # a frame announcing the biggest size the cap allows, then not delivering it
            stream = struct.pack("!BHI", 1, 1, max_frame) + b"\x00\x3c\x00\x50" + stream
    cuts = data.draw(segmentations(len(stream), max_segments=30), label="chunks") if stream else []
    gaps = data.draw(st.sets(st.integers(0, 40), max_size=4), label="gaps at chunk")
    reader = FrameReader(from_client=data.draw(st.booleans(), label="from client"),
                         at_stream_start=data.draw(st.booleans(), label="at start"), max_frame=max_frame)
    items = []
    for i, (a, b) in enumerate(cuts):
        items.append(stream[a:b])
        if i in gaps:
            items.append(Gap(data.draw(st.integers(0, 5000), label="gap"), "lost"))
    read_frames(reader, items)  # checks the buffer after every call


@FUZZ
@given(data=st.data())
def test_reader_buffer_bookkeeping_matches_what_it_holds(data):
    """`_have` is the count of bytes held in `_chunks`; `offset` + held bytes = every byte fed or lost so far."""
    frame_list = data.draw(st.lists(ab.frames(max_body=60), min_size=1, max_size=12), label="frames")
    stream, _ = layout(frame_list)
    cuts = data.draw(segmentations(len(stream), max_segments=20), label="chunks")
    reader = FrameReader(from_client=False, at_stream_start=True)
    total = 0
    for a, b in cuts:
        reader.feed(stream[a:b])
        total += b - a
        assert reader._have == buffered(reader), (reader._have, buffered(reader))
        assert reader.offset + buffered(reader) == total
    reader.gap(10)
    assert reader.offset == total + 10


def test_gap_after_a_frame_completed_across_two_feeds_counts_offset_right():
    raw = ab.marshal(commands.Basic.Ack(5), 1)
    reader = FrameReader(from_client=False, at_stream_start=True)
    reader.feed(raw[:10])
    assert reader.feed(raw[10:]) == [ab.split_frame(raw)]
    assert reader._have == 0
    reader.gap(10)
    assert reader.offset == len(raw) + 10


# -- sequence numbers wrapping --------------------------------------------------------------------------

@pytest.mark.parametrize("isn", [SEQ_MOD - 1, SEQ_MOD - 5, SEQ_MOD - 100, SEQ_MOD - 301])
def test_stream_across_sequence_wrap_in_any_order(isn):
    frame_list = ab.with_unique_channels([ab.Frame(*ab.split_frame(ab.marshal(commands.Basic.Ack(i, True))))
                                          for i in range(20)])
    stream, _ = layout(frame_list)
    segments = [(a, min(a + 37, len(stream))) for a in range(0, len(stream), 37)]
    for order in (segments, segments[::-1], segments[1::2] + segments[::2]):
        r = Reassembly(stream, isn, max_pending=1 << 20, syn=True)
        for a, b in order + [(10, 90), (0, len(stream))]:
            r.segment(a, b)
        r.finish()
        assert b"".join(r.items) == stream
        assert read_frames(FrameReader(False, True), r.items)[0] == [f.as_tuple() for f in frame_list]


def test_loss_across_sequence_wrap_is_a_gap_of_the_right_size():
    stream = bytes(range(250)) * 4
    r = Reassembly(stream, isn=SEQ_MOD - 300, max_pending=1 << 20, syn=True)
    r.segment(0, 200)
    r.segment(500, 1000)  # [200, 500) spans the wrap and is lost
    r.ack(1000, times=64)
    r.finish()
    accounted, runs = walk(r.items, stream)
    assert accounted == 1000 and runs == [(0, 200), (500, 1000)]


# -- the mid-stream hunt ------------------------------------------------------------------------------

def test_capture_starting_inside_a_large_message_still_finds_the_frames_after_it():
    """A capture that begins in the middle of a 1 MiB message (eight 128 KiB body frames) must still
    synchronise on the methods after it; the bodies are AMQP, not a foreign protocol."""
    frame_max = 131072
    bodies = [ab.marshal(pamqp_body.ContentBody(bytes([i]) * (frame_max - 8)), 1) for i in range(8)]
    after = [ab.marshal(commands.Basic.Deliver("ctag", 7, False, "", "q"), 1),
             ab.marshal(ab.content_header(3), 1), ab.marshal(pamqp_body.ContentBody(b"abc"), 1),
             ab.marshal(commands.Basic.Ack(7), 1)]
    stream = b"".join(bodies)[1000:] + b"".join(after)
    reader = FrameReader(from_client=False, at_stream_start=False)
    frames, notes = read_frames(reader, [stream[i:i + 1448] for i in range(0, len(stream), 1448)])
    assert not [n for n in notes if isinstance(n, Unsupported)], notes
    assert frames[-4:] == [ab.split_frame(raw) for raw in after]


def test_frames_inside_a_message_body_are_not_taken_for_the_stream():
    """A body that carries AMQP frames (a message that is itself captured traffic) is body bytes:
    hunting after a loss must not yield the frames inside it."""
    inner = ab.marshal(commands.Basic.Ack(999, True), 77) * 3
    frame_list = ab.with_unique_channels([
        ab.Frame(*ab.split_frame(ab.marshal(commands.Basic.Publish(exchange="", routing_key="pcaps")))),
        ab.Frame(*ab.split_frame(ab.marshal(ab.content_header(len(inner) + 20)))),
        ab.Frame(*ab.split_frame(ab.marshal(pamqp_body.ContentBody(b"x" * 20 + inner)))),
        ab.Frame(*ab.split_frame(ab.marshal(commands.Basic.Ack(1)))),
        ab.Frame(*ab.split_frame(ab.marshal(commands.Basic.Ack(2)))),
    ])
    stream, spans = layout(frame_list)
    seen_until = spans[2][0] + 7 + 5  # the body frame's header and 5 bytes of it: its end is known
    lost_until = seen_until + 5       # the loss ends inside the body, before the inner frames
    reader = FrameReader(from_client=False, at_stream_start=True)
    frames, _ = read_frames(reader, [stream[:seen_until], Gap(lost_until - seen_until, "lost"), stream[lost_until:]])
    check_frames(frames, frame_list, spans, [(0, seen_until), (lost_until, len(stream))], from_start=True)


# -- the whole flow table -------------------------------------------------------------------------------

CLIENT = (bytes([10, 0, 0, 1]), 40001)
BROKER = (bytes([10, 0, 0, 2]), 5672)


def client_opening() -> list[bytes]:
    return [HEADER,
            ab.marshal(commands.Connection.StartOk(client_properties={"product": "fuzz"}, mechanism="PLAIN",
                                                   response="\x00guest\x00guest"), 0),
            ab.marshal(commands.Connection.TuneOk(2047, 131072, 60), 0),
            ab.marshal(commands.Connection.Open("/"), 0),
            ab.marshal(commands.Channel.Open(), 1), ab.marshal(commands.Confirm.Select(), 1)]


def broker_opening() -> list[bytes]:
    return [ab.marshal(commands.Connection.Start(server_properties={"product": "RabbitMQ"}), 0),
            ab.marshal(commands.Connection.Tune(2047, 131072, 60), 0),
            ab.marshal(commands.Connection.OpenOk(), 0),
            ab.marshal(commands.Channel.OpenOk(), 1), ab.marshal(commands.Confirm.SelectOk(), 1)]


@st.composite
def traffic(draw, direction: int) -> list[bytes]:
    """Frames one side sends after the opening: content messages, settlements, heartbeats."""
    out = []
    for _ in range(draw(st.integers(0, 12))):
        channel = draw(st.integers(1, 3))
        kind = draw(st.sampled_from(["content", "content", "settle", "heartbeat", "other"]))
        if kind == "content":
            body = draw(st.binary(max_size=400))
            if direction == TO_BROKER:
                method = commands.Basic.Publish(exchange="ex", routing_key=draw(ab.shortstrs), mandatory=draw(st.booleans()))
            else:
                method = commands.Basic.Deliver("ctag", draw(ab.delivery_tags), draw(st.booleans()), "ex", "rk")
            props = draw(st.fixed_dictionaries({}, optional={"message_id": ab.shortstrs, "delivery_mode": st.sampled_from([1, 2]),
                                                             "headers": ab.message_headers}))
            out.append(ab.marshal(method, channel))
            out.append(ab.marshal(ab.content_header(len(body), **props), channel))
            step = draw(st.integers(1, 200))
            out += [ab.marshal(pamqp_body.ContentBody(body[i:i + step]), channel) for i in range(0, len(body), step)]
        elif kind == "settle":
            tag = draw(ab.delivery_tags)
            out.append(ab.marshal(draw(st.sampled_from([commands.Basic.Ack(tag, True), commands.Basic.Nack(tag),
                                                        commands.Basic.Reject(tag)])), channel))
        elif kind == "heartbeat":
            out.append(ab.HEARTBEAT_BYTES)
        else:
            _, obj = draw(ab.methods(["basic.qos", "basic.consume-ok", "queue.declare-ok", "channel.flow",
                                      "basic.cancel", "exchange.declare"]))
            out.append(ab.marshal(obj, channel))
    return out


def method_keys(raw_frames: list[bytes]) -> list[tuple]:
    """(channel, method, delivery tag) of every method frame, in order."""
    out = []
    for raw in raw_frames:
        if raw == HEADER or raw[0] != ab.FRAME_METHOD:
            continue
        _, channel, payload = ab.split_frame(raw)
        name = spec.METHOD_NAMES[int.from_bytes(payload[:4], "big")]
        tag = int.from_bytes(payload[4:12], "big") if name in ("basic.ack", "basic.nack", "basic.reject") else None
        if name == "basic.deliver":
            tag = int.from_bytes(payload[5 + payload[4]:13 + payload[4]], "big")
        out.append((channel, name, tag))
    return out


def is_subsequence(sub: list, seq: list) -> bool:
    it = iter(seq)
    return all(any(x == y for y in it) for x in sub)


class Wire:
    """Both directions of one connection as segments, each acking what the other side had sent."""

    def __init__(self, client_isn: int, broker_isn: int):
        self.next = [client_isn, broker_isn]
        self.ends = (CLIENT, BROKER)
        self.packets: list[Segment] = []

    def _seg(self, direction: int, payload: bytes, flags: int) -> Segment:
        src, dst = self.ends[direction], self.ends[1 - direction]
        seg = Segment(src[0], dst[0], src[1], dst[1], self.next[direction] % SEQ_MOD,
                      self.next[1 - direction] % SEQ_MOD, flags, payload, 0)
        self.packets.append(seg)
        return seg

    def handshake(self) -> None:
        self._seg(TO_BROKER, b"", TCP_SYN).ack = 0
        self.next[TO_BROKER] += 1
        self._seg(TO_CLIENT, b"", TCP_SYN | TCP_ACK)
        self.next[TO_CLIENT] += 1
        self._seg(TO_BROKER, b"", TCP_ACK)

    def send(self, direction: int, data: bytes, size: int) -> None:
        for i in range(0, len(data), size):
            self._seg(direction, data[i:i + size], TCP_ACK)
            self.next[direction] += len(data[i:i + size])

    def fin(self, direction: int) -> None:
        self._seg(direction, b"", TCP_FIN | TCP_ACK)
        self.next[direction] += 1


@st.composite
def conversations(draw):
    sent = {TO_BROKER: client_opening() + draw(traffic(TO_BROKER)), TO_CLIENT: broker_opening() + draw(traffic(TO_CLIENT))}
    wire = Wire(draw(isns), draw(isns))
    wire.handshake()
    queues = {d: list(frames) for d, frames in sent.items()}
    while queues[TO_BROKER] or queues[TO_CLIENT]:
        direction = draw(st.sampled_from([d for d in queues if queues[d]]))
        take = draw(st.integers(1, 4))
        chunk, queues[direction] = b"".join(queues[direction][:take]), queues[direction][take:]
        wire.send(direction, chunk, draw(st.integers(20, 1500)))
    if draw(st.booleans()):
        wire.fin(TO_BROKER)
        wire.fin(TO_CLIENT)
    return sent, wire.packets


def run_flows(packets: list[Segment]) -> tuple[list, list, FlowTable]:
    sink, counts, errors = RowSink(), {}, []
    table = FlowTable(sink=sink, counts=counts, errors=errors, source="fuzz")
    for number, seg in enumerate(packets, 1):
        table.packet(number, 1_700_000_000_000_000_000 + number, seg)
        for conn in table.connections:
            for tcp in conn.tcp:
                assert tcp.pending_bytes <= tcp.max_pending
            for framer in conn.framers:
                assert buffered(framer) <= framer.max_frame + FRAME_SLACK
    table.finish()
    return sink.take().to_pylist(), errors, table


def method_rows(rows: list, direction: int) -> list[tuple]:
    name = ("to_broker", "to_client")[direction]
    real = [r for r in rows if r["direction"] == name and r["method"] in spec.METHOD_IDS]
    return [(r["channel"], r["method"], r.get("delivery_tag") if r["method"] in ("basic.ack", "basic.nack", "basic.reject", "basic.deliver") else None)
            for r in sorted(real, key=lambda r: r["seq"])]


@settings(FUZZ, max_examples=40)
@given(conversation=conversations())
def test_flow_table_decodes_a_clean_capture_exactly(conversation):
    sent, packets = conversation
    rows, errors, table = run_flows(packets)
    assert errors == []
    assert len(table.connections) == 1
    for direction in (TO_BROKER, TO_CLIENT):
        assert method_rows(rows, direction) == method_keys(sent[direction])
    assert not [r for r in rows if r["method"] == spec.CAPTURE_GAP]
    assert all(r["content_complete"] for r in rows if r["method"] in spec.CONTENT_METHODS)
    assert table.connections[0].connection_row()["protocol"] == "amqp-0-9-1"


@settings(FUZZ, max_examples=60)
@given(conversation=conversations(), data=st.data())
def test_flow_table_survives_loss_reordering_and_retransmission(conversation, data):
    sent, packets = conversation
    start = data.draw(st.integers(0, min(6, len(packets) - 1)), label="capture starts at packet")
    captured = []
    for i, seg in enumerate(packets[start:]):
        fate = data.draw(st.sampled_from(["keep"] * 6 + ["drop", "twice"]) if i >= 3 or start else st.just("keep"),
                         label=f"packet {i}")
        if fate != "drop":
            captured.append(seg)
        if fate == "twice":
            captured.append(Segment(seg.src, seg.dst, seg.sport, seg.dport, seg.seq, seg.ack, seg.flags, seg.payload, 0))
    data_packets = [i for i, s in enumerate(captured) if s.payload]
    for i in data.draw(st.lists(st.sampled_from(data_packets), max_size=6), label="swaps") if data_packets else []:
        j = min(i + 1, len(captured) - 1)
        if captured[j].payload:
            captured[i], captured[j] = captured[j], captured[i]

    rows, errors, table = run_flows(captured)

    assert not [e for e in errors if "decoding stopped" in e], errors
    assert not [e for e in errors if "framing error" in e], errors  # a framing error means a wrong resync
    assert not [r for r in rows if r["malformed"]], "a frame that does not decode was taken for a method"
    assert all(r["gap_bytes"] > 0 for r in rows if r["method"] == spec.CAPTURE_GAP), "a capture.gap row of no bytes"
    for direction in (TO_BROKER, TO_CLIENT):
        got, original = method_rows(rows, direction), method_keys(sent[direction])
        assert is_subsequence(got, original), f"{('to_broker', 'to_client')[direction]}: {got} not within {original}"


@settings(FUZZ, max_examples=40)
@given(conversation=conversations(), data=st.data())
def test_flow_table_survives_corrupted_payloads(conversation, data):
    """Bytes damaged on the wire or in the capture file (the TCP layer intact): errors, never a crash."""
    _, packets = conversation
    damaged = []
    for i, seg in enumerate(packets):
        payload = seg.payload
        if payload and data.draw(st.integers(0, 4), label=f"damage packet {i}") == 0:
            payload = mutate(data.draw, payload, 131072)
        damaged.append(Segment(seg.src, seg.dst, seg.sport, seg.dport, seg.seq, seg.ack, seg.flags, payload, 0))
    rows, errors, _ = run_flows(damaged)
    assert not [e for e in errors if "decoding stopped" in e], errors


@settings(FUZZ, max_examples=40)
@given(payloads=st.lists(st.binary(max_size=600), min_size=1, max_size=20), data=st.data())
def test_flow_table_survives_garbage_on_the_broker_port(payloads, data):
    wire = Wire(data.draw(isns), data.draw(isns))
    if data.draw(st.booleans(), label="handshake"):
        wire.handshake()
    for payload in payloads:
        wire.send(data.draw(st.sampled_from([TO_BROKER, TO_CLIENT])), payload or b"\x00", 1500)
    rows, errors, _ = run_flows(wire.packets)
    assert not [e for e in errors if "decoding stopped" in e], errors


def test_x_death_with_a_string_count_keeps_the_message():
    """Any client may publish headers with an x-death entry whose count is not a number: well-formed
    AMQP, so the flow goes on and the message keeps its properties."""
    wire = Wire(100, 200)
    wire.handshake()
    wire.send(TO_BROKER, b"".join(client_opening()), 1400)
    wire.send(TO_CLIENT, b"".join(broker_opening()), 1400)
    wire.send(TO_BROKER, ab.marshal(commands.Basic.Publish(exchange="ex", routing_key="rk"), 1)
              + ab.marshal(ab.content_header(2, message_id="m-1", headers={"x-death": [{"count": "three", "queue": "q"}]}), 1)
              + ab.marshal(pamqp_body.ContentBody(b"hi"), 1)
              + ab.marshal(commands.Basic.Ack(1), 1), 1400)
    rows, errors, _ = run_flows(wire.packets)
    assert not [e for e in errors if "decoding stopped" in e], errors
    assert ("basic.ack", 1) in [(r["method"], r["delivery_tag"]) for r in rows]
    publish = next(r for r in rows if r["method"] == "basic.publish")
    assert publish["content_complete"] and publish["message_id"] == "m-1", errors


def test_syn_seen_again_after_data_is_the_same_connection():
    """A duplicated SYN (same ISN) that the capture shows after the first data is a retransmission,
    not a new connection on a reused port."""
    wire = Wire(100, 200)
    wire.handshake()
    wire.send(TO_BROKER, b"".join(client_opening()[:2]), 1400)
    syn = wire.packets[0]
    packets = wire.packets + [syn]
    wire.packets = []
    wire.send(TO_CLIENT, b"".join(broker_opening()), 1400)
    wire.send(TO_BROKER, b"".join(client_opening()[2:]), 1400)
    rows, errors, table = run_flows(packets + wire.packets)
    assert len(table.connections) == 1, [c.facts["ended_by"] for c in table.connections]
    assert method_rows(rows, TO_BROKER) == method_keys(client_opening())


def test_one_hostile_frame_does_not_lose_the_other_flows_rows():
    """A basic.ack whose tag does not fit the int64 column (the wire has 64 unsigned bits) on one
    connection must not make the batch's conversion to Arrow fail for every connection."""
    hostile, healthy = Wire(100, 200), Wire(5000, 6000)
    hostile.ends = ((bytes([10, 0, 0, 9]), 40009), BROKER)
    for wire in (hostile, healthy):
        wire.handshake()
        wire.send(TO_BROKER, b"".join(client_opening()), 1400)
        wire.send(TO_CLIENT, b"".join(broker_opening()), 1400)
    hostile.send(TO_BROKER, ab.frame_bytes(ab.FRAME_METHOD, 1, struct.pack("!IQB", spec.METHOD_IDS["basic.ack"], 2**64 - 1, 0)), 1400)
    healthy.send(TO_BROKER, ab.marshal(commands.Basic.Ack(1), 1), 1400)
    rows, errors, table = run_flows(hostile.packets + healthy.packets)
    assert len(table.connections) == 2
    assert ("basic.ack", 1) in [(r["method"], r["delivery_tag"]) for r in rows], errors


PASSWORD, SECRET = "pw§-Fuzz-9f1c7", "oauth2-token-77be0d"


def test_credentials_never_reach_rows_facts_or_errors():
    wire = Wire(100, 200)
    wire.handshake()
    opening = client_opening()
    opening[1] = ab.marshal(commands.Connection.StartOk(client_properties={"product": "fuzz"}, mechanism="PLAIN",
                                                        response=f"\x00guest\x00{PASSWORD}"), 0)
    wire.send(TO_BROKER, b"".join(opening), 1400)
    wire.send(TO_CLIENT, b"".join(broker_opening()), 1400)
    update = ab.marshal(commands.Connection.UpdateSecret(SECRET, "token refresh"), 0)
    payload = ab.split_frame(update)[2]
    cut_short = ab.frame_bytes(ab.FRAME_METHOD, 0, payload[:len(payload) // 2])  # inside the secret: an error
    wire.send(TO_BROKER, update + cut_short, 1400)
    rows, errors, table = run_flows(wire.packets)
    assert "connection.update-secret" in [r["method"] for r in rows]
    everything = repr(rows) + repr(errors) + repr([c.connection_row() for c in table.connections])
    for secret in (PASSWORD, SECRET):
        assert secret not in everything and secret.encode().hex() not in everything
