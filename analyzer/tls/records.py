"""TLS record framing for one direction: stream bytes and gaps in, records out.

Sans-IO. `feed()` takes contiguous stream bytes (records may be split across segments, several
may share one), `gap()` says stream bytes were lost. Both return `(content_type, version,
fragment)` tuples and `Lost` notes in stream order. After a gap the reader hunts for a plausible
record boundary: an application-data header (the only type a connection sends once its
handshake is done) followed by another one, or ending exactly where the bytes end. It never
buffers more than one record.
"""

from dataclasses import dataclass

CHANGE_CIPHER_SPEC, ALERT, HANDSHAKE, APPLICATION_DATA = 20, 21, 22, 23
CONTENT_TYPES = frozenset((CHANGE_CIPHER_SPEC, ALERT, HANDSHAKE, APPLICATION_DATA, 24))
MAX_RECORD = (1 << 14) + 2048  # TLSCiphertext.length at most (RFC 5246 6.2.3; TLS 1.3 allows less)
HEADER = 5
HUNT_LIMIT = 1 << 20  # bytes hunted without finding a record before the direction is given up


@dataclass(frozen=True, slots=True)
class Lost:
    """Stream bytes that never became records: a capture gap, or what a hunt skipped."""
    nbytes: int
    reason: str


def plausible_header(data: bytes, pos: int, hunting: bool = False) -> bool:
    ctype, major, minor = data[pos], data[pos + 1], data[pos + 2]
    length = (data[pos + 3] << 8) | data[pos + 4]
    if hunting:  # after the handshake: application data, record version 1.2 (TLS 1.2 and 1.3 alike)
        return ctype == APPLICATION_DATA and major == 3 and minor == 3 and 0 < length <= MAX_RECORD
    return ctype in CONTENT_TYPES and major == 3 and minor <= 4 and length <= MAX_RECORD


class RecordReader:
    __slots__ = ("buf", "hunting", "dead", "hunted")

    def __init__(self):
        self.buf = b""
        self.hunting = False  # after a gap, until a record boundary is found again
        self.dead = False     # framing failed for good: the rest of the stream is not read
        self.hunted = 0

    def feed(self, data: bytes) -> list:
        if self.dead:
            return []
        if self.buf:
            data = self.buf + data
            self.buf = b""
        out: list = []
        pos, n = 0, len(data)
        if self.hunting:
            pos = self._hunt(data, out)
            if pos is None:
                return out
        while n - pos >= HEADER:
            if not plausible_header(data, pos):
                out.append(Lost(n - pos, "not a TLS record"))
                self.dead = True
                return out
            end = pos + HEADER + ((data[pos + 3] << 8) | data[pos + 4])
            if end > n:
                break
            out.append((data[pos], (data[pos + 1] << 8) | data[pos + 2], data[pos + HEADER:end]))
            pos = end
        if pos < n:
            self.buf = data[pos:]
        return out

    def gap(self, nbytes: int) -> list:
        """Stream bytes were lost: the record being read is lost with them, and the next boundary unknown."""
        lost = Lost(nbytes + len(self.buf), "capture gap")
        self.buf = b""
        if not self.dead:
            self.hunting = True
        return [lost]

    def _hunt(self, data: bytes, out: list) -> int | None:
        n = len(data)
        pos = 0
        while pos + HEADER <= n:
            if plausible_header(data, pos, hunting=True):
                end = pos + HEADER + ((data[pos + 3] << 8) | data[pos + 4])
                if end == n or (end + HEADER <= n and plausible_header(data, end, hunting=True)):
                    break  # a record ending where the bytes end, or followed by another
                if end + HEADER > n:  # cannot tell yet: wait for more bytes
                    return self._wait(data, pos, out)
            pos += 1
        else:
            return self._wait(data, max(pos, n - HEADER + 1), out)
        self.hunting = False
        self.hunted = 0
        if pos:
            out.append(Lost(pos, "hunted for a record boundary"))
        return pos

    def _wait(self, data: bytes, pos: int, out: list) -> None:
        pos = max(pos, 0)
        self.hunted += pos
        if pos:
            out.append(Lost(pos, "hunted for a record boundary"))
        if self.hunted > HUNT_LIMIT:
            self.dead = True
            return None
        self.buf = data[pos:]
        return None
