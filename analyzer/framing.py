"""AMQP 0-9-1 framing for one direction of a connection: stream bytes in, frames out.

Sans-IO. `feed()` takes contiguous stream bytes, `gap()` says bytes were lost; both return a list
of items in stream order: `(frame_type, channel, payload)` tuples for frames, `runs.MessageRun`
for whole messages of the shape the connection said to expect, and the notes below for what
happened to the stream. A frame is accepted only with its frame-end octet and
within the size cap, so garbage cannot make us buffer more than one capped frame. After a gap,
a framing error or a capture that starts mid-connection, the reader *hunts*: it resumes at the
first offset where frames can be found with confidence (a decodable method or content header,
followed by another frame or the end of the segment), never guessing.
"""

from dataclasses import dataclass
from struct import Struct

from .flow_state import Fields, encode_bytes
from .methods import MalformedFrame, decode_content_header, plausible_method
from .spec import (DEFAULT_MAX_FRAME, METHOD_NAMES, FRAME_BODY, FRAME_END, FRAME_HEADER, FRAME_HEARTBEAT, FRAME_METHOD,
                   FRAME_TYPES, PROTOCOL_HEADER_091)

_FRAME_HEADER = Struct("!BHI")
_METHOD_ID = Struct("!I")
_CHAIN_STARTS = frozenset((FRAME_METHOD, FRAME_HEADER, FRAME_BODY))
HUNT_GIVE_UP = 256 << 10      # bytes without any frame before a never-synchronised flow is called unsupported

START, FRAMES, HUNT, UNSUPPORTED = "start", "frames", "hunt", "unsupported"


@dataclass(frozen=True, slots=True)
class ProtocolHeader:
    header: bytes
    supported: bool


@dataclass(frozen=True, slots=True)
class Unsupported:
    protocol: str  # "amqp-1.0", "amqp-0-10", "tls", "rabbitmq-stream", "http", "unknown"


@dataclass(frozen=True, slots=True)
class Synchronised:
    skipped: int   # bytes dropped before the first confident frame boundary
    first: bool    # the first frames ever found in this direction (a capture that began mid-stream)


@dataclass(frozen=True, slots=True)
class FramingError:
    offset: int    # stream offset of the bad frame
    reason: str


def classify_foreign(data: bytes) -> str:
    """Name the protocol a non-0-9-1 stream speaks, from its first bytes."""
    if data.startswith(b"AMQP") and len(data) >= 8:
        if data[5:8] == b"\x01\x00\x00":
            return "amqp-1.0"
        return {b"\x01\x01\x00\x0a": "amqp-0-10", b"\x01\x01\x08\x00": "amqp-0-8",
                b"\x01\x01\x00\x09": "amqp-0-9"}.get(data[4:8], "amqp-other")
    if len(data) >= 3 and data[0] == 0x16 and data[1] == 0x03:
        return "tls"
    if len(data) >= 8 and data[4:6] in (b"\x00\x11", b"\x00\x12", b"\x00\x13") and data[6:8] in (b"\x00\x01", b"\x00\x02"):
        return "rabbitmq-stream"  # PeerProperties / SaslHandshake / SaslAuthenticate open a stream connection
    if data[:4] in (b"GET ", b"POST", b"PUT ", b"HTTP", b"HEAD", b"PRI "):
        return "http"
    return "unknown"


