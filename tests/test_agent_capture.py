"""The agent's capture side on loopback against the real RabbitMQ: bad input on the broker port,
`--iface any` (Linux cooked v2) against `lo`, the rotating pcapng output, compaction while
capturing, the metric catalog and the series cap."""

from __future__ import annotations

import os
import struct
import time
from collections import Counter

import pytest
from prometheus_client.parser import text_string_to_metric_families

from analyzer import lake, metric_names, schema
from analyzer.ingest import ingest_file
from tests.agent_support import TLS_CLIENT_HELLO, AgentProcess, publish_confirmed, rows_of, send_and_close, wait_for

pytestmark = pytest.mark.rabbitmq


def test_garbage_a_2gib_frame_claim_amqp_1_0_and_tls_are_counted_and_skipped(tmp_path):
    lake_dir = str(tmp_path / "lake")
    with AgentProcess(lake_dir, agent_id="bad-input", flush_interval=0.3, relayed=True) as agent:
        port = agent.broker_port
        send_and_close(b"AMQP\x00\x01\x00\x00", port)                 # AMQP 1.0
        send_and_close(TLS_CLIENT_HELLO, port)                         # TLS on the plain port
        send_and_close(b"\x00\xff\x13garbage" * 100, port)             # not a protocol at all
        send_and_close(b"AMQP\x00\x00\x09\x01" + struct.pack("!BHI", 1, 0, 0x80000000) + b"\x00" * 64, port)  # 2 GiB
        publish_confirmed("agent-test-after-garbage", 10, port=port)  # decoding goes on for everyone else
        # A ClientHello is TLS: counted as TLS not decrypted (no key log given), not as unsupported.
        assert wait_for(lambda: agent.value("ackscope_agent_tls_not_decrypted_total") == 1)
        assert agent.value("ackscope_agent_tls_connections_total") == 1
        assert agent.value("ackscope_agent_unsupported_flows_total", protocol="amqp-1.0") == 1
        assert agent.value("ackscope_agent_decode_errors_total") >= 1  # the 2 GiB frame header
        assert agent.status("/healthz") == 200
        report = agent.stop()
    assert report["tls_not_decrypted"] == 1 and "tls" not in report["unsupported_protocols"]
    assert report["unsupported_flows"] >= 2
    assert any("frame" in error for error in report["errors"])
    methods = Counter(r["method"] for r in rows_of(lake_dir, "agent-test-after-garbage"))
    assert methods["basic.publish"] == 10 and methods["basic.ack"] == 10


def test_iface_any_sees_loopback_once_like_lo_and_the_pcapng_output_ingests_to_the_same_rows(tmp_path):
    pcap_dir, rotated_dir = tmp_path / "pcap", tmp_path / "rotated"
    on_lo = AgentProcess(str(tmp_path / "lo"), agent_id="on-lo", extra=("--pcap-out", str(pcap_dir)))
    on_any = AgentProcess(str(tmp_path / "any"), agent_id="on-any", iface="any")
    rotating = AgentProcess(str(tmp_path / "rot"), agent_id="rot",
                            extra=("--pcap-out", str(rotated_dir), "--rotate-size", "0.004", "--rotate-keep", "2"))
    agents = [on_lo, on_any, rotating]
    try:
        for agent in agents:
            agent.start()
        publish_confirmed("agent-test-any", 60)
        time.sleep(1.0)  # the TCP teardown's last packets (a late RST) reach every agent before the first stops
        reports = [agent.stop() for agent in agents]
    finally:
        for agent in agents:
            agent.__exit__()

    def methods(lake_dir):
        return Counter(r["method"] for r in rows_of(lake_dir, "agent-test-any"))

    from_lo, from_any = methods(str(tmp_path / "lo")), methods(str(tmp_path / "any"))
    assert from_lo["basic.publish"] == 60 and from_lo["basic.ack"] == 60
    assert from_any == from_lo  # each loopback packet once, through the cooked (SLL2) framing
    (pcap_file,) = reports[0]["pcap_files"]
    reingested = str(tmp_path / "reingested")
    assert not ingest_file(pcap_file, reingested).errors
    assert methods(reingested) == from_lo
    assert sorted(os.listdir(rotated_dir)) == sorted(os.path.basename(p) for p in reports[2]["pcap_files"])
    assert len(os.listdir(rotated_dir)) == 2  # rotated many times, the newest two kept
    for path in reports[2]["pcap_files"]:
        assert not ingest_file(path, str(tmp_path / "rot-check")).unreadable


def test_compaction_checkpoint_and_vacuum_run_while_capturing_and_the_tables_still_read_whole(tmp_path):
    lake_dir = str(tmp_path / "lake")
    with AgentProcess(lake_dir, agent_id="compact", flush_interval=0.2,
                      extra=("--compact-interval", "1", "--compact-min-age", "0", "--retention-hours", "1")) as agent:
        for burst in range(4):
            publish_confirmed(f"agent-test-compact-{burst}", 15)
            time.sleep(0.5)
        assert wait_for(lambda: any(h.get("ackscope.operation") == "compaction"
                                    for h in lake.open_table(lake_dir, "frames").history()), timeout=30)
        publish_confirmed("agent-test-compact-after", 15)  # capture and flushes go on after compactions
        agent.stop()
    log = os.listdir(os.path.join(lake_dir, "frames", "_delta_log"))
    assert any(name.endswith(".checkpoint.parquet") for name in log)
    for name in [f"agent-test-compact-{b}" for b in range(4)] + ["agent-test-compact-after"]:
        methods = Counter(r["method"] for r in rows_of(lake_dir, name))
        assert methods["basic.publish"] == 15 and methods["basic.ack"] == 15, name


