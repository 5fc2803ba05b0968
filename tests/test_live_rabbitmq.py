"""Real traffic: pika drives the real RabbitMQ, dumpcap records loopback, ackscope ingests, tshark checks."""

import json
import os
import secrets
import subprocess
import sys
from pathlib import Path

import pika
import pytest

from analyzer.lake import read_table
from analyzer.schema import CONNECTIONS, FRAMES

from tests.lab import broker
from tests.lab.recording import Recording

from .tshark import frames_by_method as tshark_frames_by_method

pytestmark = pytest.mark.rabbitmq

USER = "ackscope-test"
MESSAGES = 300


@pytest.fixture(scope="module")
def test_user():
    """A broker user whose password appears nowhere else, so a search for it in the tables means something."""
    return broker.user_with_fresh_password(USER, "pw-")


def publish_and_consume(name: str, password: str) -> None:
    parameters = pika.ConnectionParameters(host=broker.HOST, port=broker.PORT,
                                           credentials=pika.PlainCredentials(USER, password),
                                           client_properties={"connection_name": name})
    connection = pika.BlockingConnection(parameters)
    try:
        channel = connection.channel()
        queue = channel.queue_declare(queue="", exclusive=True).method.queue
        channel.confirm_delivery()
        for i in range(MESSAGES):
            channel.basic_publish("", queue, f"message {i}".encode(),
                                  pika.BasicProperties(delivery_mode=2, message_id=f"{name}-{i}"))
        channel.basic_qos(prefetch_count=50)
        received = []
        for method, _, _ in channel.consume(queue, inactivity_timeout=10):
            assert method is not None, "the broker stopped delivering"
            received.append(method.delivery_tag)
            if len(received) % 10 == 0:
                channel.basic_ack(method.delivery_tag, multiple=True)
            elif len(received) % 10 == 5:
                channel.basic_ack(method.delivery_tag)
            if len(received) == MESSAGES:
                break
        channel.cancel()
        channel.close()
    finally:
        connection.close()


def test_real_broker_traffic_decodes_like_tshark_and_keeps_no_password(tmp_path, test_user, dumpcap):
    name = f"ackscope-live-{secrets.token_hex(4)}"
    recording = Recording(tmp_path / "raw.pcapng")
    recording.start()
    try:
        publish_and_consume(name, test_user)
    finally:
        recording.stop()
    capture = tmp_path / "live.pcapng"
    recording.keep_streams(capture, name, set())

    lake = tmp_path / "lake"
    result = subprocess.run([sys.executable, "-m", "analyzer.cli", "ingest", str(capture), "--lake", str(lake), "--json"],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["errors"] == [] and report["gaps"] == 0
    assert report["frames_by_method"] == dict(tshark_frames_by_method(str(capture)))
    frames = report["frames_by_method"]
    assert frames["basic.publish"] == frames["basic.deliver"] == MESSAGES
    assert frames["content.header"] == 2 * MESSAGES
    assert frames["confirm.select"] == 1 and frames["basic.qos"] == 1

    table = read_table(str(lake), "frames", FRAMES).to_pylist()
    confirms = [r for r in table if r["method"] == "basic.ack" and r["direction"] == "to_client"]
    consumer_acks = [r for r in table if r["method"] == "basic.ack" and r["direction"] == "to_broker"]
    assert max(r["delivery_tag"] for r in confirms) == MESSAGES  # every publish was confirmed
    assert max(r["delivery_tag"] for r in consumer_acks) == MESSAGES
    assert any(r["multiple"] for r in consumer_acks) and not all(r["multiple"] for r in consumer_acks)
    publishes = [r for r in table if r["method"] == "basic.publish"]
    assert {r["delivery_mode"] for r in publishes} == {2}
    assert sorted(r["message_identity"] for r in publishes) == sorted(f"id:{name}-{i}" for i in range(MESSAGES))

    connections = read_table(str(lake), "connections", CONNECTIONS).to_pylist()
    mine = [c for c in connections if c["connection_name"] == name]
    assert len(mine) == 1 and mine[0]["user"] == USER and mine[0]["server_product"] == "RabbitMQ"
    assert mine[0]["ended_by"] in ("connection.close", "tcp.fin")

    with open(capture, "rb") as f:
        assert test_user.encode() in f.read()  # the wire did carry it
    for folder, _, files in os.walk(lake):
        for file_name in files:
            assert test_user.encode() not in Path(folder, file_name).read_bytes(), file_name
    assert test_user not in result.stdout + result.stderr
