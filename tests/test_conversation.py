"""Whole AMQP conversations through the sans-IO core (flow table -> reassembly -> framing -> rows)."""

import random

from pamqp import commands

from analyzer.framing import DEFAULT_MAX_FRAME
from analyzer.packets import TCP_ACK, Segment

from .wire import BROKER, CLIENT, PASSWORD, Conversation, content, handshake, method, methods_of, run

OPENING = ["amqp.protocol-header", "connection.start", "connection.start-ok", "connection.tune",
           "connection.tune-ok", "connection.open", "connection.open-ok", "channel.open", "channel.open-ok"]


def confirm_and_consume() -> list[tuple[int, bytes]]:
    """A publisher in confirm mode and a consumer with manual acks, on channel 1 of one connection."""
    return handshake() + [
        (0, method(commands.Confirm.Select())),
        (1, method(commands.Confirm.SelectOk())),
        (0, content(commands.Basic.Publish(exchange="", routing_key="q", mandatory=True), b"hello",
                    delivery_mode=2, message_id="m-1")
         + content(commands.Basic.Publish(exchange="", routing_key="q"), b"x" * 300_000, frame_size=131_064)),
        (1, method(commands.Basic.Ack(delivery_tag=2, multiple=True))),
        (0, method(commands.Basic.Qos(prefetch_count=100)) + method(commands.Basic.Consume(queue="q", consumer_tag="c1"))),
        (1, method(commands.Basic.QosOk()) + method(commands.Basic.ConsumeOk(consumer_tag="c1"))
         + content(commands.Basic.Deliver(consumer_tag="c1", delivery_tag=1, exchange="", routing_key="q"), b"hello",
                   message_id="m-1", headers={"x-death": [{"count": 3, "queue": "q"}, {"count": 2, "queue": "dlq"}]})),
        (0, method(commands.Basic.Nack(delivery_tag=1, multiple=False, requeue=True))),
        (1, content(commands.Basic.Deliver(consumer_tag="c1", delivery_tag=2, redelivered=True, exchange="",
                                           routing_key="q"), b"hello")),
        (0, method(commands.Basic.Reject(delivery_tag=2, requeue=False))),
        (0, method(commands.Channel.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0))),
        (1, method(commands.Channel.CloseOk())),
    ]


EXPECTED = OPENING + ["confirm.select", "confirm.select-ok", "basic.publish", "basic.publish", "basic.ack",
                      "basic.qos", "basic.consume", "basic.qos-ok", "basic.consume-ok", "basic.deliver",
                      "basic.nack", "basic.deliver", "basic.reject", "channel.close", "channel.close-ok"]


def clean_run(sizes=None, shuffle_seed=None, duplicate=False):
    conv = Conversation()
    segments = conv.open() + conv.script(confirm_and_consume(), sizes)
    if duplicate:
        segments = [s for seg in segments for s in (seg, seg)]
    if shuffle_seed is not None:  # reorder within small windows, as a capture on a busy host does
        rng = random.Random(shuffle_seed)
        head, body = segments[:3], segments[3:]
        for i in range(0, len(body), 4):
            window = body[i:i + 4]
            rng.shuffle(window)
            body[i:i + 4] = window
        segments = head + body
    return run(segments + [conv.fin(0), conv.fin(1), conv.ack(0)])


def comparable(rows):
    return [{k: v for k, v in r.items() if k not in ("seq", "ts_ns", "ts", "source_packet")}
            for r in sorted(rows, key=lambda r: r["seq"])]


def test_a_clean_conversation_decodes_every_method_in_order():
    rows, counts, errors, table = clean_run()
    assert errors == []
    assert methods_of(rows) == EXPECTED + ["tcp.fin", "tcp.fin"]
    assert counts["content.header"] == 4 and counts["content.body"] == 6  # the 300 kB body is 3 frames
    publish = [r for r in rows if r["method"] == "basic.publish"]
    assert [(p["body_size"], p["content_complete"], p["mandatory"], p.get("delivery_mode")) for p in publish] == \
        [(5, True, True, 2), (300_000, True, False, None)]
    assert publish[0]["message_identity"] == "id:m-1"
    assert publish[1]["message_identity"].startswith("h:") and publish[1]["body_hash"]
    deliver = [r for r in rows if r["method"] == "basic.deliver"]
    assert deliver[0]["x_death_count"] == 5 and '"x-death"' in deliver[0]["headers"]
    assert [d["redelivered"] for d in deliver] == [False, True]
    # Same body, exchange and routing key without a message_id: the identity is the content hash.
    assert deliver[1]["message_identity"] == message_identity_of(rows, "basic.deliver", 2)
    conn = table.connections[0].connection_row()
    assert conn["connection_name"] == "test-client" and conn["user"] == "guest"
    assert (conn["channel_max"], conn["frame_max"], conn["heartbeat"], conn["vhost"]) == (2047, 131072, 60, "/")
    assert conn["ended_by"] == "tcp.fin" and conn["gaps"] == 0


