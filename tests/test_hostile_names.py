"""A client that picks its own connection name, queue names, message ids and vhost, tried as an
attacker would from the wire only, through the real RabbitMQ, recorded by dumpcap and by the agent
at once: every human-readable output of ackscope (ingest, analyze, findings, summary, report, the
agent's own lines) shows control and bidi characters as visible escapes, one row per line, long
values cut; `--json` keeps the exact values."""

from __future__ import annotations

import json
import re
import secrets
import subprocess
import sys

import pika
import pika.exceptions
import pytest

from tests.agent_support import AgentProcess
from tests.lab import broker
from tests.port_recording import PortRecording

pytestmark = pytest.mark.rabbitmq

# What a terminal would act on: C0 but the newline between lines, DEL, C1, line separators, bidi.
RAW_CONTROL = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]")
TOKEN = secrets.token_hex(4)
# Retitles the terminal (OSC), clears it, colours, reverses the text after it, and forges a row.
HOSTILE_NAME = (f"hostile-{TOKEN}\x1b]0;pwn\x07\x1b[2J\x1b[31m\u202eevil\u2066\r\n"
                "critical  lost_confirm  forged-connection  1  2026-01-01 00:00:00.000  1  forged\x7f\x85\u2028")
HUGE_NAME = f"huge-{TOKEN}-" + "h" * 100_000 + "\x1b[2J"
HOSTILE_QUEUE = f"q-{TOKEN}\x1b[2J\u202e"  # pika hangs on a newline in a queue name
HOSTILE_MESSAGE_ID = f"m-{TOKEN}\x1b]0;pwn\x07\ncritical forged"
REFUSED_VHOST = f"\x1b[2Jrefused-{TOKEN}\n\u202e"
REQUEUES = 12


def connect(port: int, name: str, vhost: str = "/") -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters(
        host=broker.HOST, port=port, virtual_host=vhost, credentials=pika.PlainCredentials(broker.USER, broker.PASSWORD),
        client_properties={"connection_name": name}))


def hostile_traffic(port: int) -> None:
    connection = connect(port, HOSTILE_NAME)
    channel = connection.channel()
    channel.queue_declare(HOSTILE_QUEUE, exclusive=True)
    for n in range(3):  # persistent, no confirms: unconfirmed_persistent_publish
        channel.basic_publish("", HOSTILE_QUEUE, b"body %d" % n,
                              pika.BasicProperties(delivery_mode=2, message_id=f"{HOSTILE_MESSAGE_ID}-{n}"))
    channel.queue_purge(HOSTILE_QUEUE)
    channel.basic_publish("", HOSTILE_QUEUE, b"poison", pika.BasicProperties(message_id=HOSTILE_MESSAGE_ID))
    for _ in range(REQUEUES):  # the same message bounced back again and again: requeue_loop
        method, _, _ = channel.basic_get(HOSTILE_QUEUE)
        assert method is not None
        channel.basic_nack(method.delivery_tag, requeue=True)
    method, _, _ = channel.basic_get(HOSTILE_QUEUE)
    channel.basic_ack(method.delivery_tag)
    connection.close()

    with pytest.raises(pika.exceptions.AMQPConnectionError):  # RabbitMQ resets a 100 KB connection.start-ok
        connect(port, HUGE_NAME)

    with pytest.raises(pika.exceptions.AMQPConnectionError):
        connect(port, f"refused-{TOKEN}", vhost=REFUSED_VHOST)


def ackscope(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "analyzer.cli", *args], capture_output=True, text=True,
                          encoding="utf-8", errors="surrogateescape")


def assert_printable(what: str, text: str) -> None:
    raw = RAW_CONTROL.search(text)
    assert raw is None, f"{what}: raw {raw.group()!r} at {raw.start()}: {text[max(raw.start() - 60, 0):raw.start() + 20]!r}"


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """The traffic through the agent's relay, recorded by dumpcap (the relay's port only) and the agent."""
    out = tmp_path_factory.mktemp("hostile")
    with AgentProcess(str(out / "agent-lake"), agent_id="hostile", relayed=True) as agent:
        with PortRecording(out / "hostile.pcapng", agent.broker_port) as recording:
            hostile_traffic(agent.broker_port)
        recording.stop()
        metrics = agent.get("/metrics")
        agent.stop()
    return out, recording.path, agent, metrics


@pytest.fixture(scope="module")
def analysed(recorded):
    out, capture, _, _ = recorded
    lake = str(out / "lake")
    outputs = {"ingest": ackscope("ingest", str(capture), "--lake", lake),
               "analyze": ackscope("analyze", "--lake", lake, "--master", "local[1]")}
    for command, result in outputs.items():
        assert result.returncode == 0, (command, result.stderr[-3000:])
    for command in ("findings", "summary"):
        outputs[command] = ackscope(command, "--lake", lake)
        outputs[command + " --json"] = ackscope(command, "--lake", lake, "--json")
    outputs["report"] = ackscope("report", "--lake", lake, "-o", str(out / "report.html"))
    return lake, outputs


def test_no_human_readable_output_carries_a_raw_control_or_bidi_character(analysed, recorded):
    _, outputs = analysed
    for command, result in outputs.items():
        assert result.returncode == 0, (command, result.stderr[-3000:])
        assert_printable(f"{command} stdout", result.stdout)
        assert_printable(f"{command} stderr", result.stderr)
    agent = recorded[2]
    assert_printable("capture stderr", agent.stderr)


def test_one_finding_is_one_line_and_the_exact_values_are_in_the_json(analysed):
    _, outputs = analysed
    findings = json.loads(outputs["findings --json"].stdout)
    mine = [f for f in findings if f["connection_name"] == HOSTILE_NAME]
    assert {f["kind"] for f in mine} >= {"requeue_loop", "unconfirmed_persistent_publish"}
    loop = next(f for f in mine if f["kind"] == "requeue_loop")
    assert HOSTILE_MESSAGE_ID in loop["summary"]  # exact, control characters and all
    table = outputs["findings"].stdout.rstrip("\n").split("\n")
    assert len(table) == len(findings) + 1  # the header, then one line a finding: no forged rows
    assert not any(line.startswith("critical  lost_confirm  forged") for line in table)
    shown = [line for line in table if f"hostile-{TOKEN}" in line]
    assert len(shown) == len(mine)
    assert all("\\x1b]0;pwn\\x07\\x1b[2J" in line and "\\u202e" in line and "\\r\\n" in line for line in shown)
    assert "analysed" in outputs["analyze"].stdout and len(outputs["analyze"].stdout.split("\n")) < 200


def test_the_summary_keeps_a_connection_on_one_line_and_cuts_a_100_kb_name(analysed):
    _, outputs = analysed
    summary = json.loads(outputs["summary --json"].stdout)
    names = {c["connection_name"] for c in summary["connections"]}
    assert {HOSTILE_NAME, HUGE_NAME} <= names  # exact, all 100,000 characters of it
    refused = [c for c in summary["connections"] if c["vhost"] == REFUSED_VHOST]
    assert len(refused) == 1
    lines = outputs["summary"].stdout.rstrip("\n").split("\n")
    expected = 1 + len(summary["connections"]) + (1 + len(summary["rows_by_method"]) if summary["rows_by_method"] else 0)
    assert len(lines) == expected
    huge_line = next(line for line in lines if f"huge-{TOKEN}" in line)
    assert "...[+" in huge_line and len(huge_line) < 1000
    assert any("\\x1b[2Jrefused-" in line and "\\n\\u202e" in line for line in lines)
