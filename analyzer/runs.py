"""Runs of identically shaped messages: most of a busy stream, cut without framing frame by frame.

A publisher's or a consumer's stream repeats one message shape: the same content method but for
its delivery tag, the same content header, one body frame of the same size, on one channel. Once
the connection has decoded a message whole (method, header and body in one piece of the stream),
it gives that direction's frame reader the message's shape. Where the stream goes on with records
of exactly those bytes (tag and body aside), the reader cuts the whole run with one precompiled
struct and passes it on as one item: delivery tags and bodies, no frame tuples. Anything else (a
different frame or shape, a record the data cuts short, a tag the general path rejects) ends the
run where it stands and is framed one frame at a time as before. tests/test_fast_paths.py holds the
two ways to the same rows, counts, errors and connection facts.
"""

from struct import Struct

from .methods import INT64_MAX
from .spec import FRAME_BODY, FRAME_END, FRAME_HEADER, FRAME_METHOD

_FRAME_HEADER = Struct("!BHI")
MIN_WINDOW = 8  # records a cut tries at least (MessageShape.cut)


class MessageShape:
    """One message's frames as a byte pattern: constant bytes, the delivery tag's 8 bytes (content
    methods that carry one) and the body. Also carries what the connection decoded from them."""

    __slots__ = ("channel", "name", "shared", "properties", "body_size", "head", "middle", "tagged",
                 "records", "record_size", "window", "last_body", "last_hash", "last_identity")

    def __init__(self, channel: int, method: bytes, tag_at: int, header: bytes, body_size: int,
                 name: str, shared: tuple, properties: tuple):
        self.channel, self.name, self.shared, self.properties = channel, name, shared, properties
        self.body_size = body_size
        end = bytes((FRAME_END,))
        frames = (_FRAME_HEADER.pack(FRAME_METHOD, channel, len(method)) + method + end
                  + _FRAME_HEADER.pack(FRAME_HEADER, channel, len(header)) + header + end
                  + _FRAME_HEADER.pack(FRAME_BODY, channel, body_size))
        self.tagged = bool(tag_at)
        if self.tagged:
            cut = _FRAME_HEADER.size + tag_at
            self.head, self.middle = frames[:cut], frames[cut + 8:]
            self.records = Struct(f">{len(self.head)}sQ{len(self.middle)}s{body_size}sB")
        else:
            self.head, self.middle = frames, b""
            self.records = Struct(f">{len(frames)}s{body_size}sB")
        self.record_size = self.records.size
        self.window = MIN_WINDOW
        # The connection's memo of the last body's hash and identity (both fixed by the body, given
        # the shape's routing and properties): streams often repeat their bodies too.
        self.last_body = self.last_hash = self.last_identity = None

    def cut(self, data: bytes, pos: int) -> "MessageRun | None":
        """The run of whole records of this shape from `pos` on, or None if none is there. The
        caller checked that `data` has `self.head` at `pos`."""
        # Records are unpacked before they are checked, so no more are tried than twice the last
        # run held: a long run is cut in a few calls, and a stream whose runs are short (shapes
        # taking turns) does not unpack the rest of the data at every message.
        count = min((len(data) - pos) // self.record_size, self.window)
        if not count:
            return None
        records = self.records.iter_unpack(memoryview(data)[pos:pos + count * self.record_size])
        if self.tagged:
            starts, tags, middles, bodies, ends = zip(*records)
        else:
            starts, bodies, ends = zip(*records)
            tags = None
        # Usually every record tried belongs to the run: checked column by column, in C.
        whole = starts.count(self.head) == count and ends.count(FRAME_END) == count and (
            tags is None or (middles.count(self.middle) == count and max(tags) <= INT64_MAX))
        if not whole:
            count = self._matching(starts, tags, middles if tags is not None else None, ends)
            bodies = bodies[:count]
            tags = tags[:count] if tags is not None else None
        self.window = max(MIN_WINDOW, 2 * count)
        return MessageRun(self, tags, bodies) if count else None

    def _matching(self, starts: tuple, tags: tuple | None, middles: tuple | None, ends: tuple) -> int:
        """How many records from the first on are of this shape."""
        head, middle = self.head, self.middle
        for i, start in enumerate(starts):
            # A tag beyond int64 is the general path's to reject (a malformed-frame error).
            if start != head or ends[i] != FRAME_END or (tags is not None and (
                    middles[i] != middle or tags[i] > INT64_MAX)):
                return i
        return len(starts)


class MessageRun:
    """Consecutive messages of one shape, from one piece of the stream: an item of FrameReader.feed()."""

    __slots__ = ("shape", "tags", "bodies", "nbytes")

    def __init__(self, shape: MessageShape, tags: tuple[int, ...] | None, bodies: tuple[bytes, ...]):
        self.shape, self.tags, self.bodies = shape, tags, bodies
        self.nbytes = len(bodies) * shape.record_size