def message_identity_of(rows, method_name, tag):
    from analyzer.connection import message_identity
    row = next(r for r in rows if r["method"] == method_name and r["delivery_tag"] == tag)
    return message_identity(None, row["exchange"], row["routing_key"], row["body_hash"])


def test_directions_and_fields_of_acks_nacks_rejects():
    rows, *_ = clean_run()
    by_method = {r["method"]: r for r in rows}
    assert by_method["basic.ack"]["direction"] == "to_client"  # a publisher confirm
    assert (by_method["basic.ack"]["delivery_tag"], by_method["basic.ack"]["multiple"]) == (2, True)
    assert (by_method["basic.nack"]["direction"], by_method["basic.nack"]["requeue"]) == ("to_broker", True)
    assert (by_method["basic.reject"]["delivery_tag"], by_method["basic.reject"]["requeue"]) == (2, False)
    assert by_method["basic.qos"]["prefetch_count"] == 100
    assert by_method["channel.close"]["reply_code"] == 200
    assert {r["client_port"] for r in rows} == {CLIENT[1]} and {r["server_port"] for r in rows} == {BROKER[1]}


def test_segmentation_does_not_change_the_events():
    reference = comparable(clean_run()[0])
    for sizes in (1, 7, 100, 1460):
        rows, counts, errors, _ = clean_run(sizes=sizes)
        assert errors == []
        assert comparable(rows) == reference, sizes


def per_direction(rows):
    """Reordering may interleave the two directions differently; each direction's own order is what must hold."""
    return {d: [r for r in comparable(rows) if r["direction"] == d] for d in ("to_broker", "to_client")}


def test_retransmissions_and_reordering_do_not_change_the_events():
    reference = per_direction(clean_run(sizes=50)[0])
    for seed in range(5):
        rows, _, errors, table = clean_run(sizes=50, shuffle_seed=seed, duplicate=True)
        assert errors == []
        assert per_direction(rows) == reference
        assert table.connections[0].connection_row()["retransmitted_bytes"] > 0


def test_a_lost_segment_is_a_gap_and_framing_resynchronises_without_inventing_frames():
    conv = Conversation()
    segments = conv.open() + conv.script(handshake())
    lost = conv.send(0, content(commands.Basic.Publish(routing_key="q"), b"a" * 2000), sizes=500)
    after = conv.send(0, method(commands.Basic.Publish(routing_key="q2"))[:0] + content(
        commands.Basic.Publish(routing_key="after"), b"b" * 10))
    segments += [lost[0]] + lost[2:] + after + [conv.ack(1)]  # the broker acks the segment we never saw
    rows, counts, errors, table = run(segments)
    names = methods_of(rows)
    assert "capture.gap" in names
    gap = next(r for r in rows if r["method"] == "capture.gap")
    assert gap["gap_bytes"] == 500 and gap["direction"] == "to_broker"
    publishes = [r for r in rows if r["method"] == "basic.publish"]
    assert [(p["routing_key"], p["content_complete"]) for p in publishes] == [("q", False), ("after", True)]
    assert table.connections[0].connection_row()["gaps"] == 1


def test_a_capture_that_starts_mid_stream():
    conv = Conversation()
    conv.script(handshake())  # happened before the capture began
    segments = conv.send(1, content(commands.Basic.Deliver(consumer_tag="c", delivery_tag=5000, routing_key="q"),
                                    b"late")[3:])  # starts inside a frame
    segments += conv.send(1, content(commands.Basic.Deliver(consumer_tag="c", delivery_tag=5001, routing_key="q"), b"x"))
    segments += conv.send(0, method(commands.Basic.Ack(delivery_tag=5001, multiple=True)))
    rows, counts, errors, table = run(segments)
    assert errors == []
    assert methods_of(rows) == ["capture.midstream", "basic.deliver", "capture.midstream", "basic.ack"]
    assert [r["delivery_tag"] for r in rows if r["method"] != "capture.midstream"] == [5001, 5001]
    conn = table.connections[0].connection_row()
    assert conn["protocol"] == "amqp-0-9-1" and conn["started_at_syn"] is False


def test_a_flow_joined_late_opens_at_its_first_bytes_and_the_tail_of_an_ended_one_is_no_connection():
    conv = Conversation()
    conv.script(handshake())  # before the capture began
    late = [conv.ack(0), conv.ack(1)] + conv.send(1, method(commands.Basic.Deliver(
        consumer_tag="c", delivery_tag=7, routing_key="q")))
    rows, _, errors, table = run(late)
    assert errors == [] and len(table.connections) == 1
    assert table.connections[0].connection_row()["first_ts_ns"] == 1_700_000_000_000_000_000 + 3 * 1000
    ended = Conversation(client=(bytes([10, 0, 0, 9]), 40123))
    ended.script(handshake())
    tail = [ended.fin(1), ended.fin(0), ended.ack(1)]  # its close: all the capture saw of it
    rows, _, errors, table = run(tail)
    assert rows == [] and errors == [] and table.connections == []


