"""Build AMQP conversations as TCP segments (and pcap files) from pamqp frames, for sans-IO tests."""

from pamqp import body, commands, frame, header

from analyzer.flows import FlowTable
from analyzer.rows import RowSink
from analyzer.packets import TCP_ACK, TCP_FIN, TCP_RST, TCP_SYN, Segment

CLIENT = (bytes([10, 0, 0, 1]), 40000)
BROKER = (bytes([10, 0, 0, 2]), 5672)
PASSWORD = "s3cret-Pa55word"


def method(obj, channel: int = 1) -> bytes:
    return frame.marshal(obj, channel)


def content(method_obj, payload: bytes, channel: int = 1, frame_size: int = 0, **properties) -> bytes:
    """A content method with its header and body frames (bodies split at frame_size when given)."""
    props = commands.Basic.Properties(**properties)
    out = [frame.marshal(method_obj, channel), frame.marshal(header.ContentHeader(0, len(payload), props), channel)]
    step = frame_size or max(len(payload), 1)
    for i in range(0, len(payload), step):
        out.append(frame.marshal(body.ContentBody(payload[i:i + step]), channel))
    return b"".join(out)


def handshake(user: str = "guest", password: str = PASSWORD, name: str = "test-client") -> list[tuple[int, bytes]]:
    """(direction, bytes) pairs of a complete connection opening and channel 1, as pika would send them."""
    return [
        (0, b"AMQP\x00\x00\x09\x01"),
        (1, method(commands.Connection.Start(server_properties={"product": "RabbitMQ", "version": "3.10.8"}), 0)),
        (0, method(commands.Connection.StartOk(client_properties={"product": "pika", "connection_name": name},
                                               mechanism="PLAIN", response=f"\x00{user}\x00{password}"), 0)),
        (1, method(commands.Connection.Tune(channel_max=2047, frame_max=131072, heartbeat=60), 0)),
        (0, method(commands.Connection.TuneOk(channel_max=2047, frame_max=131072, heartbeat=60), 0)
         + method(commands.Connection.Open(virtual_host="/"), 0)),
        (1, method(commands.Connection.OpenOk(), 0)),
        (0, method(commands.Channel.Open(), 1)),
        (1, method(commands.Channel.OpenOk(), 1)),
    ]


class Conversation:
    """Tracks both sides' sequence numbers so tests can write traffic the way TCP carries it."""

    def __init__(self, client=CLIENT, broker=BROKER, client_isn: int = 1000, broker_isn: int = 900_000):
        self.ends = (client, broker)
        self.next = [client_isn, broker_isn]
        self.ts = 1_700_000_000_000_000_000

    def _segment(self, direction: int, seq: int, payload: bytes, flags: int) -> Segment:
        src, dst = self.ends[direction], self.ends[1 - direction]
        return Segment(src[0], dst[0], src[1], dst[1], seq % (1 << 32), self.next[1 - direction] % (1 << 32),
                       flags, payload, 0)

    def open(self) -> list[Segment]:
        syn = self._segment(0, self.next[0], b"", TCP_SYN)
        syn.ack = 0
        synack = self._segment(1, self.next[1], b"", TCP_SYN | TCP_ACK)
        self.next = [self.next[0] + 1, self.next[1] + 1]
        synack.ack = self.next[0]
        return [syn, synack, self._segment(0, self.next[0], b"", TCP_ACK)]

    def send(self, direction: int, data: bytes, sizes: int | None = None) -> list[Segment]:
        """Data from one side, cut into segments of `sizes` bytes (one segment if None)."""
        step = sizes or max(len(data), 1)
        out = []
        for i in range(0, len(data), step):
            chunk = data[i:i + step]
            out.append(self._segment(direction, self.next[direction], chunk, TCP_ACK))
            self.next[direction] += len(chunk)
        return out

    def ack(self, direction: int) -> Segment:
        """A pure ACK from `direction` for everything the other side sent so far."""
        return self._segment(direction, self.next[direction], b"", TCP_ACK)

    def fin(self, direction: int) -> Segment:
        seg = self._segment(direction, self.next[direction], b"", TCP_FIN | TCP_ACK)
        self.next[direction] += 1
        return seg

    def rst(self, direction: int) -> Segment:
        return self._segment(direction, self.next[direction], b"", TCP_RST | TCP_ACK)

    def script(self, pairs: list[tuple[int, bytes]], sizes: int | None = None) -> list[Segment]:
        return [seg for direction, data in pairs for seg in self.send(direction, data, sizes)]


