"""The password in the SASL response (PLAIN's "\\0user\\0password", AMQPLAIN's LOGIN/PASSWORD table)
blanked in raw packets before `--pcap-out` writes them (DESIGN.md: credentials are never stored).
Sans-IO: captured packets in, the same packets out, the password's bytes zeroed in place, every
length kept, so Wireshark and `ackscope ingest` still decode every frame, connection.start-ok
included, and the user name with it: PLAIN's bytes after its second NUL are zeroed, AMQPLAIN's
PASSWORD value; any other mechanism's response, or one that does not parse, is zeroed whole.

A client's first frame after the protocol header is connection.start-ok, whose response follows
its client properties (a table of any length: a 100 KB connection_name spans many segments) and
its mechanism. Per client stream, the few fields that place the response are read as the bytes
arrive, by stream offset (TCP sequence numbers from the SYN, or from a segment opening with the
protocol header): the frame header and the table's length, the mechanism, the response's length;
then the response itself, until the password in it is placed. Every segment of that stream
overlapping the password, retransmissions included, is blanked there; a segment holding response
bytes that pass before the password is placed (the response cut between segments) has all of
them blanked. A segment that comes ahead of a gap while the password is not placed yet is blanked
whole (its bytes kept aside to place it): it might hold the password, and a capture with a hole in
one handshake is better than a password on disk.
"""

from __future__ import annotations

import struct

from ..packets import TCP_ACK, TCP_FIN, TCP_RST, TCP_SYN, tcp_segment

PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
START_OK = struct.pack("!BH", 1, 0), struct.pack("!HH", 10, 11)  # method frame on channel 0; connection.start-ok
SEQ_MOD = 1 << 32
MAX_FLOWS = 65_536          # client streams followed at once; the oldest is forgotten beyond
# Bytes kept aside, over all streams, while gaps before them are unfilled. Beyond, a segment ahead of
# a gap is blanked whole and not kept: its stream cannot place its response any more, so every later
# segment of its handshake is blanked whole too (safe, and only under a flood of reordered openings).
MAX_AHEAD_BYTES = 16 << 20
# A response longer than this is zeroed whole, unread (PLAIN's and AMQPLAIN's are tens of bytes).
MAX_READ_RESPONSE = 64 << 10


class _PlainPassword:
    """PLAIN (RFC 4616): authzid NUL authcid NUL password; the password is what follows the second
    NUL (as RabbitMQ reads it). `read` takes the response's bytes in order, each at its offset in
    the response: the password's offset once known."""

    def __init__(self):
        self.nuls = 0

    def read(self, at: int, data: bytes) -> int | None:
        for i, byte in enumerate(data):
            if byte == 0:
                self.nuls += 1
                if self.nuls == 2:
                    return at + i + 1
        return None


class _AmqplainPassword:
    """AMQPLAIN: a field table without its length prefix, LOGIN and PASSWORD long strings; the
    PASSWORD value's [start, end) in the response once its length is read. Any other value type is
    not followed: the response is then zeroed whole (`refused`)."""

    def __init__(self):
        self.want, self.left, self.name, self.field = "name length", 0, bytearray(), bytearray()
        self.refused = False

    def read(self, at: int, data: bytes) -> tuple[int, int] | None:
        for i, byte in enumerate(data):
            if self.want == "name length":
                self.want, self.left, self.name = ("name", byte, bytearray()) if byte else ("type", 0, bytearray())
            elif self.want == "name":
                self.name.append(byte)
                self.left -= 1
                if not self.left:
                    self.want = "type"
            elif self.want == "type":
                if byte != ord("S"):
                    self.refused = True
                    return None
                self.want, self.field = "value length", bytearray()
            elif self.want == "value length":
                self.field.append(byte)
                if len(self.field) == 4:
                    length = struct.unpack("!I", self.field)[0]
                    if self.name == b"PASSWORD":
                        return at + i + 1, at + i + 1 + length
                    self.want, self.left = ("value", length) if length else ("name length", 0)
            else:  # a value skipped
                self.left -= 1
                if not self.left:
                    self.want = "name length"
        return None


class _Stream:
    """One client stream: where its start-ok's fields are, then where its response is, then where
    the password in it is."""

    __slots__ = ("base", "seen_to", "field", "step", "lengths", "response", "password", "reader", "ahead")

    def __init__(self, base: int):
        self.base = base              # sequence number of stream offset 0
        self.seen_to = 0              # every byte before this offset has been read
        self.step = 0                 # the field wanted: 0 header to table length, 1 mechanism length,
        #                               2 mechanism and response length
        self.field = bytearray()
        self.lengths: list[int] = []
        self.response: tuple[int, int] | None = None   # [start, end) stream offsets, once placed
        self.password: tuple[int, int] | None = None   # [start, end) stream offsets of what to zero, once placed
        self.reader: _PlainPassword | _AmqplainPassword | None = None
        self.ahead: dict[int, bytes] = {}

    def wanted(self) -> tuple[int, int]:
        """[start, end) of the field read next."""
        if self.step == 0:
            return 0, 23
        table = self.lengths[0]
        if self.step == 1:
            return 23 + table, 24 + table
        return 24 + table, 28 + table + self.lengths[1]

    def read(self, at: int, data: bytes) -> bool:
        """Contiguous bytes from `at` (== seen_to); False once the stream is not an AMQP 0-9-1 opening."""
        self.seen_to = at + len(data)
        while self.response is None:
            start, end = self.wanted()
            if self.seen_to <= start:
                return True
            if at >= end:  # cannot happen: the field was wanted before these bytes came
                return False
            lo = max(start, at)
            self.field += data[lo - at:min(end, self.seen_to) - at]
            if len(self.field) < end - start:
                return True
            field, self.field = bytes(self.field), bytearray()
            if self.step == 0:
                if field[:8] != PROTOCOL_HEADER or field[8:11] != START_OK[0] or field[15:19] != START_OK[1]:
                    return False
                self.lengths.append(struct.unpack_from("!I", field, 19)[0])
            elif self.step == 1:
                self.lengths.append(field[0])
            else:
                self._place(end, field[:-4], struct.unpack("!I", field[-4:])[0])
            self.step += 1
        if self.password is None:
            self._read_response(at, data)
        return True

    def _place(self, start: int, mechanism: bytes, length: int) -> None:
        self.response = start, start + length
        readers = {b"PLAIN": _PlainPassword, b"AMQPLAIN": _AmqplainPassword}
        if mechanism not in readers or length > MAX_READ_RESPONSE:
            self.password = self.response   # not read: zeroed whole
        else:
            self.reader = readers[mechanism]()

    def _read_response(self, at: int, data: bytes) -> None:
        """The response's bytes among `data` (from stream offset `at`) read until its password is placed."""
        start, end = self.response
        lo, hi = max(start, at), min(end, self.seen_to)
        found = self.reader.read(lo - start, data[lo - at:hi - at]) if lo < hi else None
        if isinstance(found, int):           # PLAIN: the password runs to the response's end
            self.password = start + found, end
        elif found is not None:              # AMQPLAIN: PASSWORD's value
            self.password = start + found[0], min(start + found[1], end)
        elif getattr(self.reader, "refused", False) or self.seen_to >= end:
            self.password = self.response    # not understood, or no password found in it: zeroed whole
        if self.password is not None:
            self.reader = None