def test_garbage_on_the_port_is_reported_and_later_frames_are_found_again():
    conv = Conversation()
    segments = conv.open() + conv.script(handshake())
    segments += conv.send(0, b"\x01\x00\x01\xff\xff\xff\xff" + b"garbage" * 50)  # a 4 GiB frame size
    segments += conv.send(0, method(commands.Basic.Ack(delivery_tag=1)) + method(commands.Basic.Ack(delivery_tag=2)))
    rows, counts, errors, table = run(segments)
    assert any("over the limit" in e for e in errors)
    assert [r["delivery_tag"] for r in rows if r["method"] == "basic.ack"] == [1, 2]
    framer = table.connections[0].framers[0]
    assert framer._have <= DEFAULT_MAX_FRAME


def test_huge_frames_are_never_buffered_beyond_the_negotiated_frame_max():
    conv = Conversation()
    segments = conv.open() + conv.script(handshake())
    segments += conv.send(0, b"\x03\x00\x01\x00\x10\x00\x00" + b"z" * 200_000, sizes=1460)  # 1 MiB "body"
    rows, counts, errors, table = run(segments, finish=False)
    framer = table.connections[0].framers[0]
    assert framer.max_frame == 131072
    assert framer._have <= 131072 + 8
    assert any("frame size 1048576 over the limit 131072" in e for e in errors)


def test_the_sasl_password_never_reaches_a_row():
    rows, _, _, table = clean_run()
    text = repr(rows) + repr(table.connections[0].connection_row())
    assert PASSWORD not in text
    assert "guest" in text  # the user name is kept


def test_heartbeats_are_counted_and_kept_as_rows():
    conv = Conversation()
    hb = b"\x08\x00\x00\x00\x00\x00\x00\xce"
    rows, counts, errors, table = run(conv.open() + conv.script(handshake() + [(0, hb), (1, hb + hb)]))
    assert counts["heartbeat"] == 3
    assert table.connections[0].connection_row()["heartbeats"] == 3
    assert [r["direction"] for r in rows if r["method"] == "heartbeat"] == ["to_broker", "to_client", "to_client"]


def test_port_reuse_starts_a_new_connection():
    first = Conversation(client_isn=1000)
    segments = first.open() + first.script(handshake()) + [first.fin(0), first.fin(1)]
    second = Conversation(client_isn=777_777)
    segments += second.open() + second.script(handshake(name="second"))
    rows, counts, errors, table = run(segments)
    names = [c.connection_row()["connection_name"] for c in table.connections]
    assert names == ["test-client", "second"]
    assert len({r["connection_id"] for r in rows}) == 2


def test_a_reset_ends_the_connection_and_open_content_is_marked_incomplete():
    conv = Conversation()
    segments = conv.open() + conv.script(handshake())
    segments += conv.send(0, content(commands.Basic.Publish(routing_key="q"), b"y" * 1000)[:-400])
    segments.append(conv.rst(0))
    rows, counts, errors, table = run(segments)
    publish = next(r for r in rows if r["method"] == "basic.publish")
    assert publish["content_complete"] is False
    assert methods_of(rows)[-1] == "tcp.rst"
    assert table.connections[0].connection_row()["ended_by"] == "tcp.rst"


def test_sequence_numbers_wrap_around():
    conv = Conversation(client_isn=(1 << 32) - 300, broker_isn=(1 << 32) - 5)
    rows, counts, errors, _ = run(conv.open() + conv.script(confirm_and_consume(), sizes=97))
    assert errors == []
    assert methods_of(rows) == EXPECTED


def test_amqp_on_another_port_is_found_by_its_protocol_header_and_other_traffic_is_ignored():
    conv = Conversation(broker=(bytes([10, 0, 0, 3]), 15672))
    other = Conversation(broker=(bytes([10, 0, 0, 4]), 80))
    segments = conv.open() + conv.script(handshake()) + other.open() + other.send(0, b"GET / HTTP/1.1\r\n\r\n")
    rows, counts, errors, table = run(segments)
    assert len(table.connections) == 1
    assert methods_of(rows) == OPENING


def test_a_foreign_protocol_on_the_broker_port_is_unsupported():
    conv = Conversation()
    segments = conv.open() + conv.send(0, b"AMQP\x00\x01\x00\x00" + b"\x00" * 40) + conv.send(1, b"AMQP\x00\x01\x00\x00")
    rows, counts, errors, table = run(segments)
    assert rows == [] and counts == {}
    assert table.connections[0].connection_row()["protocol"] == "amqp-1.0"


def test_truncated_packets_become_gaps():
    conv = Conversation()
    segments = conv.open() + conv.script(handshake())
    data = method(commands.Basic.Ack(delivery_tag=1)) + method(commands.Basic.Ack(delivery_tag=2))
    seg = conv.send(0, data)[0]
    segments.append(Segment(seg.src, seg.dst, seg.sport, seg.dport, seg.seq, seg.ack, TCP_ACK, data[:25], len(data) - 25))
    segments += conv.send(0, method(commands.Basic.Ack(delivery_tag=3)))
    rows, counts, errors, _ = run(segments)
    assert [r["delivery_tag"] for r in rows if r["method"] == "basic.ack"] == [1, 3]
    assert [r["detail"] for r in rows if r["method"] == "capture.gap"] == ["truncated"]
