"""Packets from a pcap or pcapng file: the I/O shell around the sans-IO core for offline captures.

A lean reader of our own: profiling showed scapy's RawPcapReader/RawPcapNgReader (a read call
and a namedtuple per packet) costing more than all of TCP reassembly on chatty captures, so the
file is read in large blocks and records are cut out with precompiled structs. scapy remains the
writer in tests and the live capture socket. A corrupt or truncated file raises
`CaptureFileError` naming the file and the packet, after every complete packet before the damage
has been yielded, so callers keep (and commit) what was read.
"""

from collections.abc import Iterator
from struct import Struct

PCAP_MAGICS = {  # magic bytes -> (byte order, nanosecond timestamps)
    b"\xa1\xb2\xc3\xd4": (">", False), b"\xd4\xc3\xb2\xa1": ("<", False),
    b"\xa1\xb2\x3c\x4d": (">", True), b"\x4d\x3c\xb2\xa1": ("<", True),
}
PCAPNG_MAGIC = b"\x0a\x0d\x0d\x0a"
MAX_RECORD = 1 << 18   # dumpcap's default snap length; a longer record means a corrupt header
READ_SIZE = 4 << 20    # bytes read per system call

# pcapng block types
SHB, IDB, PB_OBSOLETE, SPB, EPB = 0x0A0D0D0A, 1, 2, 3, 6


class CaptureFileError(Exception):
    """The capture file is unreadable, or damaged part way (the file's fault, not the traffic's)."""

    def __init__(self, message: str, damaged: bool = False):
        super().__init__(message)
        self.damaged = damaged  # True: packets before the damage were read and are good


def read_packets(path: str, lane=None, read_size: int = READ_SIZE) -> Iterator[tuple[int, int, int | None, bytes | int]]:
    """Yield (packet number from 1, timestamp ns, link type, bytes) for every packet of a capture file.

    With a native lane (native.NativeLane), the packets it takes are decoded by it and not yielded:
    after each stretch of them comes (number of the last, its timestamp, None, their captured bytes).
    `read_size`: bytes read per system call (a small one for a look at the first packets)."""
    try:
        f = open(path, "rb")
    except OSError as exc:
        raise CaptureFileError(f"{path}: cannot open: {exc.strerror}") from None
    with f:
        magic = f.read(4)
        if magic in PCAP_MAGICS:
            yield from _pcap(path, f, *PCAP_MAGICS[magic], lane, read_size)
        elif magic == PCAPNG_MAGIC:
            yield from _pcapng(path, f, lane, read_size)
        else:
            raise CaptureFileError(f"{path}: not a pcap or pcapng file (starts with {magic.hex() or 'nothing'})")


class _Blocks:
    """The file as a sliding window of bytes: `need(n)` makes n bytes from `pos` available."""

    def __init__(self, f, start: bytes = b"", read_size: int = READ_SIZE):
        self.f, self.buf, self.pos, self.base, self.eof = f, start, 0, 0, False
        self.read_size = read_size

    def need(self, n: int) -> bool:
        if len(self.buf) - self.pos >= n:
            return True
        if self.eof:
            return False
        chunk = self.f.read(max(self.read_size, n))
        if not chunk:
            self.eof = True
            return False
        self.base += self.pos
        self.buf = self.buf[self.pos:] + chunk
        self.pos = 0
        return self.need(n)

    @property
    def offset(self) -> int:
        return self.base + self.pos

    def left(self) -> int:
        return len(self.buf) - self.pos


