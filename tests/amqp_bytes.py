"""AMQP 0-9-1 bytes for tests, built with pamqp (the reference encoder), and hypothesis strategies for them.

Shared by tests/test_methods.py and tests/test_fuzz.py. Nothing here uses the analyzer's own
encoding knowledge, so a test that compares the analyzer to these bytes is a real comparison.
"""

import datetime
import struct
from contextlib import contextmanager
from dataclasses import dataclass

from hypothesis import strategies as st
from pamqp import commands, frame, header
from pamqp import body as pamqp_body
from pamqp import heartbeat as pamqp_heartbeat

from analyzer.spec import METHODS, method_id

FRAME_METHOD, FRAME_HEADER, FRAME_BODY, FRAME_HEARTBEAT = 1, 2, 3, 8
HEARTBEAT_BYTES = pamqp_heartbeat.Heartbeat.marshal()

# spec name -> pamqp class, for every method both the analyzer and pamqp know.
PAMQP_CLASSES = {name: commands.INDEX_MAPPING[method_id(c, m)]
                 for (c, m), name in METHODS.items() if method_id(c, m) in commands.INDEX_MAPPING}


# -- encoding -------------------------------------------------------------------------------------

def _no_validate(self) -> None:
    """pamqp refuses names outside the spec's character class; RabbitMQ (and the wire) accept any UTF-8."""


@contextmanager
def unvalidated(cls):
    saved = cls.__dict__.get("validate")
    cls.validate = _no_validate
    try:
        yield
    finally:
        if saved is None:
            del cls.validate
        else:
            cls.validate = saved


def marshal(obj, channel: int = 1) -> bytes:
    """One whole frame (header, payload, frame-end) for a pamqp method, content header, body or heartbeat."""
    if isinstance(obj, commands.base.Frame):
        with unvalidated(type(obj)):
            return frame.marshal(obj, channel)
    return frame.marshal(obj, channel)


def split_frame(raw: bytes) -> tuple[int, int, bytes]:
    """(type, channel, payload) of one whole frame, checking its framing on the way."""
    ftype, channel, size = struct.unpack_from("!BHI", raw)
    assert len(raw) == 8 + size and raw[-1] == 0xCE, raw
    return ftype, channel, raw[7:-1]


def method_payload(obj) -> bytes:
    """The bytes between a method frame's 7-byte header and its frame-end octet."""
    return split_frame(marshal(obj))[2]


def frame_bytes(ftype: int, channel: int, payload: bytes) -> bytes:
    return struct.pack("!BHI", ftype, channel, len(payload)) + payload + b"\xce"


def make_method(name: str, **values):
    cls = PAMQP_CLASSES[name]
    obj = cls()
    for attr, value in values.items():
        assert attr in cls.__slots__, (name, attr)
        setattr(obj, attr, value)
    return obj


def content_header(body_size: int, **props) -> header.ContentHeader:
    properties = commands.Basic.Properties()
    for attr, value in props.items():  # set after __init__, which would refuse delivery_mode 0 or a cluster_id
        setattr(properties, attr, value)
    return header.ContentHeader(0, body_size, properties)


# -- hypothesis strategies ----------------------------------------------------------------------

def _fit_utf8(text: str, limit: int) -> str:
    return text.encode("utf-8")[:limit].decode("utf-8", "ignore")


utf8_chars = st.characters(codec="utf-8")
# Short strings: ASCII names, any UTF-8 (multi-byte, emoji), and ones at the 255-byte limit.
shortstrs = st.one_of(
    st.text(st.sampled_from("abcxyz.-_:09 "), max_size=20),
    st.text(utf8_chars, max_size=40).map(lambda s: _fit_utf8(s, 255)),
    st.text(utf8_chars, min_size=64, max_size=255).map(lambda s: _fit_utf8(s, 255)),
    st.sampled_from(["", "x" * 255, "é" * 127 + "x", "日本語" * 28, "\U0001f407" * 63]),
)
longstrs = st.text(utf8_chars, max_size=300)
delivery_tags = st.one_of(st.integers(0, 2**63 - 1), st.sampled_from([0, 1, 2**31, 2**32 - 1, 2**32, 2**63 - 1]))
body_sizes = st.one_of(st.integers(0, 2**63 - 1), st.sampled_from([0, 1, 2**32, 2**63 - 1]))
utc_seconds = st.integers(0, 0xFFFFFFFF).map(lambda s: datetime.datetime.fromtimestamp(s, datetime.timezone.utc))
table_keys = st.text(utf8_chars, max_size=30).map(lambda s: _fit_utf8(s, 128))

scalar_values = st.one_of(
    st.booleans(),
    st.integers(-2**63, 2**63 - 1),
    st.floats(width=32),
    st.text(utf8_chars, max_size=60),
    utc_seconds,
    st.decimals(min_value=0, max_value=21474836, places=2, allow_nan=False, allow_infinity=False),
    st.binary(max_size=20).map(bytearray),
    st.none(),
)
field_values = st.recursive(
    scalar_values,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(table_keys, inner, max_size=4)),
    max_leaves=12,
)
field_tables = st.dictionaries(table_keys, field_values, max_size=5)

