"""Method frames and content headers: payload bytes in, row fields out.

The hot methods (publish, deliver, get-ok, return, ack, nack, reject) and content headers have
hand-written decoders; everything else goes through pamqp. `tests/test_methods.py` checks the
fast paths against pamqp on the same bytes. Only whitelisted arguments become fields, which is
how secrets (the SASL response, `connection.update-secret`) can never reach a table or a log.
"""

import json
from struct import Struct

from pamqp import commands as pamqp_commands
from pamqp import decode as pamqp_decode

from .rows import ACK_FIELDS, PROPERTY_FIELDS, SHARED_METHOD_FIELDS
from .spec import METHOD_NAMES, method_id

_U8 = Struct("!B")
_U16 = Struct("!H")
_U32 = Struct("!I")
_U64 = Struct("!Q")
_TAG_BITS = Struct("!QB")
_CONTENT_HEADER = Struct("!HHQH")
_CLASS_WEIGHT_SIZE = Struct("!HHQ")
_RETURN_CODE = Struct("!H")

INT64_MAX = (1 << 63) - 1
ID_ACK = method_id(60, 80)
ID_NACK = method_id(60, 120)
ID_REJECT = method_id(60, 90)
ID_DELIVER = method_id(60, 60)
ID_PUBLISH = method_id(60, 40)
ID_GET_OK = method_id(60, 71)
ID_RETURN = method_id(60, 50)


class MalformedFrame(ValueError):
    """The frame's bytes do not decode as the method or header they claim to be (the sender's fault)."""


def _shortstr(buf: bytes, pos: int) -> tuple[str, int]:
    n = buf[pos]
    end = pos + 1 + n
    if end > len(buf):
        raise MalformedFrame("short string runs past the end of the frame")
    return buf[pos + 1:end].decode("utf-8", "replace"), end


# Fast decoders return tuples, method name first: ack decoders the values of rows.ACK_FIELDS; content
# decoders the delivery tag (or None) and one tuple of rows.SHARED_METHOD_FIELDS, which the decode memo
# hands out again for every message of the same shape.

def _tag(value: int) -> int:
    """Delivery tags are 64-bit on the wire but RabbitMQ stays below 2**63, as do our int64 columns."""
    if value > INT64_MAX:
        raise MalformedFrame(f"delivery tag {value} is beyond 2**63-1")
    return value


def _ack(p: bytes) -> tuple:
    tag, bits = _TAG_BITS.unpack_from(p, 4)
    return "basic.ack", _tag(tag), bool(bits & 1), None


def _nack(p: bytes) -> tuple:
    tag, bits = _TAG_BITS.unpack_from(p, 4)
    return "basic.nack", _tag(tag), bool(bits & 1), bool(bits & 2)


def _reject(p: bytes) -> tuple:
    tag, bits = _TAG_BITS.unpack_from(p, 4)
    return "basic.reject", _tag(tag), None, bool(bits & 1)


def _deliver(p: bytes) -> tuple:
    consumer_tag, pos = _shortstr(p, 4)
    tag, bits = _TAG_BITS.unpack_from(p, pos)
    exchange, pos = _shortstr(p, pos + 9)
    routing_key, _ = _shortstr(p, pos)
    return "basic.deliver", _tag(tag), (bool(bits & 1), exchange, routing_key, consumer_tag, None, None, None, None, None)


def _publish(p: bytes) -> tuple:
    exchange, pos = _shortstr(p, 6)  # after the reserved 16-bit ticket
    routing_key, pos = _shortstr(p, pos)
    bits = p[pos]
    return "basic.publish", None, (None, exchange, routing_key, None, bool(bits & 1), bool(bits & 2), None, None, None)


def _get_ok(p: bytes) -> tuple:
    tag, bits = _TAG_BITS.unpack_from(p, 4)
    exchange, pos = _shortstr(p, 13)
    routing_key, pos = _shortstr(p, pos)
    return ("basic.get-ok", _tag(tag), (bool(bits & 1), exchange, routing_key, None, None, None, None, None,
                                         _U32.unpack_from(p, pos)[0]))


def _return(p: bytes) -> tuple:
    code = _RETURN_CODE.unpack_from(p, 4)[0]
    text, pos = _shortstr(p, 6)
    exchange, pos = _shortstr(p, pos)
    routing_key, _ = _shortstr(p, pos)
    return "basic.return", None, (None, exchange, routing_key, None, None, None, code, text, None)


ACK_DECODERS = {ID_ACK: _ack, ID_NACK: _nack, ID_REJECT: _reject}
CONTENT_DECODERS = {ID_DELIVER: _deliver, ID_PUBLISH: _publish, ID_GET_OK: _get_ok, ID_RETURN: _return}
FAST_DECODERS = {**ACK_DECODERS, **CONTENT_DECODERS}

