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

from .spec import METHOD_NAMES, method_id

_U8 = Struct("!B")
_U16 = Struct("!H")
_U32 = Struct("!I")
_U64 = Struct("!Q")
_TAG_BITS = Struct("!QB")
_CONTENT_HEADER = Struct("!HHQH")
_RETURN_CODE = Struct("!H")

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


def _ack(p: bytes) -> dict:
    tag, bits = _TAG_BITS.unpack_from(p, 4)
    return {"method": "basic.ack", "delivery_tag": tag, "multiple": bool(bits & 1)}


def _nack(p: bytes) -> dict:
    tag, bits = _TAG_BITS.unpack_from(p, 4)
    return {"method": "basic.nack", "delivery_tag": tag, "multiple": bool(bits & 1), "requeue": bool(bits & 2)}


def _reject(p: bytes) -> dict:
    tag, bits = _TAG_BITS.unpack_from(p, 4)
    return {"method": "basic.reject", "delivery_tag": tag, "requeue": bool(bits & 1)}


def _deliver(p: bytes) -> dict:
    consumer_tag, pos = _shortstr(p, 4)
    tag, bits = _TAG_BITS.unpack_from(p, pos)
    exchange, pos = _shortstr(p, pos + 9)
    routing_key, _ = _shortstr(p, pos)
    return {"method": "basic.deliver", "consumer_tag": consumer_tag, "delivery_tag": tag,
            "redelivered": bool(bits & 1), "exchange": exchange, "routing_key": routing_key}


def _publish(p: bytes) -> dict:
    exchange, pos = _shortstr(p, 6)  # after the reserved 16-bit ticket
    routing_key, pos = _shortstr(p, pos)
    bits = p[pos]
    return {"method": "basic.publish", "exchange": exchange, "routing_key": routing_key,
            "mandatory": bool(bits & 1), "immediate": bool(bits & 2)}


def _get_ok(p: bytes) -> dict:
    tag, bits = _TAG_BITS.unpack_from(p, 4)
    exchange, pos = _shortstr(p, 13)
    routing_key, pos = _shortstr(p, pos)
    return {"method": "basic.get-ok", "delivery_tag": tag, "redelivered": bool(bits & 1),
            "exchange": exchange, "routing_key": routing_key,
            "message_count": _U32.unpack_from(p, pos)[0]}


def _return(p: bytes) -> dict:
    code = _RETURN_CODE.unpack_from(p, 4)[0]
    text, pos = _shortstr(p, 6)
    exchange, pos = _shortstr(p, pos)
    routing_key, _ = _shortstr(p, pos)
    return {"method": "basic.return", "reply_code": code, "reply_text": text,
            "exchange": exchange, "routing_key": routing_key}


FAST_DECODERS = {ID_ACK: _ack, ID_NACK: _nack, ID_REJECT: _reject, ID_DELIVER: _deliver,
                 ID_PUBLISH: _publish, ID_GET_OK: _get_ok, ID_RETURN: _return}

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
        fast = FAST_DECODERS.get(mid)
        if fast is not None:
            return fast(payload), None
        name = METHOD_NAMES.get(mid)
        cls = pamqp_commands.INDEX_MAPPING.get(mid)
        if name is None or cls is None:
            raise MalformedFrame(f"unknown method class {mid >> 16} method {mid & 0xFFFF}")
        obj = cls()
        obj.unmarshal(payload[4:])
    except MalformedFrame:
        raise
    except Exception as exc:  # pamqp raises assorted types on hostile bytes; all mean the same here
        raise MalformedFrame(f"cannot decode {METHOD_NAMES.get(mid, 'method')}: {type(exc).__name__}") from None
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
    return fields, obj


def plausible_method(payload: bytes) -> bool:
    """Is this a known method whose arguments decode? Used to find frame boundaries mid-stream."""
    try:
        decode_method(payload)
        return True
    except MalformedFrame:
        return False


# Content header properties in flag-bit order (AMQP 0-9-1 basic class): (bit, column, type).
PROPERTIES = (
    (15, "content_type", "s"), (14, "content_encoding", "s"), (13, "headers", "t"),
    (12, "delivery_mode", "o"), (11, "priority", "o"), (10, "correlation_id", "s"),
    (9, "reply_to", "s"), (8, "expiration", "s"), (7, "message_id", "s"),
    (6, "message_timestamp", "T"), (5, "message_type", "s"), (4, "user_id", "s"), (3, "app_id", "s"),
    (2, "cluster_id", "s"),
)


def decode_content_header(payload: bytes) -> tuple[int, dict]:
    """(body size, property fields) of a content header frame. Raises MalformedFrame."""
    try:
        class_id, weight, body_size, flags = _CONTENT_HEADER.unpack_from(payload)
        if class_id != 60 or weight != 0:
            raise MalformedFrame(f"content header for class {class_id} weight {weight}")
        pos = 14
        while payload[pos - 1] & 1:  # continuation bit: another flag word follows
            pos += 2
        props = {}
        if flags:
            for bit, column, kind in PROPERTIES:
                if not flags & (1 << bit):
                    continue
                if kind == "s":
                    props[column], pos = _shortstr(payload, pos)
                elif kind == "o":
                    props[column] = payload[pos]
                    pos += 1
                elif kind == "T":
                    props[column] = _U64.unpack_from(payload, pos)[0]
                    pos += 8
                else:
                    used, table = pamqp_decode.field_table(payload[pos:])
                    pos += used
                    props[column] = table
            if pos > len(payload):
                raise MalformedFrame("content header properties run past the end of the frame")
    except MalformedFrame:
        raise
    except Exception as exc:
        raise MalformedFrame(f"cannot decode content header: {type(exc).__name__}") from None
    headers = props.get("headers")
    if headers is not None:
        props["x_death_count"] = x_death_count(headers)
        props["headers"] = to_json(headers)
    props.pop("cluster_id", None)  # deprecated, never set by RabbitMQ
    return body_size, props


def x_death_count(headers: dict) -> int | None:
    """Times a message was dead-lettered, summed over RabbitMQ's x-death entries (one per queue and reason)."""
    deaths = headers.get("x-death")
    if not isinstance(deaths, list):
        return None
    return sum(int(d.get("count", 1)) for d in deaths if isinstance(d, dict))