def test_metrics_follow_the_catalog_and_the_series_cap_folds_into_other(tmp_path):
    with AgentProcess(str(tmp_path / "lake"), agent_id="catalog", extra=("--max-applications", "1")) as agent:
        first = publish_confirmed("agent-test-cap-first", 3, close=False)
        channel = first.channel()
        queue = channel.queue_declare("", exclusive=True).method.queue
        channel.basic_consume(queue, lambda *a: None, auto_ack=False)
        second = publish_confirmed("agent-test-cap-second", 3, queue=queue, close=False)
        first.process_data_events(time_limit=0.5)
        assert wait_for(lambda: agent.value("ackscope_unacked_deliveries") >= 3)
        text = agent.get("/metrics")
        first.close()
        second.close()
        agent.stop()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    for name, family in families.items():
        metric = metric_names.BY_NAME.get(name) or metric_names.BY_NAME.get(name + "_total")
        assert metric is not None and metric.source == metric_names.AGENT, name
        assert family.type == metric.type, name
        for sample in family.samples:
            assert set(sample.labels) - {"le"} == set(metric.labels), (name, sample.labels)
    applications = {s.labels.get("application") for f in families.values() for s in f.samples}
    assert "other" in applications and "agent-test-cap-second" not in applications
    folded = families["ackscope_series_folded"].samples
    assert sum(s.value for s in folded if s.name == "ackscope_series_folded_total") >= 1


def test_full_size_loopback_segments_are_captured_whole(tmp_path):
    """Loopback carries 65,535-byte IP packets (plus 14 bytes of Ethernet header): large messages
    fill them. A filter compiled with a 65,535-byte snap length would cut each one short."""
    import pika

    from tests.lab.clients import pika_connection
    lake_dir = str(tmp_path / "lake")
    with AgentProcess(lake_dir, agent_id="big", relayed=True) as agent:  # its gaps are all this test's
        connection = pika_connection("agent-test-big-messages", port=agent.broker_port)
        channel = connection.channel()
        channel.confirm_delivery()
        queue = channel.queue_declare("", exclusive=True).method.queue
        for number in range(5):
            channel.basic_publish("", queue, os.urandom(300_000), pika.BasicProperties(message_id=f"big-{number}"))
        connection.close()
        time.sleep(0.5)
        report = agent.stop()
    assert report["gaps"] == 0
    frames = lake.read_table(lake_dir, "frames", schema.FRAMES,
                             ["method", "body_size", "content_complete", "message_id"]).to_pylist()
    big = [f for f in frames if f["method"] == "basic.publish" and (f["message_id"] or "").startswith("big-")]
    assert [(f["body_size"], f["content_complete"]) for f in big] == [(300_000, True)] * 5


def test_the_pcapng_output_rotates_inside_one_batch_of_packets(tmp_path):
    """How packets fall into read batches depends on the load: one batch of many packets must still
    rotate at the size, every file a readable capture no larger than the size and one packet."""
    from analyzer.agent.pcap_out import RotatingPcapng
    from analyzer.packets import LINKTYPE_ETHERNET
    ethernet_ipv4 = bytes(12) + b"\x08\x00"
    packets = [(10**18 + n, ethernet_ipv4 + bytes([n % 256]) * 500) for n in range(40)]
    output = RotatingPcapng(str(tmp_path), LINKTYPE_ETHERNET, "lo", rotate_bytes=4000, keep=3)
    output.write(packets)
    output.close()
    assert sorted(os.listdir(tmp_path)) == sorted(os.path.basename(p) for p in output.files)
    assert len(output.files) == 3 and output.files[-1].endswith(f"{output._serial:05d}.pcapng")
    assert output._serial >= 5  # 40 packets of 548 bytes in files of 4,000: rotated every 7 packets
    for path in output.files:
        assert os.path.getsize(path) <= 4000 + 32 + 516
        assert not ingest_file(path, str(tmp_path / "check")).unreadable


@pytest.mark.parametrize("command", ["capture", "ingest"])
def test_capture_chooses_its_allocators_before_the_parser_loads_pyarrow_and_delta_rs(monkeypatch, command):
    """Each library reads its allocator's setting once, as it loads; the parser once loaded both
    (analyzer/push.py), and run_capture set them after it: Arrow's C++ kept mimalloc. They are set
    first, whatever the parser imports."""
    from analyzer import cli
    for name in ("ARROW_DEFAULT_MEMORY_POOL", "_RJEM_MALLOC_CONF"):
        monkeypatch.setenv(name, "placeholder")  # restored, absent, after the test
        monkeypatch.delenv(name)
    seen = {}

    def parser_seeing_the_environment():
        seen.update(os.environ)
        raise SystemExit(0)

    monkeypatch.setattr(cli, "build_parser", parser_seeing_the_environment)
    with pytest.raises(SystemExit):
        cli.main([command, "--lake", "unused"])
    chosen = {name: seen.get(name) for name in ("ARROW_DEFAULT_MEMORY_POOL", "_RJEM_MALLOC_CONF")}
    if command == "capture":
        assert chosen == {"ARROW_DEFAULT_MEMORY_POOL": "system", "_RJEM_MALLOC_CONF": "dirty_decay_ms:0,muzzy_decay_ms:0"}
    else:  # the agent's choices are the agent's
        assert chosen == {"ARROW_DEFAULT_MEMORY_POOL": None, "_RJEM_MALLOC_CONF": None}
