"""`capture --pcap-out`: the SASL response blanked in the written packets (lengths kept), files and
folder readable by their owner only. Unit tests of the blanker on packets built with scapy, and a
real pika login with a marker password captured through the agent beside dumpcap."""

from __future__ import annotations

import glob
import os
import stat
import subprocess

import pika
import pytest
from scapy.layers.inet import IP, TCP
from scapy.layers.l2 import Ether
from scapy.packet import Raw

from pamqp import commands, encode

from analyzer.agent import blank_sasl
from analyzer.agent.blank_sasl import SaslBlanker
from analyzer.connection import sasl_user
from analyzer.packets import LINKTYPE_ETHERNET, tcp_segment
from tests.agent_support import AgentProcess
from tests.lab import broker
from tests.port_recording import PortRecording
from tests.tshark import frames_by_method, tshark_path
from tests.wire import BROKER, PASSWORD, Conversation, compact, handshake, method, methods_of, run

USER = "ackscope-pcap-out"


def packet(seg) -> bytes:
    flags = "".join(f for bit, f in ((1, "F"), (2, "S"), (4, "R"), (16, "A")) if seg.flags & bit)
    return bytes(Ether() / IP(src=".".join(map(str, seg.src)), dst=".".join(map(str, seg.dst)))
                 / TCP(sport=seg.sport, dport=seg.dport, seq=seg.seq, ack=seg.ack, flags=flags) / Raw(seg.payload))


def opening(name: str = "test-client", sizes: int | None = None, syn: bool = True):
    conversation = Conversation()
    segments = (conversation.open() if syn else []) + conversation.script(handshake(name=name), sizes)
    return segments + [conversation.fin(0), conversation.fin(1)]


def blanked(segments, order=None) -> tuple[list[bytes], list[bytes], SaslBlanker]:
    packets = [packet(seg) for seg in segments]
    order = order if order is not None else range(len(packets))
    blanker = SaslBlanker(LINKTYPE_ETHERNET)
    return [packets[i] for i in order], [blanker.packet(packets[i]) for i in order], blanker


def decoded(packets: list[bytes]):
    return run([tcp_segment(LINKTYPE_ETHERNET, p) for p in packets])[0]


@pytest.mark.parametrize("name, sizes", [("test-client", None), ("test-client", 7), ("n" * 100_000, 1400),
                                         ("n" * 5000, 3)])
def test_the_response_is_zeroed_in_place_and_every_frame_still_decodes(name, sizes):
    before, after, blanker = blanked(opening(name, sizes))
    assert PASSWORD.encode() in b"".join(p[54:] for p in before)
    assert PASSWORD.encode() not in b"".join(p[54:] for p in after) and blanker.blanked >= 1
    assert [len(p) for p in after] == [len(p) for p in before]
    rows_before, rows_after = decoded(before), decoded(after)
    assert methods_of(rows_after) == methods_of(rows_before)
    assert compact(rows_after) == compact(rows_before)  # the response is never a column: nothing else moved


def _start_ok_response(packets: list[bytes]) -> tuple[str, bytes]:
    """The mechanism and response of the start-ok in these packets' client stream (sent in order)."""
    stream = b"".join(p[54:] for p in packets if tcp_segment(LINKTYPE_ETHERNET, p).sport != BROKER[1])
    at = stream.index(b"\x00\x0a\x00\x0b", 8) + 4   # the start-ok's class and method, after the protocol header
    at += 4 + int.from_bytes(stream[at:at + 4], "big")  # its client properties
    mechanism = stream[at + 1:at + 1 + stream[at]].decode()
    at += 1 + stream[at]
    return mechanism, stream[at + 4:at + 4 + int.from_bytes(stream[at:at + 4], "big")]


def _opening_with(mechanism: str, response: bytes, sizes: int | None = None):
    steps = handshake()
    steps[2] = (0, method(commands.Connection.StartOk(client_properties={"product": "pika"}, mechanism=mechanism,
                                                      response=response.decode("latin-1")), 0))
    conversation = Conversation()
    return conversation.open() + conversation.script(steps, sizes) + [conversation.fin(0), conversation.fin(1)]


AMQPLAIN = encode.field_table({"LOGIN": "guest", "PASSWORD": PASSWORD, "X": "y"})[4:]
AMQPLAIN_PASSWORD_FIRST = encode.field_table({"PASSWORD": PASSWORD, "LOGIN": "guest"})[4:]


@pytest.mark.parametrize("mechanism, response, kept", [
    ("PLAIN", f"\x00guest\x00{PASSWORD}".encode(), b"\x00guest\x00"),
    ("PLAIN", f"admin\x00guest\x00{PASSWORD}".encode(), b"admin\x00guest\x00"),
    ("AMQPLAIN", AMQPLAIN, AMQPLAIN.replace(PASSWORD.encode(), bytes(len(PASSWORD)))),
    ("AMQPLAIN", AMQPLAIN_PASSWORD_FIRST, AMQPLAIN_PASSWORD_FIRST.replace(PASSWORD.encode(), bytes(len(PASSWORD)))),
    ("PLAIN", f"guest{PASSWORD}".encode(), b""),                      # no second NUL: not understood
    ("AMQPLAIN", encode.field_table({"LOGIN": "guest", "PASSWORD": 7})[4:], b""),   # not a long string
    ("EXTERNAL", PASSWORD.encode(), b""),                              # another mechanism: zeroed whole
])
def test_only_the_password_is_zeroed_and_the_user_name_survives(mechanism, response, kept):
    """PLAIN's bytes after its second NUL, AMQPLAIN's PASSWORD value; a response not understood whole."""
    before, after, _ = blanked(_opening_with(mechanism, response))
    assert _start_ok_response(before) == (mechanism, response)
    _, out = _start_ok_response(after)
    assert len(out) == len(response) and out == kept + bytes(len(response) - len(kept))
    assert PASSWORD.encode() not in b"".join(p[54:] for p in after)
    if kept:
        assert sasl_user(mechanism, out) == sasl_user(mechanism, response) == "guest"