x_death_entries = st.fixed_dictionaries(
    {"queue": st.text(utf8_chars, max_size=20), "reason": st.sampled_from(["rejected", "expired", "maxlen", "delivery_limit"]),
     "exchange": st.text(max_size=10), "routing-keys": st.lists(st.text(max_size=10), max_size=3), "time": utc_seconds},
    optional={"count": st.integers(0, 2**40), "original-expiration": st.text(max_size=5)},
)
message_headers = st.one_of(
    field_tables,
    st.builds(lambda extra, deaths: {**extra, "x-death": deaths}, field_tables, st.lists(x_death_entries, max_size=4)),
)

_BY_TYPE = {
    "bit": st.booleans(), "octet": st.integers(0, 255), "short": st.integers(0, 0xFFFF),
    "long": st.integers(0, 0xFFFFFFFF), "longlong": delivery_tags, "shortstr": shortstrs,
    "longstr": longstrs, "table": field_tables,
}
_failing_methods = st.sampled_from(sorted(METHODS))


def method_arguments(name: str):
    """A strategy for every argument of a method, reserved ones included."""
    cls = PAMQP_CLASSES[name]
    fields = {attr: _BY_TYPE[cls.amqp_type(attr)] for attr in cls.__slots__}
    if "class_id" in fields:  # channel.close / connection.close: usually a real method, sometimes 0 or nonsense
        pair = st.one_of(_failing_methods, st.tuples(st.integers(0, 0xFFFF), st.integers(0, 0xFFFF)))
        return st.builds(lambda f, p: {**f, "class_id": p[0], "method_id": p[1]},
                         st.fixed_dictionaries({k: v for k, v in fields.items() if k not in ("class_id", "method_id")}),
                         pair)
    return st.fixed_dictionaries(fields)


def methods(names=None):
    """(name, pamqp method object) for methods drawn from `names` (default: all pamqp knows)."""
    names = sorted(names or PAMQP_CLASSES)
    return st.sampled_from(names).flatmap(
        lambda name: method_arguments(name).map(lambda args: (name, make_method(name, **args))))


PROPERTY_STRATEGIES = {
    "content_type": shortstrs, "content_encoding": shortstrs, "headers": message_headers,
    "delivery_mode": st.integers(0, 255), "priority": st.integers(0, 255), "correlation_id": shortstrs,
    "reply_to": shortstrs, "expiration": shortstrs, "message_id": shortstrs, "timestamp": utc_seconds,
    "message_type": shortstrs, "user_id": shortstrs, "app_id": shortstrs, "cluster_id": shortstrs,
}
properties = st.fixed_dictionaries({}, optional=PROPERTY_STRATEGIES)


# -- frame streams for the fuzzers ------------------------------------------------------------------

@dataclass(frozen=True)
class Frame:
    ftype: int
    channel: int
    payload: bytes

    @property
    def raw(self) -> bytes:
        return frame_bytes(self.ftype, self.channel, self.payload)

    def as_tuple(self) -> tuple:
        return (self.ftype, self.channel, bytes(self.payload))


# Methods a real connection carries most, and a few with tables and strings.
STREAM_METHODS = (
    "basic.ack", "basic.nack", "basic.reject", "basic.deliver", "basic.publish", "basic.get-ok", "basic.return",
    "basic.qos", "basic.consume", "basic.consume-ok", "channel.open", "channel.open-ok", "channel.close",
    "confirm.select", "confirm.select-ok", "tx.select", "queue.declare", "queue.declare-ok", "connection.blocked",
)


@st.composite
def frames(draw, max_body: int = 300):
    """One frame, as (type, channel, payload), of any kind a connection carries."""
    kind = draw(st.sampled_from(["method", "method", "method", "header", "body", "heartbeat"]))
    channel = draw(st.integers(1, 0xFFFF))
    if kind == "method":
        _, obj = draw(methods(STREAM_METHODS))
        return Frame(*split_frame(marshal(obj, channel)))
    if kind == "header":
        props = draw(st.fixed_dictionaries({}, optional={k: PROPERTY_STRATEGIES[k] for k in
                                                         ("content_type", "delivery_mode", "message_id", "headers")}))
        return Frame(*split_frame(marshal(content_header(draw(body_sizes), **props), channel)))
    if kind == "body":
        return Frame(*split_frame(marshal(pamqp_body.ContentBody(draw(st.binary(min_size=1, max_size=max_body))), channel)))
    return Frame(*split_frame(HEARTBEAT_BYTES))


def with_unique_channels(frame_list: list) -> list:
    """Give every non-heartbeat frame its own channel number (its index + 1), so a frame names its place."""
    return [f if f.ftype == FRAME_HEARTBEAT else Frame(f.ftype, i + 1, f.payload) for i, f in enumerate(frame_list)]