def _pcap(path: str, f, order: str, nanos: bool, lane=None, read_size: int = READ_SIZE
          ) -> Iterator[tuple[int, int, int | None, bytes | int]]:
    rest = f.read(20)
    if len(rest) < 20:
        raise CaptureFileError(f"{path}: truncated pcap file header")
    linktype = Struct(order + "I").unpack_from(rest, 16)[0] & 0x0FFFFFFF  # upper bits: FCS length flags
    record = Struct(order + "IIII")
    scale = 1 if nanos else 1000
    blocks = _Blocks(f, read_size=read_size)
    number = 0
    if order != "<":
        lane = None  # the lane reads little-endian records only
    while True:
        if lane is not None:  # the lane's packets first, as many as are whole in the buffer
            pos, number, last_ts, nbytes = lane.pcap(blocks.buf, blocks.pos, number, linktype, nanos)
            if last_ts is not None:
                blocks.pos = pos
                yield number, last_ts, None, nbytes
                continue
        number += 1
        if not blocks.need(16):
            if blocks.left():
                raise CaptureFileError(f"{path}: packet {number}: file is truncated "
                                       f"({blocks.left()} bytes of an incomplete record header)", damaged=True)
            return
        sec, frac, caplen, _wirelen = record.unpack_from(blocks.buf, blocks.pos)
        if caplen > MAX_RECORD:
            raise CaptureFileError(f"{path}: packet {number}: record length {caplen} is impossible; "
                                   f"the file is corrupt from byte {blocks.offset + 24}", damaged=True)
        if not blocks.need(16 + caplen):
            raise CaptureFileError(f"{path}: packet {number}: file is truncated "
                                   f"(record of {caplen} bytes has {blocks.left() - 16})", damaged=True)
        start = blocks.pos + 16
        blocks.pos = start + caplen
        yield number, sec * 1_000_000_000 + frac * scale, linktype, blocks.buf[start:start + caplen]


def _pcapng(path: str, f, lane=None, read_size: int = READ_SIZE) -> Iterator[tuple[int, int, int | None, bytes | int]]:
    blocks = _Blocks(f, PCAPNG_MAGIC, read_size)
    order = "<"
    u32 = Struct("<I")
    epb = Struct("<IIIII")
    interfaces: list[tuple[int, int, int]] = []  # (linktype, ticks per second, snap length)
    number = 0
    last_ts = 0
    epb_head = Struct("<IIIIII")
    while True:
        # Fast path: Enhanced Packet Blocks entirely in the buffer (nearly every block of a capture),
        # one after the other with the position kept in a local until something else comes.
        buf, pos = blocks.buf, blocks.pos
        size, known = len(buf), len(interfaces)
        while size - pos >= 28:
            if lane is not None and order == "<":  # the lane's packets first (the same checks, in C)
                pos, number, ts, nbytes = lane.pcapng(buf, pos, number, interfaces)
                if ts is not None:
                    last_ts = ts
                    yield number, ts, None, nbytes
                    continue
                if size - pos < 28:
                    break
            block_type, length, iface, high, low, caplen = epb_head.unpack_from(buf, pos)
            if not (block_type == EPB and length <= size - pos and not length % 4 and iface < known
                    and caplen <= length - 32):
                break
            linktype, ticks, _ = interfaces[iface]
            number += 1
            last_ts = ((high << 32) | low) * 1_000_000_000 // ticks
            start = pos + 28
            pos += length
            yield number, last_ts, linktype, buf[start:start + caplen]
        blocks.pos = pos
        if not blocks.need(8):
            if blocks.left():
                raise CaptureFileError(f"{path}: packet {number + 1}: file is truncated "
                                       f"at byte {blocks.offset}", damaged=True)
            return
        buf, pos = blocks.buf, blocks.pos
        block_type = u32.unpack_from(buf, pos)[0]
        if block_type == SHB:
            if not blocks.need(12):
                raise CaptureFileError(f"{path}: packet {number + 1}: truncated section header", damaged=number > 0)
            buf = blocks.buf
            order = "<" if buf[blocks.pos + 8:blocks.pos + 12] == b"\x4d\x3c\x2b\x1a" else ">"
            u32, epb, epb_head = Struct(order + "I"), Struct(order + "IIIII"), Struct(order + "IIIIII")
            interfaces = []
        length = u32.unpack_from(blocks.buf, blocks.pos + 4)[0]
        if length < 12 or length % 4:
            raise CaptureFileError(f"{path}: packet {number + 1}: corrupt block length {length} "
                                   f"at byte {blocks.offset}", damaged=number > 0)
        if not blocks.need(length):
            raise CaptureFileError(f"{path}: packet {number + 1}: file is truncated (block of {length} bytes "
                                   f"at byte {blocks.offset} has {blocks.left()})", damaged=True)
        buf, pos = blocks.buf, blocks.pos
        blocks.pos = pos + length
        if block_type == EPB or block_type == PB_OBSOLETE:
            if block_type == EPB:
                iface, high, low, caplen, _ = epb.unpack_from(buf, pos + 8)
            else:
                head = Struct(order + "HHIIII").unpack_from(buf, pos + 8)
                iface, high, low, caplen = head[0], head[2], head[3], head[4]
            if iface >= len(interfaces) or caplen > length - 32:
                raise CaptureFileError(f"{path}: packet {number + 1}: corrupt packet block at byte "
                                       f"{blocks.offset - length}", damaged=number > 0)
            linktype, ticks, _ = interfaces[iface]
            number += 1
            last_ts = ((high << 32) | low) * 1_000_000_000 // ticks
            yield number, last_ts, linktype, buf[pos + 28:pos + 28 + caplen]
        elif block_type == SPB:
            if not interfaces:
                raise CaptureFileError(f"{path}: packet {number + 1}: packet block before any interface",
                                       damaged=number > 0)
            linktype, _, snaplen = interfaces[0]
            wirelen = u32.unpack_from(buf, pos + 8)[0]
            caplen = min(wirelen, snaplen or wirelen, length - 16)
            number += 1
            yield number, last_ts, linktype, buf[pos + 12:pos + 12 + caplen]  # simple blocks carry no time
        elif block_type == IDB:
            interfaces.append(_interface(buf, pos, length, order))


