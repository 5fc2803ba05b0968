"""Optional rotating pcapng output of the raw packets the agent captured (`--pcap-out`), so an
incident can be ingested again, analysed whole, or opened in Wireshark. Files rotate at a size and
only the newest `keep` stay: disk use is bounded.

Raw packets hold what the tables never do: message bodies, and the SASL response of every
connection.start-ok (the password). The response is blanked before writing (blank_sasl.py) unless
`keep_credentials` (`--pcap-keep-credentials`); the files, and the folder when the agent makes it,
are readable by their owner only (0600, 0700, whatever the umask), as dumpcap writes its files."""

from __future__ import annotations

import os
import struct
import time

from .blank_sasl import SaslBlanker

_OPTION_END = b"\x00\x00\x00\x00"


def _block(kind: int, body: bytes) -> bytes:
    total = 12 + len(body)
    return struct.pack("<II", kind, total) + body + struct.pack("<I", total)


def _header(linktype: int, snaplen: int, iface: str) -> bytes:
    shb = _block(0x0A0D0D0A, struct.pack("<IHHq", 0x1A2B3C4D, 1, 0, -1))
    name = iface.encode()
    name_option = struct.pack("<HH", 2, len(name)) + name + b"\x00" * (-len(name) % 4)
    tsresol = struct.pack("<HHB3x", 9, 1, 9)  # timestamps in nanoseconds
    idb = _block(0x00000001, struct.pack("<HHI", linktype, 0, snaplen) + name_option + tsresol + _OPTION_END)
    return shb + idb


class RotatingPcapng:
    def __init__(self, directory: str, linktype: int, iface: str, *, rotate_bytes: int, keep: int,
                 snaplen: int = 262_144, keep_credentials: bool = False):
        if keep < 1:
            raise ValueError("--rotate-keep must be at least 1")
        if not os.path.isdir(directory):
            os.makedirs(directory, mode=0o700)
            os.chmod(directory, 0o700)  # the umask may have taken bits off: exactly the owner's
        self.blanker = None if keep_credentials else SaslBlanker(linktype)
        self.directory, self.linktype, self.iface = directory, linktype, iface
        self.rotate_bytes, self.keep, self.snaplen = rotate_bytes, keep, snaplen
        self.files: list[str] = []
        self._file = None
        self._size = 0
        self._serial = 0

    def write(self, packets: list[tuple[int, bytes]]) -> None:
        """Rotation is checked before every packet, not every batch: a batch is up to 4096 packets of
        up to 256 KiB, which would let one file pass the rotate size by far (and how packets fall into
        batches depends on the load, not on the traffic)."""
        out, size = [], self._size
        blank = self.blanker.packet if self.blanker is not None else None
        for ts_ns, data in packets:
            if blank is not None:
                data = blank(data)
            if self._file is None or size >= self.rotate_bytes:
                self._flush(out, size)
                out = []
                self._rotate()
                size = self._size
            n = len(data)
            pad = -n % 4
            total = 32 + n + pad
            out.append(struct.pack("<IIIIIII", 6, total, 0, ts_ns >> 32, ts_ns & 0xFFFFFFFF, n, n))
            out.append(data)
            out.append(b"\x00" * pad + struct.pack("<I", total))
            size += total
        self._flush(out, size)

    def _flush(self, out: list[bytes], size: int) -> None:
        if out:
            self._file.write(b"".join(out))
            self._size = size

    def _rotate(self) -> None:
        self.close()
        self._serial += 1
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
        path = os.path.join(self.directory, f"ackscope-{self.iface}-{stamp}-{self._serial:05d}.pcapng")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.fchmod(fd, 0o600)  # whatever the umask, and a file that was there before
        self._file = open(fd, "wb", buffering=1 << 20)
        header = _header(self.linktype, self.snaplen, self.iface)
        self._file.write(header)
        self._size = len(header)
        self.files.append(path)
        while len(self.files) > self.keep:
            old = self.files.pop(0)
            try:
                os.remove(old)
            except FileNotFoundError:
                pass

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
