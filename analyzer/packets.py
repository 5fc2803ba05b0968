"""Link, IP and TCP headers: a captured packet's bytes in, one TCP segment out.

Hand-written with precompiled structs rather than scapy's dissectors, because this runs once per
packet on the hot path. Anything that is not TCP over IPv4/IPv6 comes back as None.
"""

from dataclasses import dataclass
from struct import Struct

# pcap LINKTYPE_* values (https://www.tcpdump.org/linktypes.html)
LINKTYPE_NULL = 0
LINKTYPE_ETHERNET = 1
LINKTYPE_RAW = 101
LINKTYPE_LOOP = 108
LINKTYPE_LINUX_SLL = 113
LINKTYPE_IPV4 = 228
LINKTYPE_IPV6 = 229
LINKTYPE_LINUX_SLL2 = 276
DLT_RAW_ALIASES = (12, 14)  # DLT_RAW on some BSDs
SUPPORTED_LINKTYPES = frozenset(
    (LINKTYPE_NULL, LINKTYPE_ETHERNET, LINKTYPE_RAW, LINKTYPE_LOOP, LINKTYPE_LINUX_SLL,
     LINKTYPE_IPV4, LINKTYPE_IPV6, LINKTYPE_LINUX_SLL2, *DLT_RAW_ALIASES))

ETH_IPV4 = 0x0800
ETH_IPV6 = 0x86DD
ETH_VLAN_TAGS = frozenset((0x8100, 0x88A8, 0x9100))
IPPROTO_TCP = 6
IPV6_EXTENSION_HEADERS = frozenset((0, 43, 60))  # hop-by-hop, routing, destination options
IPV6_FRAGMENT = 44
BSD_AF_INET6 = frozenset((10, 24, 28, 30))  # Linux, NetBSD/OpenBSD, FreeBSD, Darwin

TCP_FIN, TCP_SYN, TCP_RST, TCP_ACK = 0x01, 0x02, 0x04, 0x10

_U16 = Struct("!H")
_U32_LE = Struct("<I")
_U32_BE = Struct("!I")
_IPV4 = Struct("!BxHHHBBH4s4s")
_IPV6 = Struct("!4xHBB16s16s")
_TCP = Struct("!HHIIBB")
_ETH_IPV4_TCP = Struct("!12xH BxH2xH xB2x4s4s HHIIBB")  # ethertype, then _IPV4 and _TCP's fields we use


@dataclass(slots=True)
class Segment:
    """A TCP segment. Addresses are raw bytes (4 or 16) so flow look-ups stay cheap."""
    src: bytes
    dst: bytes
    sport: int
    dport: int
    seq: int
    ack: int
    flags: int
    payload: bytes
    missing: int  # payload bytes announced by the IP header but cut off by the snap length


def link_payload(linktype: int, data: bytes) -> tuple[int, int] | None:
    """(offset of the IP header, IP version) for a link-layer frame, or None if not IP."""
    if linktype == LINKTYPE_ETHERNET:
        off, ethertype = 14, (_U16.unpack_from(data, 12)[0] if len(data) >= 14 else 0)
        while ethertype in ETH_VLAN_TAGS and len(data) >= off + 4:
            ethertype = _U16.unpack_from(data, off + 2)[0]
            off += 4
    elif linktype == LINKTYPE_LINUX_SLL:
        off, ethertype = 16, (_U16.unpack_from(data, 14)[0] if len(data) >= 16 else 0)
    elif linktype == LINKTYPE_LINUX_SLL2:
        off, ethertype = 20, (_U16.unpack_from(data, 0)[0] if len(data) >= 20 else 0)
    elif linktype in (LINKTYPE_NULL, LINKTYPE_LOOP):
        if len(data) < 4:
            return None
        family = _U32_BE.unpack_from(data)[0] if linktype == LINKTYPE_LOOP else _U32_LE.unpack_from(data)[0]
        if family > 0xFFFF:  # written by a host of the other byte order
            family = _U32_BE.unpack_from(data)[0]
        ethertype = ETH_IPV4 if family == 2 else ETH_IPV6 if family in BSD_AF_INET6 else 0
        off = 4
    elif linktype in (LINKTYPE_RAW, LINKTYPE_IPV4, LINKTYPE_IPV6, *DLT_RAW_ALIASES):
        if not data:
            return None
        version = data[0] >> 4
        return (0, version) if version in (4, 6) else None
    else:
        return None
    if ethertype == ETH_IPV4:
        return off, 4
    if ethertype == ETH_IPV6:
        return off, 6
    return None


def tcp_segment(linktype: int, data: bytes) -> Segment | None:
    """Decode one captured packet down to its TCP segment."""
    n = len(data)
    if linktype == LINKTYPE_ETHERNET and n >= 54:
        # Untagged Ethernet, IPv4 without options, TCP: nearly every packet, read with one unpack. The
        # same rules as below; anything else (options, a fragment, not TCP) takes the general path.
        (ethertype, vihl, total, frag, proto, src, dst,
         sport, dport, seq, ack, data_off, flags) = _ETH_IPV4_TCP.unpack_from(data)
        if ethertype == ETH_IPV4 and vihl == 0x45 and proto == IPPROTO_TCP and not frag & 0x3FFF:
            ip_end = 14 + (total or (n - 14))
            payload_off = 34 + (data_off >> 4) * 4
            end = ip_end if ip_end < n else n
            payload = data[payload_off:end] if payload_off < end else b""
            cut = n if n > payload_off else payload_off
            return Segment(src, dst, sport, dport, seq, ack, flags, payload, ip_end - cut if ip_end > cut else 0)
    return parse_tcp_segment(linktype, data)


def parse_tcp_segment(linktype: int, data: bytes) -> Segment | None:
    """The general path of `tcp_segment`, for every link type and header layout."""
    if linktype == LINKTYPE_ETHERNET and data[12:14] == b"\x08\x00":  # untagged Ethernet + IPv4
        off, version = 14, 4
    else:
        found = link_payload(linktype, data)
        if found is None:
            return None
        off, version = found
    n = len(data)
    if version == 4:
        if n < off + 20:
            return None
        vihl, total, _ident, frag, _ttl, proto, _csum, src, dst = _IPV4.unpack_from(data, off)
        if proto != IPPROTO_TCP or (frag & 0x1FFF) or (frag & 0x2000):
            return None  # not TCP, or an IP fragment (reassembling IP fragments is out of scope)
        ip_end = off + (total or (n - off))  # TSO captures can carry total length 0
        tcp_off = off + (vihl & 0x0F) * 4
    else:
        if n < off + 40:
            return None
        plen, nxt, _hop, src, dst = _IPV6.unpack_from(data, off)
        ip_end = off + 40 + (plen or (n - off - 40))
        tcp_off = off + 40
        while nxt in IPV6_EXTENSION_HEADERS and n >= tcp_off + 2:
            nxt, hlen = data[tcp_off], data[tcp_off + 1]
            tcp_off += (hlen + 1) * 8
        if nxt != IPPROTO_TCP:
            return None  # includes IPv6 fragments
    if n < tcp_off + 20:
        return None
    sport, dport, seq, ack, data_off, flags = _TCP.unpack_from(data, tcp_off)
    payload_off = tcp_off + (data_off >> 4) * 4
    end = min(ip_end, n)  # Ethernet pads short frames: the IP length is the truth
    payload = data[payload_off:end] if payload_off < end else b""
    return Segment(src, dst, sport, dport, seq, ack, flags, payload, max(0, ip_end - max(n, payload_off)))
