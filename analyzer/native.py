"""The native lane: the usual packets of a capture decoded in C (analyzer/_lane.c), the rest in Python.

Profiles of the Python decoder are flat: ~5 µs of interpreter per packet, spread over reading the
record, the headers, the flow look-up, reassembly, framing and the frame itself. The lane does all
of that in one C loop for the packets that need nothing unusual, and leaves everything else to the
Python path, which stays the reference (tests/test_native_lane.py runs both and compares).

A connection is *armed* (handed to the lane) after Python decoded one of its packets and left it
in a plain state: AMQP 0-9-1 on IPv4, both directions in order with nothing buffered out of order,
no FIN seen, both frame readers between frames (a partial frame may wait), no content open. From
then on the lane takes the connection's packets itself, making the rows Python would make (kept as
columns, which RowSink.take adds to the batch), with the connection's own decode memo, until a packet it does not take:

- a packet it does not take at all (SYN/FIN/RST, out of order, an ACK for bytes not seen, a
  header layout other than untagged Ethernet + IPv4 + TCP, ...) reaches `packet()` below, which
  takes the connection back (`_take_back`) before FlowTable decodes the packet;
- a frame it does not take (heartbeat, any method but ack/nack/reject and the content methods,
  a frame that does not decode, a lost frame boundary): the lane hands the connection back as of
  that frame boundary, and Python feeds it the rest of the stream bytes (`FlowTable.resume`).

A connection inside TLS is armed once its TLS layer is in its plain state too (past the handshake,
decrypting both directions, nothing held or lost: TlsLayer.lane_openers): the lane cuts the stream
into records itself and hands each record to the layer's opener (Python, `cryptography`), then frames
the plaintext as above. A record it does not take (another content type, one that does not open, a
KeyUpdate) hands the connection back from that record's first byte; a frame it does not take, as of
that frame boundary, with the rest of the record's plaintext and the stream bytes after the record
apart. A TLS connection that will never be decrypted is never armed (`_python_only`).

After every packet Python decodes, its connection is armed again if it is plain again.
ACKSCOPE_PURE_PYTHON=1 switches the lane off; without the compiled module there is no lane.
"""


from . import pure_python, spec
from .connection import PendingContent, body_digests, incomplete_identity
from .framing import FRAMES
from .methods import NO_PROPERTIES
from .rows import LANE_ACK_METHODS, LANE_CONTENT_METHODS

try:
    from . import _lane
except ImportError:  # not compiled (setup.py marks it optional): the Python path does everything
    _lane = None

BATCH = 1024  # packets per lane call at most: decode() flushes row batches at multiples of this
_TICKS_LIMIT = 1 << 64


def available() -> bool:
    return _lane is not None


def enabled() -> bool:
    return _lane is not None and not pure_python()


def _flow_key(src: bytes, sport: int, dst: bytes, dport: int) -> bytes:
    """A flow key as the lane reads it from the IPv4 and TCP headers."""
    return src + dst + sport.to_bytes(2, "big") + dport.to_bytes(2, "big")


