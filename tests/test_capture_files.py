"""Capture files: every supported link layer, IPv4 and IPv6, pcap and pcapng, and damaged files."""

import os

import pytest
from pamqp import commands

from analyzer.capture_file import CaptureFileError, read_packets
from analyzer.ingest import decode

from .wire import Conversation, content, handshake, method, write_pcap

EXPECTED = {"connection.start": 1, "connection.start-ok": 1, "connection.tune": 1, "connection.tune-ok": 1,
            "connection.open": 1, "connection.open-ok": 1, "channel.open": 1, "channel.open-ok": 1,
            "basic.publish": 1, "content.header": 1, "content.body": 1, "basic.ack": 1}


def traffic(ipv6: bool = False):
    if ipv6:
        loopback = b"\x00" * 15 + b"\x01"
        conv = Conversation(client=(loopback, 40001), broker=(loopback, 5672))
    else:
        conv = Conversation()
    pairs = handshake() + [(0, content(commands.Basic.Publish(routing_key="q"), b"body")),
                           (1, method(commands.Basic.Ack(delivery_tag=1)))]
    return conv.open() + conv.script(pairs, sizes=60) + [conv.fin(0), conv.fin(1), conv.ack(0)]


@pytest.mark.parametrize("link", ["ethernet", "vlan", "qinq", "sll", "sll2", "null", "raw"])
@pytest.mark.parametrize("ipv6", [False, True], ids=["ipv4", "ipv6"])
def test_link_layers_and_ip_versions(tmp_path, link, ipv6):
    path = str(tmp_path / f"{link}.pcap")
    write_pcap(path, traffic(ipv6), link=link)
    report, connections = decode(path, lambda rows: None)
    assert report.errors == []
    assert dict(report.frames_by_method) == EXPECTED
    assert connections[0]["ip_version"] == (6 if ipv6 else 4)
    assert connections[0]["ended_by"] == "tcp.fin"


def test_pcapng(tmp_path):
    path = str(tmp_path / "t.pcapng")
    write_pcap(path, traffic(), pcapng=True)
    report, _ = decode(path, lambda rows: None)
    assert report.errors == [] and dict(report.frames_by_method) == EXPECTED
    stamps = [ts for _, ts, _, _ in read_packets(path)]
    assert stamps[0] == 1_700_000_000_000_000_000 and stamps == sorted(stamps)


@pytest.mark.parametrize("pcapng", [False, True], ids=["pcap", "pcapng"])
def test_truncated_file_keeps_every_complete_packet(tmp_path, pcapng):
    path = str(tmp_path / ("t.pcapng" if pcapng else "t.pcap"))
    write_pcap(path, traffic(), pcapng=pcapng)
    whole = list(read_packets(path))
    with open(path, "rb") as f:
        data = f.read()
    with open(path, "wb") as f:
        f.write(data[:-30])  # cut inside the last packet
    with pytest.raises(CaptureFileError) as failure:
        kept = []
        for packet in read_packets(path):
            kept.append(packet)
    assert failure.value.damaged
    assert path in str(failure.value) and f"packet {len(whole)}" in str(failure.value)
    assert kept == whole[:-1]


def test_garbage_after_the_header_is_reported_as_corrupt(tmp_path):
    path = str(tmp_path / "t.pcap")
    write_pcap(path, traffic())
    with open(path, "ab") as f:
        f.write(b"\xff" * 64)  # a record header claiming a 4 GiB packet
    report, _ = decode(path, lambda rows: None)
    assert report.damaged and dict(report.frames_by_method) == EXPECTED
    assert "impossible" in report.errors[0] or "truncated" in report.errors[0]


@pytest.mark.parametrize("content_bytes", [b"", b"hello world, not a capture", b"\xa1\xb2\xc3"])
def test_not_a_capture_is_unreadable(tmp_path, content_bytes):
    path = str(tmp_path / "x.pcap")
    with open(path, "wb") as f:
        f.write(content_bytes)
    report, _ = decode(path, lambda rows: None)
    assert report.unreadable and not report.damaged and report.packets == 0
    assert path in report.errors[0]


def test_missing_file_is_unreadable(tmp_path):
    report, _ = decode(str(tmp_path / "nope.pcap"), lambda rows: None)
    assert report.unreadable and "cannot open" in report.errors[0]
    assert os.path.basename("nope.pcap") in report.errors[0]