def run(segments: list[Segment], finish: bool = True):
    """Feed segments through a FlowTable; returns (rows as dicts of schema.FRAMES, counts, errors, flow table)."""
    sink, counts, errors = RowSink(), {}, []
    table = FlowTable(sink=sink, counts=counts, errors=errors, source="test")
    for number, seg in enumerate(segments, 1):
        table.packet(number, 1_700_000_000_000_000_000 + number * 1000, seg)
    if finish:
        table.finish()
    return compact(sink.take().to_pylist()), counts, errors, table


def compact(rows: list[dict]) -> list[dict]:
    """Rows without their null columns, as the decoder meant them."""
    return [{k: v for k, v in row.items() if v is not None} for row in rows]


def methods_of(rows: list[dict]) -> list[str]:
    return [r["method"] for r in sorted(rows, key=lambda r: (r["connection_id"], r["seq"]))]


def write_pcap(path: str, segments: list[Segment], link: str = "ethernet", pcapng: bool = False,
               times: list[float] | None = None) -> None:
    """Write segments as a capture file with the given link layer, through scapy's writers; packet
    i at `times[i]` seconds after the start (i milliseconds when None)."""
    from scapy.layers.inet import IP, TCP
    from scapy.layers.inet6 import IPv6
    from scapy.layers.l2 import CookedLinux, CookedLinuxV2, Dot1AD, Dot1Q, Ether, Loopback
    from scapy.packet import Raw
    from scapy.utils import PcapNgWriter, PcapWriter

    import ipaddress

    linktypes = {"ethernet": 1, "vlan": 1, "qinq": 1, "sll": 113, "sll2": 276, "null": 0, "raw": 101}
    packets = []
    for i, seg in enumerate(segments):
        ip_layer = IP if len(seg.src) == 4 else IPv6
        src, dst = str(ipaddress.ip_address(seg.src)), str(ipaddress.ip_address(seg.dst))
        flags = "".join(f for bit, f in ((1, "F"), (2, "S"), (4, "R"), (16, "A")) if seg.flags & bit)
        packet = ip_layer(src=src, dst=dst) / TCP(sport=seg.sport, dport=seg.dport, seq=seg.seq, ack=seg.ack,
                                                   flags=flags) / Raw(seg.payload)
        ethertype = 0x0800 if ip_layer is IP else 0x86DD
        if link == "ethernet":
            packet = Ether(type=ethertype) / packet
        elif link == "vlan":
            packet = Ether() / Dot1Q(vlan=7) / packet
        elif link == "qinq":
            packet = Ether() / Dot1AD(vlan=100) / Dot1Q(vlan=7) / packet
        elif link == "sll":
            packet = CookedLinux(proto=ethertype) / packet
        elif link == "sll2":
            packet = CookedLinuxV2(proto=ethertype) / packet
        elif link == "null":
            packet = Loopback(type=2 if ip_layer is IP else 30) / packet
        packet.time = 1_700_000_000 + (times[i] if times is not None else i / 1000)
        packets.append(packet)
    writer_class = PcapNgWriter if pcapng else PcapWriter
    writer = writer_class(path, linktype=linktypes[link]) if not pcapng else writer_class(path)
    for packet in packets:
        writer.write(packet)
    writer.close()