@pytest.mark.parametrize("sizes", [1, 3, 7])
def test_a_response_cut_between_segments_loses_at_most_what_passed_before_its_password_was_placed(sizes):
    """A segment holding the response's first bytes passes before the password is placed: those
    bytes are zeroed (they might be it); none of the password survives, whatever the cut."""
    response = f"\x00guest\x00{PASSWORD}".encode()
    before, after, _ = blanked(_opening_with("PLAIN", response, sizes))
    _, out = _start_ok_response(after)
    assert len(out) == len(response) and out.endswith(bytes(len(PASSWORD)))
    assert all(b in (0, response[i]) for i, b in enumerate(out))
    assert PASSWORD.encode() not in b"".join(p[54:] for p in after)


@pytest.mark.parametrize("keep_aside", [True, False])
def test_a_segment_ahead_of_a_gap_before_the_response_is_placed_is_blanked_whole(keep_aside, monkeypatch):
    """Kept aside, it places the response once the gap fills; beyond the bound on what is kept aside,
    the rest of that handshake is blanked whole."""
    if not keep_aside:
        monkeypatch.setattr(blank_sasl, "MAX_AHEAD_BYTES", 0)
    segments = opening("n" * 3000, sizes=500)
    start_ok = [i for i, seg in enumerate(segments) if seg.payload and seg.sport != 5672][1:8]
    order = list(range(len(segments)))
    order[start_ok[1]], order[start_ok[5]] = order[start_ok[5]], order[start_ok[1]]  # one comes early
    before, after, _ = blanked(segments, order)
    assert PASSWORD.encode() not in b"".join(p[54:] for p in after)
    early = order.index(start_ok[5])
    assert after[early][54:] == bytes(len(before[early]) - 54)


def test_a_stream_whose_syn_was_not_captured_is_placed_by_its_protocol_header():
    before, after, _ = blanked(opening(syn=False))
    assert PASSWORD.encode() in b"".join(before) and PASSWORD.encode() not in b"".join(after)


def test_other_protocols_pass_untouched():
    conversation = Conversation()
    segments = conversation.open() + conversation.send(0, b"\x16\x03\x01" + PASSWORD.encode() * 3)
    before, after, blanker = blanked(segments)
    assert after == before and blanker.blanked == 0


# -- the agent, a real login ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def marker_password():
    return broker.user_with_fresh_password(USER, "marker-")


def login_and_publish(port: int, password: str) -> None:
    connection = pika.BlockingConnection(pika.ConnectionParameters(
        host=broker.HOST, port=port, credentials=pika.PlainCredentials(USER, password),
        client_properties={"connection_name": "pcap-out-" + "x" * 3000}))  # RabbitMQ takes 4 KB before tune
    channel = connection.channel()
    queue = channel.queue_declare("", exclusive=True).method.queue
    channel.confirm_delivery()
    for n in range(20):
        channel.basic_publish("", queue, b"body %d" % n)
    connection.close()


def run_agent(tmp_path, password: str, *extra: str) -> tuple[str, str, int]:
    """(the agent's pcapng, dumpcap's, the relay port both recorded)."""
    out = tmp_path / "pcap"
    umask = os.umask(0)  # the agent must not depend on a careful umask
    try:
        with AgentProcess(str(tmp_path / "lake"), agent_id="pcap", relayed=True,
                          extra=("--pcap-out", str(out), *extra)) as agent:
            with PortRecording(tmp_path / "dumpcap.pcapng", agent.broker_port) as recording:
                login_and_publish(agent.broker_port, password)
            recording.stop()
            agent.stop()
    finally:
        os.umask(umask)
    files = glob.glob(str(out / "*.pcapng"))
    assert len(files) == 1
    return files[0], str(recording.path), agent.broker_port


def test_pcap_out_files_hold_no_password_are_the_owners_only_and_decode_like_dumpcaps(tmp_path, marker_password):
    written, reference, port = run_agent(tmp_path, marker_password)
    assert stat.S_IMODE(os.stat(written).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(os.path.dirname(written)).st_mode) == 0o700
    marker = marker_password.encode()
    with open(reference, "rb") as f:
        assert marker in f.read()  # the wire did carry it
    with open(written, "rb") as f:
        assert marker not in f.read()
    ours, theirs = frames_by_method(written, (port,)), frames_by_method(reference, (port,))
    assert ours == theirs and ours["connection.start-ok"] == 1 and ours["basic.publish"] == 20
    # tshark still reads the start-ok's fields around the blanked response
    start_ok = "amqp.method.class == 10 && amqp.method.method == 11"
    fields = subprocess.run([tshark_path(), "-r", written, "-d", f"tcp.port=={port},amqp", "-Y", start_ok, "-T", "fields",
                             "-e", "amqp.method.arguments.mechanism", "-e", "amqp.method.arguments.response"],
                            capture_output=True, text=True, check=True).stdout.split("\t")
    response = bytes.fromhex(fields[1].strip().replace(":", ""))
    assert fields[0] == "PLAIN" and response == f"\0{USER}\0".encode() + bytes(len(marker))


def test_pcap_keep_credentials_writes_the_response_as_captured(tmp_path, marker_password):
    written, _, _ = run_agent(tmp_path, marker_password, "--pcap-keep-credentials")
    with open(written, "rb") as f:
        assert marker_password.encode() in f.read()
    assert stat.S_IMODE(os.stat(written).st_mode) == 0o600
