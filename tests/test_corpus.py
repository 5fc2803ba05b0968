"""The public corpus of real captures: our decoder against tshark on every file, and the negative controls."""

import csv
import os
from collections import Counter

import pytest

from analyzer.ingest import decode
from analyzer.spec import CONTENT_BODY, CONTENT_HEADER, HEARTBEAT

from .conftest import CORPUS
from .wire import compact
from .tshark import frames_by_method as tshark_frames_by_method


def manifest(name: str) -> list[dict]:
    path = os.path.join(CORPUS, name)
    if not os.path.exists(path):
        pytest.fail(f"corpus manifest missing: {path}")
    with open(path, newline="") as f:
        return list(csv.DictReader(f, delimiter="\t"))


POSITIVE = [row["file"] for row in manifest("MANIFEST.tsv")]
NEGATIVE = [row["file"] for row in manifest("NEGATIVE_CONTROLS.tsv")]


def decode_rows(path: str):
    rows = []
    report, connections = decode(path, lambda table: rows.extend(compact(table.to_pylist())))
    return report, rows, connections


@pytest.mark.parametrize("name", POSITIVE)
def test_frames_by_method_equal_tshark(corpus_dir, name):
    path = os.path.join(corpus_dir, name)
    report, rows, connections = decode_rows(path)
    assert report.errors == []
    assert not report.damaged
    expected = tshark_frames_by_method(path)
    assert sum(expected.values()) > 0
    assert report.frames_by_method == expected
    # Every method frame is one row; content frames fold into their method's row.
    methods = Counter(r["method"] for r in rows)
    for method, n in expected.items():
        if method not in (CONTENT_HEADER, CONTENT_BODY, HEARTBEAT):
            assert methods[method] == n, method
    assert report.amqp_connections == sum(c["protocol"] == "amqp-0-9-1" for c in connections) > 0


@pytest.mark.parametrize("name", NEGATIVE)
def test_negative_controls_are_unsupported_never_0_9_1(corpus_dir, name):
    path = os.path.join(corpus_dir, name)
    report, rows, connections = decode_rows(path)
    assert sum(report.frames_by_method.values()) == 0
    assert rows == []
    assert report.amqp_connections == 0
    assert sum(report.unsupported.values()) > 0
    expected_protocol = "rabbitmq-stream" if "Streams" in name else "amqp-1.0"
    assert report.unsupported.most_common(1)[0][0] == expected_protocol
    # tshark, told to decode the port as AMQP, finds no 0-9-1 frames either.
    ports = tuple({c["server_port"] for c in connections})
    assert sum(tshark_frames_by_method(path, ports).values()) == 0


@pytest.mark.parametrize("name,packets", [
    ("negative-controls/Go-RabbitMQ-Streams/rabbitmq.pcap", 270),
    ("negative-controls/Go-RabbitMQ-Streams/rabbitmq_sub.pcap", 187),
])
def test_truncated_files_report_the_packet_and_keep_what_came_before(corpus_dir, name, packets):
    path = os.path.join(corpus_dir, name)
    report, _, connections = decode_rows(path)
    assert report.damaged and not report.unreadable
    assert report.packets == packets
    assert len(report.errors) == 1
    assert path in report.errors[0] and f"packet {packets + 1}" in report.errors[0] and "truncated" in report.errors[0]
    assert len(connections) == 4


def test_midstream_capture_decodes_from_the_first_confident_boundary(corpus_dir):
    """nDPI's Celery capture has no handshake at all; delivery tags are already in the hundred thousands."""
    report, rows, connections = decode_rows(os.path.join(corpus_dir, "nDPI/amqp.pcap"))
    assert report.midstream_connections == 3
    assert {r["method"] for r in rows if r["method"].startswith("capture.")} == {"capture.midstream"}
    acks = sorted(r["delivery_tag"] for r in rows if r["method"] == "basic.ack")
    assert acks == [113943, 113944, 113945, 113946, 113947]
    deliveries = [r for r in rows if r["method"] == "basic.deliver"]
    assert all(r["content_complete"] and r["body_hash"] and r["message_identity"] for r in deliveries)


def test_connection_facts_from_the_handshake(corpus_dir):
    report, rows, connections = decode_rows(os.path.join(corpus_dir, "deepflow/amqp-error.pcap"))
    amqp = [c for c in connections if c["protocol"] == "amqp-0-9-1"]
    assert len(amqp) == 4
    assert {c["server_product"] for c in amqp} == {"RabbitMQ"}
    assert {c["server_version"] for c in amqp} == {"4.2.2"}
    assert all(c["client_product"].startswith("Pika") for c in amqp)
    assert {c["user"] for c in amqp} == {"guest"}
    assert sorted(c["vhost"] for c in amqp) == ["/", "/", "/bad", "/bad"]
    assert {c["close_code"] for c in amqp} == {530, 200}
    assert {(c["channel_max"], c["frame_max"], c["heartbeat"]) for c in amqp} == {(2047, 131072, 60)}
    assert {c["ip_version"] for c in amqp} == {4, 6}
    returned = [r for r in rows if r["method"] == "basic.return"]
    assert [(r["reply_code"], r["routing_key"], r["content_complete"]) for r in returned] == [(312, "nowhere", True)]
    closes = [r for r in rows if r["method"] == "channel.close" and r["reply_code"] == 406]
    assert closes and closes[0]["failing_method"] == "exchange.declare"