def _interface(buf: bytes, pos: int, length: int, order: str) -> tuple[int, int, int]:
    """(link type, timestamp ticks per second, snap length) of an Interface Description Block."""
    linktype, _, snaplen = Struct(order + "HHI").unpack_from(buf, pos + 8)
    ticks = 1_000_000
    option, end = pos + 16, pos + length - 4
    option_head = Struct(order + "HH")
    while option + 4 <= end:
        code, size = option_head.unpack_from(buf, option)
        if code == 0:
            break
        if code == 9 and size >= 1:  # if_tsresol: a power of 10, or of 2 when the high bit is set
            value = buf[option + 4]
            ticks = 2 ** (value & 0x7F) if value & 0x80 else 10 ** value
        option += 4 + ((size + 3) & ~3)
    return linktype, ticks, snaplen


def interface_name(path: str) -> str | None:
    """The name of a pcapng file's first capture interface (its IDB's if_name option), bounded and
    with control characters left out; None for a pcap file or one that does not say."""
    try:
        with open(path, "rb") as f:
            head = f.read(1 << 16)
    except OSError:
        return None
    if not head.startswith(PCAPNG_MAGIC) or len(head) < 12:
        return None
    order = "<" if head[8:12] == b"\x4d\x3c\x2b\x1a" else ">"
    u32, option_head = Struct(order + "I"), Struct(order + "HH")
    pos = 0
    while pos + 12 <= len(head):
        block_type, length = u32.unpack_from(head, pos)[0], u32.unpack_from(head, pos + 4)[0]
        if length < 12 or length % 4 or pos + length > len(head):
            return None
        if block_type == IDB:
            option, end = pos + 16, pos + length - 4
            while option + 4 <= end:
                code, size = option_head.unpack_from(head, option)
                if code == 0:
                    break
                if code == 2:  # if_name
                    name = head[option + 4:option + 4 + min(size, 128)].decode("utf-8", "replace")
                    return "".join(c for c in name if c.isprintable()).strip() or None
                option += 4 + ((size + 3) & ~3)
            return None
        if block_type in (EPB, SPB, PB_OBSOLETE):
            return None
        pos += length
    return None