class SaslBlanker:
    def __init__(self, linktype: int):
        self.linktype = linktype
        self.streams: dict[tuple, _Stream] = {}
        self.ahead_bytes = 0   # kept aside in all streams' `ahead`
        self.blanked = 0       # segments with response bytes zeroed

    def packet(self, data: bytes) -> bytes:
        """The packet as it may be written: `data` itself, or a copy with response bytes zeroed."""
        seg = tcp_segment(self.linktype, data)
        if seg is None:
            return data
        key = (seg.src, seg.sport, seg.dst, seg.dport)
        if seg.flags & (TCP_FIN | TCP_RST):
            self._forget(key)
            self._forget((seg.dst, seg.dport, seg.src, seg.sport))
        stream = self.streams.get(key)
        if stream is None:
            if seg.flags & TCP_SYN and not seg.flags & TCP_ACK:
                self._follow(key, (seg.seq + 1) % SEQ_MOD)
            elif seg.payload.startswith(PROTOCOL_HEADER):  # the SYN was not captured: the header says where
                stream = self._follow(key, seg.seq)
            if stream is None:
                return data
        if not seg.payload:
            return data
        at = (seg.seq - stream.base) % SEQ_MOD
        whole = False
        if stream.response is None or (stream.password is None and _overlap(stream.response, at, seg.payload)):
            whole = not self._read(key, stream, at, seg.payload)
        if key not in self.streams:   # not an AMQP 0-9-1 opening: nothing to blank
            return data
        if whole:
            return self._blank(data, seg.payload, 0, len(seg.payload))
        if stream.response is None:  # not placed yet, so every byte read so far comes before it
            return data
        # Its password, or while that is not placed yet, all of the response this segment holds.
        start, end = stream.password if stream.password is not None else stream.response
        lo, hi = max(start, at), min(end, at + len(seg.payload))
        return self._blank(data, seg.payload, lo - at, hi - at) if lo < hi else data

    def _forget(self, key: tuple) -> None:
        stream = self.streams.pop(key, None)
        if stream is not None:
            self.ahead_bytes -= sum(map(len, stream.ahead.values()))

    def _follow(self, key: tuple, base: int) -> _Stream:
        if len(self.streams) >= MAX_FLOWS:
            self._forget(next(iter(self.streams)))
        stream = self.streams[key] = _Stream(base)
        return stream

    def _read(self, key: tuple, stream: _Stream, at: int, payload: bytes) -> bool:
        """Read a segment into the stream's fields; False if it came ahead of a gap (blank it whole)."""
        if at > stream.seen_to:
            if self.ahead_bytes + len(payload) <= MAX_AHEAD_BYTES and at not in stream.ahead:
                stream.ahead[at] = payload
                self.ahead_bytes += len(payload)
            return False
        pending = [(at, payload)]
        while pending:
            at, payload = pending.pop()
            if at + len(payload) > stream.seen_to:
                if not stream.read(stream.seen_to, payload[stream.seen_to - at:]):
                    self._forget(key)
                    return True
            for ahead_at in sorted(a for a in stream.ahead if a <= stream.seen_to):
                pending.append((ahead_at, stream.ahead.pop(ahead_at)))
                self.ahead_bytes -= len(pending[-1][1])
        return True

    def _blank(self, data: bytes, payload: bytes, lo: int, hi: int) -> bytes:
        offset = _payload_offset(data, payload)
        if offset is None:  # cannot place it (cannot happen for a payload tcp_segment cut from data)
            return data
        out = bytearray(data)
        out[offset + lo:offset + hi] = bytes(hi - lo)
        self.blanked += 1
        return bytes(out)


def _overlap(span: tuple[int, int], at: int, payload: bytes) -> bool:
    return span[0] < at + len(payload) and at < span[1]


def _payload_offset(data: bytes, payload: bytes) -> int | None:
    """Where tcp_segment cut the payload from: it ends the packet, but for the padding Ethernet
    adds to a frame shorter than 60 bytes (or a snap length cut, where it ends the packet too)."""
    n, size = len(data), len(payload)
    for offset in range(n - size, max(n - size - 60, -1), -1):
        if data[offset:offset + size] == payload:
            return offset
    return None
