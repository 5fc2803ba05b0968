"""Packets from a pcap or pcapng file, through scapy's raw readers (no per-packet dissection).

The only I/O shell around the sans-IO core for offline captures. A corrupt or truncated file
raises `CaptureFileError` naming the file and the packet, after every complete packet before the
damage has been yielded, so callers keep (and commit) what was read.
"""

import logging
import os
import struct
from collections.abc import Iterator

from scapy.utils import RawPcapNgReader, RawPcapReader

PCAP_MAGICS = {b"\xa1\xb2\xc3\xd4", b"\xd4\xc3\xb2\xa1", b"\xa1\xb2\x3c\x4d", b"\x4d\x3c\xb2\xa1"}
PCAPNG_MAGIC = b"\x0a\x0d\x0d\x0a"
MAX_RECORD = 1 << 18  # dumpcap's default snap length; a longer record means a corrupt header

logging.getLogger("scapy.runtime").setLevel(logging.ERROR)  # we report damage ourselves, once, with context


class CaptureFileError(Exception):
    """The capture file is unreadable, or damaged part way (the file's fault, not the traffic's)."""

    def __init__(self, message: str, damaged: bool = False):
        super().__init__(message)
        self.damaged = damaged  # True: packets before the damage were read and are good


def read_packets(path: str) -> Iterator[tuple[int, int, int, bytes]]:
    """Yield (packet number from 1, timestamp ns, link type, bytes) for every packet of a capture file."""
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
    except OSError as exc:
        raise CaptureFileError(f"{path}: cannot open: {exc.strerror}") from None
    if magic in PCAP_MAGICS:
        yield from _pcap(path)
    elif magic == PCAPNG_MAGIC:
        yield from _pcapng(path)
    else:
        raise CaptureFileError(f"{path}: not a pcap or pcapng file (starts with {magic.hex() or 'nothing'})")


def _open(reader_class, path):
    try:
        return reader_class(path)
    except Exception as exc:  # scapy raises Scapy_Exception, struct.error, ... on a bad file header
        raise CaptureFileError(f"{path}: unreadable capture header: {exc}") from None


def _pcap(path: str) -> Iterator[tuple[int, int, int, bytes]]:
    reader = _open(RawPcapReader, path)
    size = os.path.getsize(path)
    scale = 1 if getattr(reader, "nano", False) else 1000
    linktype = reader.linktype
    position, number = 24, 0
    try:
        while True:
            number += 1
            try:
                data, meta = reader._read_packet(size=MAX_RECORD)  # scapy: read_packet() is for the dissecting readers
            except EOFError:
                if position < size:
                    raise CaptureFileError(f"{path}: packet {number}: file is truncated "
                                           f"({size - position} bytes of an incomplete record header)", damaged=True) from None
                return
            caplen = meta.caplen
            if caplen > MAX_RECORD:
                raise CaptureFileError(f"{path}: packet {number}: record length {caplen} is impossible; "
                                       f"the file is corrupt from byte {position}", damaged=True)
            position += 16 + caplen
            if len(data) < caplen:
                raise CaptureFileError(f"{path}: packet {number}: file is truncated "
                                       f"(record of {caplen} bytes has {len(data)})", damaged=True)
            yield number, meta.sec * 1_000_000_000 + meta.usec * scale, linktype, data
    finally:
        reader.close()


def _pcapng(path: str) -> Iterator[tuple[int, int, int, bytes]]:
    reader = _open(RawPcapNgReader, path)
    size = os.path.getsize(path)
    f = reader.f
    number = 0
    try:
        while True:
            number += 1
            start = f.tell()
            try:
                data, meta = reader._read_packet(size=MAX_RECORD)  # scapy: read_packet() is for the dissecting readers
            except EOFError:
                if not _blocks_end_cleanly(f, start, size, reader.endian):
                    raise CaptureFileError(f"{path}: packet {number}: file is truncated or corrupt "
                                           f"at byte {start} of {size}", damaged=True) from None
                return
            except Exception as exc:
                raise CaptureFileError(f"{path}: packet {number}: corrupt block at byte {start}: {exc}",
                                       damaged=True) from None
            ts = (meta.tshigh << 32) | meta.tslow
            yield number, ts * 1_000_000_000 // meta.tsresol, meta.linktype, data
    finally:
        reader.close()


def _blocks_end_cleanly(f, start: int, size: int, endian: str) -> bool:
    """After scapy's EOF: do the blocks from `start` add up to exactly the end of the file?"""
    position = start
    while position < size:
        f.seek(position)
        head = f.read(8)
        if len(head) < 8:
            return False
        length = struct.unpack(endian + "I", head[4:])[0]
        if length < 12 or length % 4:
            return False
        position += length
    return position == size