# pamqp attribute -> frames column. Anything not listed here is dropped on purpose.
FIELDS_FROM_PAMQP = {
    "delivery_tag": "delivery_tag", "multiple": "multiple", "requeue": "requeue",
    "redelivered": "redelivered", "exchange": "exchange", "routing_key": "routing_key",
    "queue": "queue", "consumer_tag": "consumer_tag", "mandatory": "mandatory",
    "immediate": "immediate", "no_ack": "no_ack", "no_local": "no_local", "exclusive": "exclusive",
    "prefetch_count": "prefetch_count", "prefetch_size": "prefetch_size", "global_": "prefetch_global",
    "nowait": "nowait", "reply_code": "reply_code", "reply_text": "reply_text",
    "message_count": "message_count", "consumer_count": "consumer_count", "active": "active",
    "reason": "detail", "durable": "durable", "auto_delete": "auto_delete", "passive": "passive",
    "internal": "internal", "exchange_type": "exchange_type", "source": "source_exchange",
    "destination": "destination", "if_unused": "if_unused", "if_empty": "if_empty",
    "virtual_host": "vhost", "arguments": "arguments",
    "channel_max": "channel_max", "frame_max": "frame_max", "heartbeat": "heartbeat",
    "mechanism": "auth_mechanism",
}


def to_json(value) -> str:
    """Field tables (arguments, headers) as JSON; AMQP types JSON lacks become strings."""
    return json.dumps(value, default=_json_default, sort_keys=True, separators=(",", ":"))


def _json_default(value):
    if isinstance(value, (bytes, bytearray)):
        return value.decode("utf-8", "replace")
    return str(value)


def decode_method(payload: bytes) -> tuple[dict, object | None]:
    """(row fields, pamqp object or None) for a method frame's payload. Raises MalformedFrame."""
    mid = 0
    try:
        mid = _U32.unpack_from(payload)[0]
        if mid in ACK_DECODERS:
            values = ACK_DECODERS[mid](payload)
            fields = {"method": values[0]}
            fields.update((k, v) for k, v in zip(ACK_FIELDS, values[1:]) if v is not None)
            return fields, None
        if mid in CONTENT_DECODERS:
            name, tag, shared = CONTENT_DECODERS[mid](payload)
            fields = {"method": name} if tag is None else {"method": name, "delivery_tag": tag}
            fields.update((k, v) for k, v in zip(SHARED_METHOD_FIELDS, shared) if v is not None)
            return fields, None
        name = METHOD_NAMES.get(mid)
        cls = pamqp_commands.INDEX_MAPPING.get(mid)
        if name is None or cls is None:
            raise MalformedFrame(f"unknown method class {mid >> 16} method {mid & 0xFFFF}")
        obj = cls()
        _unmarshal_checked(obj, payload[4:])
    except MalformedFrame:
        raise
    except Exception as exc:  # pamqp raises assorted types on hostile bytes; all mean the same here
        raise MalformedFrame(f"cannot decode {METHOD_NAMES.get(mid, 'method')}: {type(exc).__name__}") from None
    return fields_from_pamqp(name, obj), obj


def fields_from_pamqp(name: str, obj) -> dict:
    """Row fields from a decoded pamqp method, through the FIELDS_FROM_PAMQP whitelist."""
    fields = {"method": name}
    for attr in obj.__slots__:
        column = FIELDS_FROM_PAMQP.get(attr)
        if column is None:
            continue
        value = getattr(obj, attr)
        if column == "arguments":
            value = to_json(value) if value else None
        elif isinstance(value, bytes):
            value = value.decode("utf-8", "replace")
        fields[column] = value
    if name.endswith(".close") and getattr(obj, "class_id", 0):
        fields["failing_method"] = METHOD_NAMES.get(method_id(obj.class_id, obj.method_id),
                                                   f"{obj.class_id}.{obj.method_id}")
    return fields


def _unmarshal_checked(obj, data: bytes) -> None:
    """pamqp's Frame.unmarshal, but failing on arguments cut short: pamqp's string decoders slice
    without checking the declared length, so a truncated frame would decode to shortened values."""
    bit_offset, in_bits = 0, False
    for argument in obj.__slots__:
        data_type = obj.amqp_type(argument)
        if in_bits and (data_type != "bit" or bit_offset == 8):
            data = data[1:]
            bit_offset, in_bits = 0, False
        if not data:
            raise MalformedFrame(f"{obj.name} ends before its argument {argument}")
        consumed, value = pamqp_decode.by_type(data, data_type, bit_offset)
        if data_type == "bit":
            bit_offset += 1
            in_bits = True
            consumed = 0
        elif consumed > len(data):
            raise MalformedFrame(f"{obj.name} argument {argument} runs past the end of the frame")
        if isinstance(value, int) and not isinstance(value, bool) and value > INT64_MAX:
            raise MalformedFrame(f"{obj.name} argument {argument} is beyond 2**63-1")
        setattr(obj, argument, value)
        data = data[consumed:]


def plausible_method(payload: bytes) -> bool:
    """Is this a known method whose arguments decode? Used to find frame boundaries mid-stream."""
    try:
        decode_method(payload)
        return True
    except MalformedFrame:
        return False