class NativeLane:
    """The lane of one decode, in front of its FlowTable."""

    def __init__(self, flows):
        self.flows = flows
        self.engine = _lane.Engine(
            flows.counts, LANE_ACK_METHODS, LANE_CONTENT_METHODS, (spec.CONTENT_HEADER, spec.CONTENT_BODY, "frames_to_broker", "frames_to_client",
             "bytes_to_broker", "bytes_to_client"),
            body_digests, incomplete_identity, NO_PROPERTIES)
        flows.sink.lane = self.engine  # its rows, kept as columns, join the batch at RowSink.take
        self._interfaces = (None, 0, ())
        self._python_only: set = set()  # connections the lane never takes (TLS not decrypted), let go of already

    # -- records: what capture_file hands the lane ---------------------------------------------------

    def pcapng(self, buf: bytes, pos: int, number: int, interfaces: list) -> tuple:
        """Packets of little-endian Enhanced Packet Blocks from `pos` on: (pos, number, last
        timestamp or None if none was taken, captured bytes taken)."""
        pos, number, last_ts, nbytes, handback = self.engine.pcapng(
            buf, pos, number, self._lane_interfaces(interfaces), BATCH - (number % BATCH))
        if handback is not None:
            self._take_back(handback)
        return pos, number, last_ts, nbytes

    def pcap(self, buf: bytes, pos: int, number: int, linktype: int, nanos: bool) -> tuple:
        pos, number, last_ts, nbytes, handback = self.engine.pcap(
            buf, pos, number, linktype, nanos, BATCH - (number % BATCH))
        if handback is not None:
            self._take_back(handback)
        return pos, number, last_ts, nbytes

    def _lane_interfaces(self, interfaces: list) -> tuple:
        """((linktype, ticks per second), ...); ticks 0 where they do not fit in 64 bits (the lane
        leaves those packets to Python). Converted again only when the list changes."""
        key = (id(interfaces), len(interfaces))
        if self._interfaces[:2] != key:
            converted = tuple((linktype, ticks if ticks < _TICKS_LIMIT else 0) for linktype, ticks, _ in interfaces)
            self._interfaces = key + (converted,)
        return self._interfaces[2]

    # -- packets Python decodes ----------------------------------------------------------------------

    def packet(self, number: int, ts_ns: int, seg) -> None:
        """FlowTable.packet, with the connection taken back from the lane before and armed again after.
        A TLS connection that will not be decrypted is never armed (see `_arm`): once the lane let go
        of it, its packets go straight to FlowTable, without the look-ups that would find nothing to
        hand over."""
        flow = (seg.src, seg.sport, seg.dst, seg.dport)
        entry = self.flows.flows.get(flow)
        if entry is not None and entry[0] in self._python_only:
            self.flows.packet(number, ts_ns, seg)
            after = self.flows.flows.get(flow)
            if after is not None and after[0] is not entry[0]:  # a new connection on the same ports
                self._arm(after[0])
            return
        ipv4 = len(seg.src) == 4
        if ipv4:
            state = self.engine.release(_flow_key(seg.src, seg.sport, seg.dst, seg.dport))
            if state is not None:
                self._take_back(state)
        self.flows.packet(number, ts_ns, seg)
        if ipv4:
            entry = self.flows.flows.get(flow)
            if entry is not None:
                self._arm(entry[0])
            elif flow in self.flows.ignored:
                self.engine.ignore(_flow_key(*flow))

    def finish(self) -> None:
        """Take every connection back, before FlowTable.finish closes them."""
        for state in self.engine.release_all():
            self._take_back(state)

    def next_file(self) -> None:
        """Every connection taken back at the end of a file of a capture in pieces (pieces.py): the
        next file names itself in their rows, and brings interfaces of its own (the cache is keyed
        by the list's identity, which a new list may reuse)."""
        self.finish()
        self._interfaces = (None, 0, ())

    # -- handing connections over and back -------------------------------------------------------------

    def _arm(self, conn) -> None:
        keys = (_flow_key(*conn.client_end, *conn.server_end), _flow_key(*conn.server_end, *conn.client_end))
        tls = conn.tls
        if tls is not None and tls.settled_in_python:
            self._forget(keys)
            self._python_only.add(conn)  # for good: a connection's TLS layer stays, and stays so
            return
        if conn.finished or conn.content or conn.facts["protocol"] != "amqp-0-9-1" or len(conn.client_end[0]) != 4:
            self._forget(keys)
            return
        openers = tls.lane_openers() if tls is not None else None
        if tls is not None and openers is None:
            self._forget(keys)
            return
        lanes = []
        for tcp, framer in zip(conn.tcp, conn.framers):
            if (tcp.next_seq is None or tcp.pending or tcp.fin_seq is not None or framer.state != FRAMES
                    or framer._skip):
                self._forget(keys)
                return
            lanes.append((tcp.next_seq, tcp.unseen_acks, b"".join(framer._chunks), framer.offset, framer.max_frame))
        inside_tls = () if tls is None else (openers + (tls.readers[0].buf, tls.readers[1].buf),)
        self.engine.arm(conn, conn.index, conn.seq, keys[0], keys[1], lanes[0], lanes[1], conn.facts, conn.memo,
                        *inside_tls)

    def _forget(self, keys) -> None:
        for key in keys:  # a flow Python ignored before it became this connection's
            self.engine.forget(key)

    def _take_back(self, state: tuple) -> None:
        """The connection's state as the lane left it, put back where the Python path keeps it."""
        conn, seq, ts_ns, packet, lane0, lane1, pending, resume = state
        conn.seq = seq
        if packet >= 0:
            conn.ts_ns, conn.packet = ts_ns, packet
        tls = conn.tls
        for d, (next_seq, unseen_acks, carry, offset, records, opened) in enumerate((lane0, lane1)):
            tcp, framer = conn.tcp[d], conn.framers[d]
            if tls is not None:  # as RecordReader.feed leaves it: the start of a record, or nothing
                tls.readers[d].buf = records
                tls.records += opened
            tcp.next_seq, tcp.unseen_acks = next_seq, unseen_acks
            framer.offset = offset
            if carry:  # as FrameReader._keep leaves it: a frame header read, or fewer than 8 bytes
                frame_len = int.from_bytes(carry[3:7], "big") + 8 if len(carry) >= 8 else 0
                framer._chunks, framer._have, framer._need, framer._frame_len = [carry], len(carry), frame_len or 8, frame_len
            else:
                framer._chunks, framer._have, framer._frame_len = [], 0, 0
        for direction, channel, row, body_size, received, properties, body in pending:
            content = PendingContent(row)
            if properties is not None:
                content.body_size, content.properties = body_size, properties
                content.add_body(body)
            conn.content[(direction, channel)] = content
        if resume is not None:
            direction, rest, wire = resume
            self.flows.resume(conn, direction, rest, packet, wire)
            self._arm(conn)


def lane_for(flows) -> NativeLane | None:
    """The native lane for this FlowTable, or None when it is not built or switched off."""
    return NativeLane(flows) if enabled() else None