class FrameReader:
    __slots__ = ("state", "from_client", "max_frame", "offset", "_chunks", "_have", "_need",
                 "_frame_len", "_skip", "synced_once", "hunted", "skipped", "shape")

    def __init__(self, from_client: bool, at_stream_start: bool, max_frame: int = DEFAULT_MAX_FRAME):
        self.from_client = from_client
        self.state = START if at_stream_start else HUNT
        self.max_frame = max_frame
        self.offset = 0            # stream offset of the first byte not yet consumed
        self._chunks: list[bytes] = []
        self._have = 0
        self._need = 0
        self._frame_len = 0        # length of the frame being buffered, once its header was read
        self._skip = 0             # bytes of a frame cut by a gap still to pass before the next frame
        self.synced_once = False
        self.hunted = 0            # bytes skipped by hunts in all (for giving up on foreign flows)
        self.skipped = 0           # bytes skipped by the current hunt, across feeds
        self.shape = None          # runs.MessageShape the connection expects next, if any (see runs.py)

    # -- input -----------------------------------------------------------------------------------

    def feed(self, data: bytes) -> list:
        if self.state == UNSUPPORTED:
            self.offset += len(data)
            return []
        if self._skip:
            if len(data) <= self._skip:
                self._skip -= len(data)
                self.offset += len(data)
                return []
            data, self.offset, self._skip = data[self._skip:], self.offset + self._skip, 0
        if self._chunks:
            self._chunks.append(data)
            self._have += len(data)
            if self._have < self._need:
                return []
            data = b"".join(self._chunks)
            self._chunks, self._have, self._frame_len = [], 0, 0
        out: list = []
        pos = 0
        if self.state == START:
            pos = self._start(data, out)
            if pos is None:
                return out
        if self.state == HUNT:
            pos = self._hunt(data, pos, out)
            if pos is None:
                return out
        if self.state == FRAMES:
            self._frames(data, pos, out)
        return out

    def gap(self, nbytes: int, exact: bool = True) -> list:
        """Bytes were lost. Inside a frame whose length we read, and ending before it does, the frame is
        lost but the next one starts where it ends; otherwise hunt for the next frame boundary. A gap
        whose size is not `exact` (TLS plaintext lost with its records) always hunts."""
        out: list = []
        if self.state == HUNT and self._chunks:
            # A hunt was waiting for a candidate frame to complete; it never will. Judge the held bytes
            # now, so real frames behind a false candidate are not dropped with it.
            data = b"".join(self._chunks)
            self._chunks, self._have, self._frame_len = [], 0, 0
            pos = self._hunt(data, 0, out, final=True)
            if pos is not None:
                self._frames(data, pos, out)
        left_in_frame = self._frame_len - self._have if self.state == FRAMES and self._frame_len else 0
        self.offset += self._have + nbytes
        self._chunks, self._have, self._frame_len = [], 0, 0
        if exact and nbytes < left_in_frame - self._skip:
            self._skip += left_in_frame - nbytes
            return out
        self._skip = 0
        if self.state in (START, FRAMES):
            self.state = HUNT
            self.skipped = 0
        return out

    def set_frame_max(self, frame_max: int) -> None:
        """Negotiated in connection.tune-ok; 0 means no limit, which keeps the hard ceiling."""
        if 0 < frame_max < self.max_frame:
            self.max_frame = frame_max
            self.shape = None  # learnt under the old limit: its frames may be over the new one

    # -- state as data (flow_state.py) --------------------------------------------------------------

    def snapshot(self) -> dict:
        """The reader between two feeds. Its message shape is not kept: a fast path only (runs.py),
        learnt again from the next whole message."""
        return {"state": self.state, "from_client": self.from_client, "max_frame": self.max_frame,
                "offset": self.offset, "held": encode_bytes(b"".join(self._chunks)), "need": self._need,
                "frame_len": self._frame_len, "skip": self._skip, "synced_once": self.synced_once,
                "hunted": self.hunted, "skipped": self.skipped}

    @classmethod
    def restore(cls, doc, where: str = "framer") -> "FrameReader":
        f = Fields(doc, where)
        reader = cls(f.bool("from_client"), True, f.int("max_frame", 8, 1 << 32))
        reader.state = f.str("state", choices=(START, FRAMES, HUNT, UNSUPPORTED))
        reader.offset = f.int("offset")
        held = f.bytes("held", reader.max_frame + 16)
        reader._chunks, reader._have = ([held], len(held)) if held else ([], 0)
        reader._need = f.int("need", 0, reader.max_frame + 16)
        reader._frame_len = f.int("frame_len", 0, reader.max_frame + 16)
        reader._skip = f.int("skip", 0, 1 << 32)
        reader.synced_once = f.bool("synced_once")
        reader.hunted = f.int("hunted")
        reader.skipped = f.int("skipped")
        if held and reader._need <= len(held):
            f.fail("need", "no more than the bytes held: a reader holds bytes only while it needs more")
        return reader

    # -- states ----------------------------------------------------------------------------------

    def _keep(self, data: bytes, pos: int, need: int, frame_len: int = 0) -> None:
        rest = data[pos:]
        self._chunks = [rest]
        self._have = len(rest)
        self._need = need
        self._frame_len = frame_len
        self.offset += pos

    def _start(self, data: bytes, out: list) -> int | None:
        if len(data) < 8 and PROTOCOL_HEADER_091.startswith(data[:4]) and (self.from_client or data[:1] == b"A"):
            self._keep(data, 0, 8)
            return None
        if data.startswith(b"AMQP"):
            header = data[:8]
            supported = header == PROTOCOL_HEADER_091
            out.append(ProtocolHeader(header, supported))
            if not supported:
                # From a client: another protocol. From a broker: its answer to a version it does
                # not speak (it closes next), or a peer that talks first, as AMQP 1.0 allows.
                return self._foreign(data, out)
            self.state = FRAMES
            return 8
        if self.from_client:
            return self._foreign(data, out)
        self.state = FRAMES
        return 0

    def _foreign(self, data: bytes, out: list) -> None:
        out.append(Unsupported(classify_foreign(data)))
        self.state = UNSUPPORTED
        self.offset += len(data)
        return None

    def _frames(self, data: bytes, pos: int, out: list) -> None:
        n = len(data)
        cap = self.max_frame
        unpack = _FRAME_HEADER.unpack_from
        shape = self.shape
        while n - pos >= 8:
            if shape is not None and data.startswith(shape.head, pos):
                run = shape.cut(data, pos)  # whole messages of the expected shape: see runs.py
                if run is not None:
                    out.append(run)
                    pos += run.nbytes
                    continue
            ftype, channel, size = unpack(data, pos)
            end = pos + 7 + size
            if size > cap or ftype not in FRAME_TYPES:
                bad = f"frame size {size} over the limit {cap}" if size > cap else f"unknown frame type {ftype}"
                pos = self._desync(data, pos, bad, out)
                if pos is None:
                    return
                continue
            if end >= n:
                self._keep(data, pos, end + 1 - pos, frame_len=end + 1 - pos)
                return
            if data[end] != FRAME_END:
                pos = self._desync(data, pos, f"frame end octet is 0x{data[end]:02x}, not 0xce", out)
                if pos is None:
                    return
                continue
            out.append((ftype, channel, data[pos + 7:end]))
            pos = end + 1
        if pos < n:
            self._keep(data, pos, 8)
        else:
            self.offset += n

    def _desync(self, data: bytes, pos: int, reason: str, out: list) -> int | None:
        out.append(FramingError(self.offset + pos, reason))
        self.state = HUNT
        self.skipped = 0
        return self._hunt(data, pos + 1, out)

    def _hunt(self, data: bytes, pos: int, out: list, final: bool = False) -> int | None:
        start, n = pos, len(data)
        need = 0
        while pos < n:
            if data[pos] in _CHAIN_STARTS:
                verdict = self._confident(data, pos)
                if verdict is True:
                    out.append(Synchronised(self.skipped + pos - start, not self.synced_once))
                    self.synced_once = True
                    self.skipped = 0
                    self.state = FRAMES
                    return pos
                if verdict is not False and not final:  # a plausible chain that is not complete yet
                    need = verdict
                    break
            pos += 1
        self.hunted += pos - start
        self.skipped += pos - start
        if not self.synced_once and self.hunted > HUNT_GIVE_UP:
            out.append(Unsupported("unknown"))
            self.state = UNSUPPORTED
            self.offset += n
            return None
        if pos < n:
            self._keep(data, pos, need)
        else:
            self.offset += n
        return None

    def _confident(self, data: bytes, pos: int) -> bool | int:
        """Does a believable chain of frames start at pos? An int: bytes needed from pos to decide.

        Believable: three valid frames in a row, or two with a method or content header among
        them, or a method or content header ending exactly where the data ends (the segment
        boundary). Chains may start with a body frame, so a capture that begins inside a large
        message finds its footing before the message ends."""
        n, first, frames, anchored = len(data), pos, 0, False
        while frames < 3 and not (anchored and frames >= 2):
            if n - pos < 7:  # the chain reaches the end of the data (exactly, or into a frame header)
                return True if anchored else pos - first + 8
            ftype, channel, size = _FRAME_HEADER.unpack_from(data, pos)
            end = pos + 7 + size
            if end >= n:  # the frame is not complete yet: reject what we can, else wait for it
                if ftype not in FRAME_TYPES or size > self.max_frame or (
                        n - pos >= 11 and not self._plausible_start(data, pos, ftype, channel, size, frames == 0)):
                    return False
                return True if anchored else end + 1 - first
            if (not self._plausible_start(data, pos, ftype, channel, size, frames == 0)
                    or data[end] != FRAME_END or not self._plausible_payload(ftype, data[pos + 7:end])):
                return False
            frames += 1
            anchored = anchored or ftype == FRAME_METHOD or ftype == FRAME_HEADER
            pos = end + 1
        return True

    def _plausible_start(self, data: bytes, pos: int, ftype: int, channel: int, size: int, first: bool) -> bool:
        """Cheap checks on a frame's first 12 bytes, so garbage is rejected before we wait for its 'payload'."""
        if size > self.max_frame:
            return False
        if ftype == FRAME_METHOD:
            return size >= 4 and _METHOD_ID.unpack_from(data, pos + 7)[0] in METHOD_NAMES
        if ftype == FRAME_HEADER:
            return size >= 14 and data[pos + 7:pos + 11] == b"\x00\x3c\x00\x00"  # class basic, weight 0
        if ftype == FRAME_HEARTBEAT:
            return size == 0 and channel == 0 and not first
        return ftype == FRAME_BODY and size > 0

    @staticmethod
    def _plausible_payload(ftype: int, payload: bytes) -> bool:
        if ftype == FRAME_METHOD:
            return plausible_method(payload)
        if ftype == FRAME_HEADER:
            try:
                decode_content_header(payload)
            except MalformedFrame:
                return False
        return True