# Content header properties in flag-bit order (AMQP 0-9-1 basic class): (bit, index in
# rows.PROPERTY_FIELDS, type). cluster_id (bit 2) is deprecated and never set by RabbitMQ: skipped.
PROPERTIES = (
    (15, 0, "s"), (14, 1, "s"), (13, 2, "t"), (12, 3, "o"), (11, 4, "o"), (10, 5, "s"), (9, 6, "s"),
    (8, 7, "s"), (7, 8, "s"), (6, 9, "T"), (5, 10, "s"), (4, 11, "s"), (3, 12, "s"), (2, None, "s"),
)
NO_PROPERTIES = (None,) * len(PROPERTY_FIELDS)
X_DEATH = PROPERTY_FIELDS.index("x_death_count")
HEADERS = PROPERTY_FIELDS.index("headers")


def content_properties(payload: bytes) -> tuple[int, tuple]:
    """(body size, values laid out as rows.PROPERTY_FIELDS) of a content header frame. Raises MalformedFrame."""
    try:
        class_id, weight, body_size, flags = _CONTENT_HEADER.unpack_from(payload)
        if class_id != 60 or weight != 0:
            raise MalformedFrame(f"content header for class {class_id} weight {weight}")
        if body_size > INT64_MAX:
            raise MalformedFrame(f"body size {body_size} is beyond 2**63-1")
        if not flags:
            return body_size, NO_PROPERTIES
        pos = 14
        while payload[pos - 1] & 1:  # continuation bit: another flag word follows
            pos += 2
        values = list(NO_PROPERTIES)
        for bit, index, kind in PROPERTIES:
            if not flags & (1 << bit):
                continue
            if kind == "s":
                value, pos = _shortstr(payload, pos)
            elif kind == "o":
                value = payload[pos]
                pos += 1
            elif kind == "T":
                value = _U64.unpack_from(payload, pos)[0]
                pos += 8
                if value > INT64_MAX:  # a nonsense timestamp costs the property, not the message
                    value = None
            else:
                used, table = pamqp_decode.field_table(payload[pos:])
                pos += used
                values[X_DEATH] = x_death_count(table)
                value = to_json(table)
            if index is not None:
                values[index] = value
        if pos > len(payload):
            raise MalformedFrame("content header properties run past the end of the frame")
    except MalformedFrame:
        raise
    except Exception as exc:
        raise MalformedFrame(f"cannot decode content header: {type(exc).__name__}") from None
    return body_size, tuple(values)


def decode_content_header(payload: bytes) -> tuple[int, dict]:
    """(body size, the properties that are set, by column name). Raises MalformedFrame."""
    body_size, values = content_properties(payload)
    return body_size, {k: v for k, v in zip(PROPERTY_FIELDS, values) if v is not None}


def x_death_count(headers: dict) -> int | None:
    """Times a message was dead-lettered, summed over RabbitMQ's x-death entries (one per queue and
    reason). A count we cannot read is skipped: it costs this figure, never the message's properties."""
    deaths = headers.get("x-death")
    if not isinstance(deaths, list):
        return None
    total = 0
    for death in deaths:
        if isinstance(death, dict):
            count = death.get("count", 1)  # brokers before 3.5 wrote one entry per death, without a count
            if type(count) is int and count >= 0:
                total += count
    return min(total, INT64_MAX)


def delivery_tag_offset(mid: int, payload: bytes) -> int:
    """Where a content method's 64-bit delivery tag starts in its payload; 0 when it has none."""
    if mid == ID_DELIVER:
        return 5 + payload[4]  # after the method id and the consumer tag (a short string)
    if mid == ID_GET_OK:
        return 4
    return 0


class DecodeMemo:
    """Per-connection memo of content-method and content-header decodes. A publisher repeats its
    exchange, routing key and properties message after message, and a consumer sees the same
    consumer tag and routing: the bytes repeat, so most decodes become one dict look-up. Delivery
    tags, the one field that always changes, are cut out of the key and put back."""

    __slots__ = ("methods", "properties", "limit")

    def __init__(self, limit: int = 4096):
        self.limit = limit  # entries per memo; a connection with more distinct shapes starts over
        self.methods: dict[bytes, tuple] = {}
        self.properties: dict[bytes, tuple] = {}

    def content_method(self, mid: int, payload: bytes) -> tuple:
        tag_at = delivery_tag_offset(mid, payload)
        key = payload[:tag_at] + payload[tag_at + 8:] if tag_at else payload
        fields = self.methods.get(key)
        if fields is None:
            fields = CONTENT_DECODERS[mid](payload)
            if len(self.methods) >= self.limit:
                self.methods.clear()
            self.methods[key] = fields
            return fields
        if tag_at:
            return fields[0], _tag(_U64.unpack_from(payload, tag_at)[0]), fields[2]
        return fields

    def content_header(self, payload: bytes) -> tuple[int, tuple]:
        key = payload[12:]  # property flags and values; the body size varies, and is read every time
        values = self.properties.get(key)
        if values is None:
            body_size, values = content_properties(payload)
            if len(self.properties) >= self.limit:
                self.properties.clear()
            self.properties[key] = values
            return body_size, values
        class_id, weight, body_size = _CLASS_WEIGHT_SIZE.unpack_from(payload)
        if class_id != 60 or weight != 0 or body_size > INT64_MAX:
            return content_properties(payload)  # raises MalformedFrame with the reason
        return body_size, values
