"""The decoder's fast paths against the general paths they shortcut, on the same input.

Each fast path is an optimisation of a rule that has one implementation (the general path); these
tests switch the fast path off, run the same bytes both ways and require the same result, state
included. The method and content-header fast paths are checked against pamqp in test_methods.py.
"""

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pamqp import body as pamqp_body
from pamqp import commands

from analyzer.connection import TO_BROKER, TO_CLIENT, AmqpConnection
from analyzer.packets import LINKTYPE_ETHERNET, parse_tcp_segment, tcp_segment
from analyzer.reassembly import SEQ_MOD, TcpDirection

from . import amqp_bytes as ab
from .test_fuzz import FUZZ, Wire, broker_opening, client_opening, conversations, isns, run_flows


# -- link, IP and TCP headers ------------------------------------------------------------------------

@st.composite
def ethernet_packets(draw):
    """Ethernet frames that are mostly IPv4 + TCP without options, with every field the fast path
    checks sometimes off: other ethertypes, IP options, fragments, other protocols, odd lengths."""
    ethertype = draw(st.sampled_from([0x0800] * 6 + [0x86DD, 0x8100, 0x0806]))
    vihl = draw(st.sampled_from([0x45] * 6 + [0x46, 0x4F, 0x44, 0x65]))
    payload = draw(st.binary(max_size=80))
    options = b"\x01" * ((vihl & 0x0F) * 4 - 20) if (vihl & 0x0F) >= 5 else b""
    tcp_options = draw(st.sampled_from([b"", b"\x01" * 12]))
    data_off = draw(st.sampled_from([(20 + len(tcp_options)) // 4, 5, 0, 15]))
    exact_total = 20 + len(options) + 20 + len(tcp_options) + len(payload)
    total = draw(st.sampled_from([exact_total] * 4 + [0, exact_total - 3, exact_total + 10, 20]))
    frag = draw(st.sampled_from([0, 0, 0x4000, 0x2000, 0x0001, 0x8000]))
    proto = draw(st.sampled_from([6] * 6 + [17, 1]))
    flags = draw(st.integers(0, 0xFF))
    ip = struct.pack("!BBHHHBBH4s4s", vihl, 0, total & 0xFFFF, 7, frag, 64, proto, 0, b"\x0a\x00\x00\x01", b"\x0a\x00\x00\x02")
    tcp = struct.pack("!HHIIBBHHH", draw(st.integers(0, 0xFFFF)), 5672, draw(st.integers(0, SEQ_MOD - 1)),
                      draw(st.integers(0, SEQ_MOD - 1)), data_off << 4, flags, 512, 0, 0)
    frame = b"\x00" * 12 + struct.pack("!H", ethertype) + ip + options + tcp + tcp_options + payload
    frame += b"\x00" * draw(st.sampled_from([0, 0, 6]))  # Ethernet padding of short frames
    return frame[:draw(st.integers(0, len(frame)))] if draw(st.booleans()) else frame  # snap length


@settings(max_examples=400, deadline=None, derandomize=True, database=None)
@given(packet=ethernet_packets())
def test_tcp_segment_fast_path_gives_what_the_general_path_gives(packet):
    assert tcp_segment(LINKTYPE_ETHERNET, packet) == parse_tcp_segment(LINKTYPE_ETHERNET, packet)


# -- TCP reassembly ----------------------------------------------------------------------------------

def _state(direction: TcpDirection) -> dict:
    return {name: getattr(direction, name) for name in TcpDirection.__slots__}


@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(data=st.data())
def test_in_order_reassembly_fast_path_gives_what_the_general_path_gives(data):
    """Segments mostly in order, some repeated, reordered, cut short or carrying SYN/FIN: the fast
    path (in order, nothing buffered) must deliver and leave state exactly as the general path."""
    fast, general = TcpDirection(max_pending=600), TcpDirection(max_pending=600)
    seq = data.draw(st.integers(0, SEQ_MOD - 1), label="isn")
    sent = []
    for _ in range(data.draw(st.integers(1, 30), label="segments")):
        kind = data.draw(st.sampled_from(["next"] * 6 + ["again", "skip", "syn", "fin", "missing", "empty"]))
        payload = data.draw(st.binary(min_size=1, max_size=200))
        if kind == "again" and sent:
            args = data.draw(st.sampled_from(sent))
        elif kind == "skip":
            args = ((seq + len(payload)) % SEQ_MOD, payload, False, False, 0)
        else:
            args = (seq, b"" if kind == "empty" else payload, kind == "syn", kind == "fin",
                    data.draw(st.integers(1, 50)) if kind == "missing" else 0)
            seq = (seq + len(args[1]) + args[4] + (kind == "syn")) % SEQ_MOD
        sent.append(args)
        assert fast.segment(*args) == general._segment_general(*args)
        assert _state(fast) == _state(general)


# -- whole messages in one piece of the stream ------------------------------------------------------

@settings(FUZZ, max_examples=60)
@given(conversation=conversations(), data=st.data())
def test_whole_message_fast_path_gives_what_the_general_path_gives(conversation, data):
    """Clean captures, and the same with packets dropped, repeated and swapped: every row, count,
    error and connection fact must be what method + header + body frames one by one give."""
    sent, packets = conversation
    if data.draw(st.booleans(), label="damage it"):
        packets = _damaged(packets, data)
    with pytest.MonkeyPatch.context() as patched:
        (fast_rows, fast_errors, fast_table) = run_flows(packets)
        patched.setattr(AmqpConnection, "_whole_message", lambda self, *args: False)
        (rows, errors, table) = run_flows(packets)
    assert fast_rows == rows
    assert fast_errors == errors
    assert [c.connection_row() for c in fast_table.connections] == [c.connection_row() for c in table.connections]
    assert fast_table.counts == table.counts


# -- runs of identically shaped messages (analyzer/runs.py) ------------------------------------------

@st.composite
def message_streams(draw, direction: int) -> list[bytes]:
    """Frames of a busy stream: messages of a few shapes over and over, the way publishers and
    consumers send them, with what breaks a run mixed in: another body size or flag, a body in two
    frames, a tag beyond int64, a message cut short (no body), settlements and heartbeats."""
    shapes = []
    for _ in range(draw(st.integers(1, 3), label="shapes")):
        props = draw(st.fixed_dictionaries({}, optional={"message_id": st.sampled_from(["m-1", ""]),
                                                         "delivery_mode": st.sampled_from([1, 2])}))
        shapes.append((draw(st.integers(1, 2)), draw(st.sampled_from(["rk", "other-key"])), props,
                       draw(st.integers(1, 60))))
    same_body = draw(st.booleans(), label="bodies repeat")
    tag = draw(st.sampled_from([1, 2**63 - 50]), label="first tag")  # at most 40 messages: tags stay in int64
    out = []
    for _ in range(draw(st.integers(1, 40), label="messages")):
        channel, routing_key, props, body_size = draw(st.sampled_from(shapes))
        odd = draw(st.sampled_from(["none"] * 12 + ["size", "redelivered", "split", "huge tag", "cut", "ack",
                                                    "heartbeat"]))
        if odd == "size":
            body_size += 1
        body = b"x" * body_size if same_body else draw(st.binary(min_size=body_size, max_size=body_size))
        tag += 1
        if direction == TO_BROKER:
            method = commands.Basic.Publish(exchange="ex", routing_key=routing_key)
        else:
            method = commands.Basic.Deliver("ctag", tag, odd == "redelivered", "ex", routing_key)
        raw = ab.marshal(method, channel)
        if odd == "huge tag" and direction == TO_CLIENT:  # pamqp will not encode it: 7 + 4 + 5 bytes in
            raw = raw[:16] + b"\xff" * 8 + raw[24:]
        out.append(raw)
        out.append(ab.marshal(ab.content_header(body_size, **props), channel))
        if odd == "split":
            out += [ab.marshal(pamqp_body.ContentBody(body[:1]), channel),
                    ab.marshal(pamqp_body.ContentBody(body[1:]), channel)]
        elif odd != "cut":
            out.append(ab.marshal(pamqp_body.ContentBody(body), channel))
        if odd == "ack":
            out.append(ab.marshal(commands.Basic.Ack(tag, True), channel))
        elif odd == "heartbeat":
            out.append(ab.HEARTBEAT_BYTES)
    return out


@st.composite
def busy_conversations(draw):
    sent = {TO_BROKER: client_opening() + draw(message_streams(TO_BROKER)),
            TO_CLIENT: broker_opening() + draw(message_streams(TO_CLIENT))}
    wire = Wire(draw(isns), draw(isns))
    wire.handshake()
    queues = {d: list(frames) for d, frames in sent.items()}
    while queues[TO_BROKER] or queues[TO_CLIENT]:
        direction = draw(st.sampled_from([d for d in queues if queues[d]]))
        take = draw(st.integers(1, 40))
        chunk, queues[direction] = b"".join(queues[direction][:take]), queues[direction][take:]
        wire.send(direction, chunk, draw(st.sampled_from([40, 300, 1500, 65000])))
    if draw(st.booleans()):
        wire.fin(TO_BROKER)
        wire.fin(TO_CLIENT)
    return sent, wire.packets


def _damaged(packets: list, data) -> list:
    """The same packets with some dropped, repeated and swapped, as captures do."""
    out = []
    for seg in packets:
        fate = data.draw(st.sampled_from(["keep"] * 8 + ["drop", "twice", "swap"]))
        if fate == "swap" and out:
            out.insert(len(out) - 1, seg)
        elif fate != "drop":
            out.append(seg)
        if fate == "twice":
            out.append(seg)
    return out


def _decoded_both_ways(packets: list, *switched_off: str) -> tuple:
    """run_flows with message runs, and without them (and without what else is named)."""
    with pytest.MonkeyPatch.context() as patched:
        fast = run_flows(packets)
        patched.setattr(AmqpConnection, "_shape", lambda self, *args: None)  # no shape, no runs
        for name in switched_off:
            patched.setattr(AmqpConnection, name, lambda self, *args: False)
        general = run_flows(packets)
    return fast, general


def _assert_same(fast: tuple, general: tuple) -> None:
    (fast_rows, fast_errors, fast_table), (rows, errors, table) = fast, general
    assert fast_rows == rows
    assert fast_errors == errors
    assert [c.connection_row() for c in fast_table.connections] == [c.connection_row() for c in table.connections]
    assert fast_table.counts == table.counts


@settings(FUZZ, max_examples=120)
@given(conversation=busy_conversations(), data=st.data())
def test_message_runs_give_what_frame_by_frame_decoding_gives(conversation, data):
    """Clean and damaged captures of busy streams: runs cut by the framer must give every row (in
    order), count, error and connection fact that the frames decoded one by one give, with and
    without the whole-message path."""
    sent, packets = conversation
    if data.draw(st.booleans(), label="damage it"):
        packets = _damaged(packets, data)
    fast, general = _decoded_both_ways(packets)
    _assert_same(fast, general)
    _assert_same(fast, _decoded_both_ways(packets, "_whole_message")[1])


@settings(FUZZ, max_examples=40)
@given(conversation=conversations(), data=st.data())
def test_message_runs_on_mixed_traffic_give_what_frame_by_frame_decoding_gives(conversation, data):
    sent, packets = conversation
    if data.draw(st.booleans(), label="damage it"):
        packets = _damaged(packets, data)
    _assert_same(*_decoded_both_ways(packets))


def test_a_run_really_is_cut_from_a_busy_stream():
    """The differential tests above would pass if runs never happened: make sure they do."""
    messages = []
    for tag in range(1, 51):
        messages += [ab.marshal(commands.Basic.Deliver("ctag", tag, False, "ex", "rk"), 1),
                     ab.marshal(ab.content_header(5), 1), ab.marshal(pamqp_body.ContentBody(b"hello"), 1)]
    wire = Wire(1000, 2000)
    wire.handshake()
    wire.send(TO_BROKER, b"".join(client_opening()), 1500)
    wire.send(TO_CLIENT, b"".join(broker_opening()), 1500)
    wire.send(TO_CLIENT, b"".join(messages[:3]), 65000)  # decoded whole: the shape is learnt from it
    wire.send(TO_CLIENT, b"".join(messages[3:]), 65000)
    seen = []
    with pytest.MonkeyPatch.context() as patched:
        real = AmqpConnection._message_run
        patched.setattr(AmqpConnection, "_message_run", lambda self, d, run: seen.append(len(run.bodies)) or real(self, d, run))
        rows, errors, _ = run_flows(wire.packets)
    assert errors == [] and seen == [8, 16, 25]  # each cut tries twice the run before (runs.MessageShape.cut)
    delivers = [r for r in rows if r["method"] == "basic.deliver"]
    assert [r["delivery_tag"] for r in delivers] == list(range(1, 51))
    assert [r["seq"] for r in delivers] == sorted(r["seq"] for r in delivers)
