"""The decoder's fast paths against the general paths they shortcut, on the same input.

Each fast path is an optimisation of a rule that has one implementation (the general path); these
tests switch the fast path off, run the same bytes both ways and require the same result, state
included. The method and content-header fast paths are checked against pamqp in test_methods.py.
"""

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from analyzer.connection import AmqpConnection
from analyzer.packets import LINKTYPE_ETHERNET, parse_tcp_segment, tcp_segment
from analyzer.reassembly import SEQ_MOD, TcpDirection

from .test_fuzz import FUZZ, conversations, run_flows


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
        damaged = []
        for seg in packets:
            fate = data.draw(st.sampled_from(["keep"] * 8 + ["drop", "twice", "swap"]))
            if fate == "swap" and damaged:
                damaged.insert(len(damaged) - 1, seg)
            elif fate != "drop":
                damaged.append(seg)
            if fate == "twice":
                damaged.append(seg)
        packets = damaged
    with pytest.MonkeyPatch.context() as patched:
        (fast_rows, fast_errors, fast_table) = run_flows(packets)
        patched.setattr(AmqpConnection, "_whole_message", lambda self, *args: False)
        (rows, errors, table) = run_flows(packets)
    assert fast_rows == rows
    assert fast_errors == errors
    assert [c.connection_row() for c in fast_table.connections] == [c.connection_row() for c in table.connections]
    assert fast_table.counts == table.counts
