"""Method frames and content headers: our decoders against pamqp, on the same bytes.

The bytes come from pamqp's encoder (`pamqp.frame.marshal`); the reference values from pamqp's
decoder (`pamqp.frame.unmarshal`) on those bytes. For the hand-written fast paths (ack, nack,
reject, deliver, publish, get-ok, return, content headers) this is a real differential test; for
the methods that go through pamqp it checks the `FIELDS_FROM_PAMQP` column mapping.
"""

import datetime
import json
import os
import struct

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, Phase, assume, example, given, settings
from hypothesis import strategies as st
from pamqp import commands, encode, frame, header

from analyzer import methods, spec
from analyzer.methods import FIELDS_FROM_PAMQP, MalformedFrame, decode_content_header, decode_method, fields_from_pamqp, to_json
from analyzer.schema import FRAMES

from . import amqp_bytes as ab

pytestmark = pytest.mark.filterwarnings("ignore:This command is deprecated:DeprecationWarning")

# Shrinking a failure can take minutes; CI wants the verdict fast. ACKSCOPE_FUZZ_SHRINK=1 shrinks.
PHASES = tuple(Phase) if os.environ.get("ACKSCOPE_FUZZ_SHRINK") else (Phase.explicit, Phase.reuse, Phase.generate)
FAST = settings(max_examples=40, deadline=None, derandomize=True, database=None, phases=PHASES,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
THOROUGH = settings(FAST, max_examples=200)

KNOWN_METHODS = sorted(ab.PAMQP_CLASSES)
FAST_PATH_METHODS = sorted(spec.METHOD_NAMES[mid] for mid in methods.FAST_DECODERS)

# pamqp property name -> frames column
PROPERTY_COLUMNS = {
    "content_type": "content_type", "content_encoding": "content_encoding", "headers": "headers",
    "delivery_mode": "delivery_mode", "priority": "priority", "correlation_id": "correlation_id",
    "reply_to": "reply_to", "expiration": "expiration", "message_id": "message_id",
    "timestamp": "message_timestamp", "message_type": "message_type", "user_id": "user_id", "app_id": "app_id",
}


def pamqp_unmarshal(raw: bytes):
    consumed, channel, obj = frame.unmarshal(raw)
    assert consumed == len(raw)
    return obj


def expected_fields(name: str, ref) -> dict:
    """The row fields pamqp's own decoding implies, under the analyzer's whitelist of columns. For the
    fast-path methods this is the differential check; for the rest it checks our length-checked
    unmarshal against pamqp's."""
    return fields_from_pamqp(name, ref)


def schema_misfits(fields: dict) -> list:
    """Fields whose value the frames table's column cannot hold (the sink would fail on the whole batch)."""
    bad = []
    for column, value in fields.items():
        if column in FRAMES.names:
            try:
                pa.array([value], type=FRAMES.field(column).type)
            except (pa.ArrowException, OverflowError, TypeError, ValueError) as exc:
                bad.append((column, value, type(exc).__name__))
    return bad


# -- every method, against pamqp ----------------------------------------------------------------

def test_every_spec_method_but_access_is_known_to_pamqp():
    """access.* is deprecated and pamqp 4 dropped it; everything else must be covered below."""
    missing = {name for name in spec.METHODS.values() if name not in ab.PAMQP_CLASSES}
    assert missing == {"access.request", "access.request-ok"}


@pytest.mark.parametrize("name", KNOWN_METHODS)
@FAST
@given(data=st.data())
def test_method_matches_pamqp(name, data):
    args = data.draw(ab.method_arguments(name), label="arguments")
    raw = ab.marshal(ab.make_method(name, **args), channel=data.draw(st.integers(0, 0xFFFF), label="channel"))
    ftype, _, payload = ab.split_frame(raw)
    assert ftype == spec.FRAME_METHOD
    ref = pamqp_unmarshal(raw)

    fields, decoded = decode_method(payload)

    assert fields == expected_fields(name, ref)
    assert not schema_misfits(fields)
    # And the values survived the trip, so pamqp's decoder is not hiding an encoding mistake.
    for attr, value in args.items():
        column = FIELDS_FROM_PAMQP.get(attr)
        if column is not None and column != "arguments":
            assert fields[column] == value, attr
    if "arguments" in args:
        got = fields["arguments"]
        assert (json.loads(got).keys() if got else set()) == args["arguments"].keys()
    if name in FAST_PATH_METHODS:
        assert decoded is None
    else:
        assert type(decoded) is type(ref)


@pytest.mark.parametrize("name", FAST_PATH_METHODS)
@THOROUGH
@given(data=st.data())
def test_fast_path_matches_pamqp_thoroughly(name, data):
    args = data.draw(ab.method_arguments(name), label="arguments")
    raw = ab.marshal(ab.make_method(name, **args))
    fields, _ = decode_method(ab.split_frame(raw)[2])
    assert fields == expected_fields(name, pamqp_unmarshal(raw))


@pytest.mark.parametrize("tag", [0, 1, 2**32 - 1, 2**32, 2**62 + 1, 2**63 - 1])
@pytest.mark.parametrize("bits", range(4))
def test_ack_family_tags_and_bits(tag, bits):
    multiple, requeue = bool(bits & 1), bool(bits & 2)
    cases = [("basic.ack", commands.Basic.Ack(tag, multiple), {"multiple": multiple}),
             ("basic.nack", commands.Basic.Nack(tag, multiple, requeue), {"multiple": multiple, "requeue": requeue}),
             ("basic.reject", commands.Basic.Reject(tag, requeue), {"requeue": requeue})]
    for name, obj, flags in cases:
        fields, _ = decode_method(ab.method_payload(obj))
        assert fields == {"method": name, "delivery_tag": tag, **flags}


def test_deliver_with_longest_non_ascii_strings():
    consumer_tag, exchange, routing_key = "é" * 127 + "x", "日本語" * 28 + "xyz", "\U0001f407" * 63
    assert all(len(s.encode()) == 255 for s in (consumer_tag, exchange)) and len(routing_key.encode()) == 252
    obj = commands.Basic.Deliver(consumer_tag, 2**63 - 1, True, "", "")
    obj.exchange, obj.routing_key = exchange, routing_key
    fields, _ = decode_method(ab.method_payload(obj))
    assert fields == {"method": "basic.deliver", "consumer_tag": consumer_tag, "delivery_tag": 2**63 - 1,
                      "redelivered": True, "exchange": exchange, "routing_key": routing_key}


def test_close_names_the_failing_method():
    fields, _ = decode_method(ab.method_payload(commands.Channel.Close(406, "PRECONDITION_FAILED - unknown delivery tag 7", 60, 80)))
    assert fields == {"method": "channel.close", "reply_code": 406,
                      "reply_text": "PRECONDITION_FAILED - unknown delivery tag 7", "failing_method": "basic.ack"}
    fields, _ = decode_method(ab.method_payload(commands.Connection.Close(320, "CONNECTION_FORCED", 0, 0)))
    assert "failing_method" not in fields


# -- content headers ------------------------------------------------------------------------------

def expected_x_death_count(headers: dict):
    deaths = headers.get("x-death")
    if not isinstance(deaths, list):
        return None
    return sum(d.get("count", 1) for d in deaths if isinstance(d, dict))


def expected_properties(props) -> dict:
    """The properties that are set, by column; x_death_count when the headers carry x-death."""
    out = {}
    for attr, column in PROPERTY_COLUMNS.items():
        value = getattr(props, attr)
        if value is None:
            continue
        if attr == "headers":
            out["x_death_count"] = expected_x_death_count(value)
            value = to_json(value)
        elif attr == "timestamp":
            value = int(value.timestamp())
        out[column] = value
    return {k: v for k, v in out.items() if v is not None}


@THOROUGH
@given(props=ab.properties, body_size=ab.body_sizes, channel=st.integers(0, 0xFFFF))
def test_content_header_matches_pamqp(props, body_size, channel):
    raw = ab.marshal(ab.content_header(body_size, **props), channel)
    ftype, _, payload = ab.split_frame(raw)
    assert ftype == spec.FRAME_HEADER
    ref = pamqp_unmarshal(raw)

    size, fields = decode_content_header(payload)

    assert size == ref.body_size == body_size
    assert fields == expected_properties(ref.properties)
    assert "cluster_id" not in fields
    assert not schema_misfits({"body_size": size, **fields})


@FAST
@given(props=ab.properties, body_size=ab.body_sizes, extra_words=st.lists(st.integers(0, 0xFFFF).map(lambda w: w & ~1),
                                                                       min_size=1, max_size=3))
def test_content_header_with_continued_flag_words_matches_pamqp(props, body_size, extra_words):
    """Property flags may continue into further 16-bit words (bit 0 set); both decoders must skip them alike."""
    payload = ab.split_frame(ab.marshal(ab.content_header(body_size, **props)))[2]
    words = [w | 1 for w in extra_words[:-1]] + [extra_words[-1]]
    first = struct.unpack_from("!H", payload, 12)[0] | 1
    continued = payload[:12] + struct.pack(f"!{1 + len(words)}H", first, *words) + payload[14:]
    ref = header.ContentHeader()
    ref.unmarshal(continued)
    size, fields = decode_content_header(continued)
    assert size == ref.body_size
    assert fields == expected_properties(ref.properties)


def test_content_header_with_all_properties():
    ts = datetime.datetime(2024, 5, 17, 12, 0, 0, tzinfo=datetime.timezone.utc)
    headers = {"x-death": [{"count": 3, "reason": "rejected", "queue": "q1", "time": ts,
                            "exchange": "", "routing-keys": ["q1"]},
                           {"count": 2, "reason": "expired", "queue": "q1.retry", "time": ts,
                            "exchange": "dlx", "routing-keys": ["q1"]}],
               "x-first-death-queue": "q1", "trace": {"span": 7, "tags": ["a", 1, None]}}
    raw = ab.marshal(ab.content_header(
        2**63 - 1, content_type="application/json", content_encoding="gzip", headers=headers, delivery_mode=2,
        priority=9, correlation_id="c-1", reply_to="amq.rabbitmq.reply-to", expiration="60000",
        message_id="m-ü-1", timestamp=ts, message_type="order.created", user_id="guest", app_id="shop",
        cluster_id="legacy"))
    size, fields = decode_content_header(ab.split_frame(raw)[2])
    assert size == 2**63 - 1
    assert fields.pop("x_death_count") == 5
    assert json.loads(fields.pop("headers"))["x-first-death-queue"] == "q1"
    assert fields == {"content_type": "application/json", "content_encoding": "gzip", "delivery_mode": 2,
                      "priority": 9, "correlation_id": "c-1", "reply_to": "amq.rabbitmq.reply-to",
                      "expiration": "60000", "message_id": "m-ü-1", "message_timestamp": int(ts.timestamp()),
                      "message_type": "order.created", "user_id": "guest", "app_id": "shop"}


@pytest.mark.parametrize("headers, count", [
    ({}, None), ({"x-death": "nope"}, None), ({"x-death": []}, 0),
    ({"x-death": [{"count": 4}, {"reason": "expired"}, "junk", {"count": 0}]}, 5),
    ({"x-death": [{"count": 2**40}, {"count": 1}]}, 2**40 + 1),
])
def test_x_death_count(headers, count):
    _, fields = decode_content_header(ab.split_frame(ab.marshal(ab.content_header(1, headers=headers)))[2])
    assert fields.get("x_death_count") == count


@FAST
@given(count=ab.field_values)
@example(count="abc").via("a string count")
@example(count=None).via("a void count")
@example(count={"n": 1}).via("a table count")
@example(count=float("nan")).via("a NaN count")
def test_x_death_with_any_count_type_still_decodes(count):
    """x-death is an ordinary header any client can set: a count of another type is well-formed AMQP.
    The header must decode (its message_id is the message's identity); the count is a best effort."""
    headers = {"x-death": [{"count": count, "queue": "q"}, {"count": 2}]}
    payload = ab.split_frame(ab.marshal(ab.content_header(7, message_id="m-1", headers=headers)))[2]
    size, fields = decode_content_header(payload)
    assert size == 7 and fields["message_id"] == "m-1" and "headers" in fields
    assert fields.get("x_death_count") is None or isinstance(fields["x_death_count"], int)


# -- what reaches the frames table -------------------------------------------------------------------

ACK_FAMILY = [spec.METHOD_IDS[n] for n in ("basic.ack", "basic.nack", "basic.reject")]


@FAST
@given(mid=st.sampled_from(ACK_FAMILY + [spec.METHOD_IDS["basic.deliver"], spec.METHOD_IDS["basic.get-ok"]]),
       tag=st.integers(0, 2**64 - 1), tail=st.binary(max_size=40))
@example(mid=spec.METHOD_IDS["basic.ack"], tag=2**64 - 1, tail=b"\x00").via("the largest 64-bit tag on the wire")
def test_decoded_delivery_tags_fit_the_frames_table(mid, tag, tail):
    """The wire carries 64 unsigned bits; the delivery_tag column is int64 (RabbitMQ's tags stop at
    2**63 - 1). A hostile or corrupt tag must be refused as malformed, not break the Arrow batch."""
    if mid in ACK_FAMILY:
        payload = struct.pack("!IQ", mid, tag) + tail[:1].ljust(1, b"\x00")
    elif mid == spec.METHOD_IDS["basic.deliver"]:
        payload = struct.pack("!IB", mid, 1) + b"c" + struct.pack("!QB", tag, 0) + b"\x00\x00"
    else:
        payload = struct.pack("!IQB", mid, tag, 0) + b"\x00\x00" + struct.pack("!I", 3)
    try:
        fields, _ = decode_method(payload)
    except MalformedFrame:
        return
    assert not schema_misfits(fields), fields


@FAST
@given(body_size=st.integers(0, 2**64 - 1), timestamp=st.integers(0, 2**64 - 1),
       counts=st.lists(st.integers(0, 2**63 - 1), max_size=3))
@example(body_size=2**64 - 1, timestamp=0, counts=[]).via("the largest body size on the wire")
@example(body_size=1, timestamp=2**64 - 1, counts=[]).via("the largest timestamp on the wire")
@example(body_size=1, timestamp=0, counts=[2**63 - 1, 2**63 - 1]).via("x-death counts summing past int64")
def test_decoded_content_header_fits_the_frames_table(body_size, timestamp, counts):
    headers = encode.field_table({"x-death": [{"count": c} for c in counts]})
    flags = 0x2000 | 0x0040  # headers, timestamp (in that order on the wire)
    payload = struct.pack("!HHQH", 60, 0, body_size, flags) + headers + struct.pack("!Q", timestamp)
    try:
        size, fields = decode_content_header(payload)
    except MalformedFrame:
        return
    assert not schema_misfits({"body_size": size, **fields}), (size, fields)


# -- secrets ------------------------------------------------------------------------------------------

passwords = st.text(ab.utf8_chars, min_size=6, max_size=60).map(lambda s: "pw\u00a7" + s)


def leaks(fields: dict, secret: str) -> list:
    needles = [secret, repr(secret)[1:-1], secret.encode("utf-8").hex()]
    return [(k, v) for k, v in fields.items() for n in needles if n in repr(v) or n in str(v)]


@FAST
@given(user=st.text(st.characters(codec="ascii", exclude_characters="\x00"), max_size=20),
       password=passwords, props=ab.field_tables)
def test_start_ok_plain_response_never_reaches_fields(user, password, props):
    obj = commands.Connection.StartOk(client_properties=props, mechanism="PLAIN",
                                      response=f"\x00{user}\x00{password}", locale="en_US")
    payload = ab.method_payload(obj)
    assume(password not in repr(props))
    fields, _ = decode_method(payload)
    assert fields["method"] == "connection.start-ok"
    assert fields["auth_mechanism"] == "PLAIN"
    assert not leaks(fields, password)
    # Cut short, the error message must not carry it either.
    for cut in range(len(payload) - 1, 3, -7):
        try:
            fields, _ = decode_method(payload[:cut])
        except MalformedFrame as exc:
            assert password not in str(exc)
        else:
            assert not leaks(fields, password)


@FAST
@given(user=st.text(st.characters(codec="ascii"), max_size=20),
       password=st.text(st.characters(codec="ascii"), min_size=6, max_size=40).map(lambda s: "pw#" + s))
def test_start_ok_amqplain_response_never_reaches_fields(user, password):
    # ASCII keeps the table's own bytes valid UTF-8, which pamqp's str-only longstr encoder needs.
    response = encode.field_table({"LOGIN": user, "PASSWORD": password})[4:].decode("ascii")
    fields, _ = decode_method(ab.method_payload(commands.Connection.StartOk(mechanism="AMQPLAIN", response=response)))
    assert not leaks(fields, password)


@FAST
@given(secret=passwords, reason=ab.shortstrs)
def test_update_secret_never_reaches_fields(secret, reason):
    assume(secret not in reason)
    fields, _ = decode_method(ab.method_payload(commands.Connection.UpdateSecret(secret, reason)))
    assert fields == {"method": "connection.update-secret", "detail": reason}
    assert not leaks(fields, secret)


def test_secure_ok_response_never_reaches_fields():
    fields, _ = decode_method(ab.method_payload(commands.Connection.SecureOk("\x00guest\x00s3cr3t-Pa55")))
    assert fields == {"method": "connection.secure-ok"}


# -- malformed payloads -------------------------------------------------------------------------------

def representative(name: str):
    """An instance with every string and table non-empty, so a cut can land inside each of them."""
    cls = ab.PAMQP_CLASSES[name]
    values = {"bit": True, "octet": 9, "short": 406, "long": 70000, "longlong": 2**40 + 7,
              "shortstr": "släpp-ned", "longstr": "PLAIN AMQPLAIN", "table": {"x-max-length": 10, "k": "v"}}
    args = {attr: values[cls.amqp_type(attr)] for attr in cls.__slots__}
    if "class_id" in args:
        args["class_id"], args["method_id"] = 60, 80
    return ab.make_method(name, **args)


@pytest.mark.parametrize("name", KNOWN_METHODS)
def test_truncated_method_raises_malformed_at_every_length(name):
    payload = ab.method_payload(representative(name))
    decode_method(payload)  # whole, it decodes
    accepted = []
    for cut in range(len(payload)):
        try:
            fields, _ = decode_method(payload[:cut])
        except MalformedFrame:
            continue
        accepted.append((cut, fields))
    assert not accepted, f"{len(payload)}-byte {name} cut short decoded anyway: {accepted[:3]}"


@FAST
@given(data=st.data())
def test_truncated_fast_path_methods_raise_malformed(data):
    name, obj = data.draw(ab.methods(FAST_PATH_METHODS))
    payload = ab.method_payload(obj)
    cut = data.draw(st.integers(0, len(payload) - 1))
    with pytest.raises(MalformedFrame):
        decode_method(payload[:cut])


@settings(FAST, max_examples=15)
@given(props=ab.properties.filter(bool), body_size=ab.body_sizes)
def test_truncated_content_header_raises_malformed_at_every_length(props, body_size):
    payload = ab.split_frame(ab.marshal(ab.content_header(body_size, **props)))[2]
    for cut in range(len(payload)):
        with pytest.raises(MalformedFrame):
            decode_content_header(payload[:cut])


def test_content_header_for_another_class_or_weight_is_malformed():
    payload = bytearray(ab.split_frame(ab.marshal(ab.content_header(5, message_id="m")))[2])
    for offset, value in ((1, 50), (3, 1)):  # class queue; weight 1
        bad = bytearray(payload)
        bad[offset] = value
        with pytest.raises(MalformedFrame):
            decode_content_header(bytes(bad))


unknown_ids = st.integers(0, 2**32 - 1).filter(lambda mid: mid not in spec.METHOD_NAMES)


@FAST
@given(mid=st.one_of(unknown_ids, st.sampled_from([spec.method_id(30, 10), spec.method_id(30, 11),
                                                   spec.method_id(60, 0), spec.method_id(0, 80),
                                                   spec.method_id(40, 41), spec.method_id(60, 130)])),
       tail=st.binary(max_size=64))
def test_unknown_method_ids_raise_malformed(mid, tail):
    with pytest.raises(MalformedFrame):
        decode_method(mid.to_bytes(4, "big") + tail)


@THOROUGH
@given(mid=st.sampled_from(sorted(spec.METHOD_NAMES)), tail=st.binary(max_size=80))
def test_random_arguments_decode_or_raise_malformed(mid, tail):
    try:
        fields, _ = decode_method(mid.to_bytes(4, "big") + tail)
    except MalformedFrame:
        return
    assert fields["method"] == spec.METHOD_NAMES[mid]


@THOROUGH
@given(flags=st.integers(0, 0xFFFF), tail=st.binary(max_size=120), body_size=st.integers(0, 2**64 - 1))
def test_random_content_header_decodes_or_raises_malformed(flags, tail, body_size):
    payload = b"\x00\x3c\x00\x00" + body_size.to_bytes(8, "big") + flags.to_bytes(2, "big") + tail
    try:
        size, _ = decode_content_header(payload)
    except MalformedFrame:
        return
    assert size == body_size


@FAST
@given(data=st.data())
def test_mutated_method_decodes_or_raises_malformed(data):
    _, obj = data.draw(ab.methods())
    payload = bytearray(ab.method_payload(obj))
    for _ in range(data.draw(st.integers(1, 4))):
        pos = data.draw(st.integers(0, len(payload) - 1))
        payload[pos] = data.draw(st.integers(0, 255))
    try:
        decode_method(bytes(payload))
    except MalformedFrame:
        pass


def test_method_payload_shorter_than_its_id_is_malformed():
    for payload in (b"", b"\x00", b"\x00\x3c", b"\x00\x3c\x00"):
        with pytest.raises(MalformedFrame):
            decode_method(payload)


CONTENT_PATH_METHODS = sorted(spec.METHOD_NAMES[mid] for mid in methods.CONTENT_DECODERS)


@pytest.mark.parametrize("name", CONTENT_PATH_METHODS)
@FAST
@given(data=st.data())
def test_decode_memo_gives_what_the_decoders_give(name, data):
    """The memo keys on bytes with the delivery tag cut out: same shapes with new tags, and new shapes,
    must come back exactly as a fresh decode would, including after the memo starts over."""
    memo = methods.DecodeMemo(limit=3)
    args = data.draw(ab.method_arguments(name), label="arguments")
    mid = spec.METHOD_IDS[name]
    for round_ in range(6):
        if "delivery_tag" in args and round_ % 2:
            args["delivery_tag"] = data.draw(ab.delivery_tags, label="next tag")
        elif round_ == 4:
            args = data.draw(ab.method_arguments(name), label="other arguments")
        payload = ab.split_frame(ab.marshal(ab.make_method(name, **args)))[2]
        assert memo.content_method(mid, payload) == methods.CONTENT_DECODERS[mid](payload)


@FAST
@given(props=st.lists(ab.properties, min_size=1, max_size=3), sizes=st.lists(ab.body_sizes, min_size=4, max_size=8))
def test_decode_memo_content_headers(props, sizes):
    memo = methods.DecodeMemo(limit=2)
    for i, body_size in enumerate(sizes):
        raw = ab.marshal(ab.content_header(body_size, **props[i % len(props)]))
        payload = ab.split_frame(raw)[2]
        assert memo.content_header(payload) == methods.content_properties(payload)
    bad = bytearray(payload)
    bad[0:2] = b"\x00\x3d"  # same properties, but class 61: must still be rejected
    with pytest.raises(MalformedFrame):
        memo.content_header(bytes(bad))
