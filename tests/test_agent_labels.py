"""Bounded labels against the running agent and the real RabbitMQ: a flood of distinct connection
names, of connection.opens for vhosts the broker refuses, and of 100 KB names sent blindly (a
hostile client pipelines its whole opening without waiting for the broker), through the agent's own
relay. /metrics stays small, the agent's memory too, and only accepted connections take a slot."""

from __future__ import annotations

import secrets
import socket
import struct
import subprocess
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest
from pamqp import commands
from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics_families
from prometheus_client.parser import text_string_to_metric_families

from analyzer import labels
from tests.agent_support import AgentProcess, publish_confirmed, wait_for
from tests.amqp_bytes import marshal
from tests.lab import broker

pytestmark = pytest.mark.rabbitmq

TOKEN = secrets.token_hex(3)
NAMES, REFUSED_VHOSTS, HUGE_NAMES, LONG_NAMES = 3000, 1000, 100, 20
PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
START_OK, TUNE, OPEN_OK, CLOSE = (10, 11), (10, 30), (10, 41), (10, 50)


def read_method(sock: socket.socket) -> tuple[int, int] | None:
    """(class, method) of the next frame from the broker, None when it hung up."""
    head = b""
    while len(head) < 7:
        chunk = sock.recv(7 - len(head))
        if not chunk:
            return None
        head += chunk
    _, _, size = struct.unpack("!BHI", head)
    rest = b""
    while len(rest) < size + 1:
        chunk = sock.recv(size + 1 - len(rest))
        if not chunk:
            return None
        rest += chunk
    return struct.unpack_from("!HH", rest)


def opening(name: str, vhost: str) -> tuple[bytes, bytes]:
    start_ok = marshal(commands.Connection.StartOk(
        client_properties={"product": "flood", "connection_name": name}, mechanism="PLAIN",
        response=f"\x00{broker.USER}\x00{broker.PASSWORD}"), 0)
    return start_ok, (marshal(commands.Connection.TuneOk(channel_max=16, frame_max=131072, heartbeat=0), 0)
                      + marshal(commands.Connection.Open(virtual_host=vhost), 0))


def connect(port: int, name: str, vhost: str = "/") -> bool:
    """A connection opened as a client library does, one step at a time; True if the broker accepted it."""
    start_ok, tune_ok_and_open = opening(name, vhost)
    with socket.create_connection((broker.HOST, port), timeout=20) as sock:
        sock.sendall(PROTOCOL_HEADER)
        read_method(sock)  # connection.start
        sock.sendall(start_ok)
        if read_method(sock) != TUNE:
            return False
        sock.sendall(tune_ok_and_open)
        accepted = read_method(sock) == OPEN_OK
        if accepted:
            sock.sendall(marshal(commands.Connection.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0), 0))
            read_method(sock)
        return accepted


def blind(port: int, name: str, vhost: str = "/") -> None:
    """The whole opening sent at once, whatever the broker says (it resets a 100 KB start-ok)."""
    start_ok, tune_ok_and_open = opening(name, vhost)
    with socket.create_connection((broker.HOST, port), timeout=20) as sock:
        sock.sendall(PROTOCOL_HEADER + start_ok + tune_ok_and_open)
        try:
            while read_method(sock) is not None:
                pass
        except OSError:
            pass


def peak_rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmHWM:")) / 1024


def test_a_flood_of_names_refused_vhosts_and_100_kb_names_keeps_metrics_and_memory_bounded(tmp_path):
    refused = [f"refused-{TOKEN}-{n}" for n in range(REFUSED_VHOSTS)]
    with AgentProcess(str(tmp_path / "lake"), agent_id="labels", relayed=True, flush_interval=5.0) as agent:
        port = agent.broker_port
        with ThreadPoolExecutor(8) as pool:
            accepted = list(pool.map(lambda n: connect(port, f"flood-{TOKEN}-{n}"), range(NAMES)))
            accepted += pool.map(lambda n: connect(port, f"long-{TOKEN}-{n}-" + "l" * 2500), range(LONG_NAMES))
            refusals = list(pool.map(lambda v: connect(port, f"knock-{v}", vhost=v), refused))
            list(pool.map(lambda n: blind(port, f"huge-{TOKEN}-{n}-" + "h" * 100_000, f"huge-vhost-{n}"),
                          range(HUGE_NAMES)))
        assert all(accepted) and not any(refusals)
        opens = NAMES + LONG_NAMES + REFUSED_VHOSTS + HUGE_NAMES
        assert wait_for(lambda: agent.value("ackscope_agent_frames_total", method="connection.open") >= opens, 60)
        assert wait_for(lambda: agent.value("ackscope_agent_frames_total", method="connection.open-ok")
                        >= NAMES + LONG_NAMES, 60)
        text = agent.get("/metrics")
        rss = peak_rss_mb(agent.process.pid)
        agent.stop()
    size = len(text.encode())
    print(f"/metrics {size / 1024:.0f} KiB, agent peak RSS {rss:.0f} MB")
    assert size < 1 << 20, size
    assert rss < 300, rss
    families = {f.name: f for f in text_string_to_metric_families(text)}
    values = {(k, v) for f in families.values() for s in f.samples for k, v in s.labels.items()}
    vhosts = {v for k, v in values if k == "vhost"}
    applications = {v for k, v in values if k == "application"}
    assert vhosts == {"/"}  # refused vhosts and blindly opened ones took no slot
    assert not any(a.startswith(("knock-", "huge-")) for a in applications)
    assert "other" in applications and len(applications - {"other"}) == labels.DEFAULT_MAX_APPLICATIONS
    assert max(len(v) for _, v in values) <= labels.MAX_LABEL_LENGTH + len("...[+100,000 chars]")

    def sample(name: str, label: str) -> float:
        return next(s.value for s in families[name].samples if s.labels.get("label") == label
                    and s.name.endswith("_total"))
    assert sample("ackscope_agent_label_folds", "application") >= NAMES + LONG_NAMES - labels.DEFAULT_MAX_APPLICATIONS
    assert sample("ackscope_agent_label_folds", "vhost") == 0


OPENMETRICS = "application/openmetrics-text; version=1.0.0; charset=utf-8"
HOSTILE_NAME = f"hostile-{TOKEN}\x1b]0;pwn\x07\n\"quoted\" back\\slash \u202e\x00end"


def promtool_check_metrics(text: str) -> subprocess.CompletedProcess:
    return subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True)


def test_promtool_passes_the_live_exposition_with_hostile_labels_in_both_formats(tmp_path):
    with AgentProcess(str(tmp_path / "lake"), agent_id="promtool", relayed=True) as agent:
        publish_confirmed(HOSTILE_NAME, 3, port=agent.broker_port)
        assert wait_for(lambda: agent.value("ackscope_publish_confirm_seconds_count") >= 3)
        text = agent.get("/metrics")
        request = urllib.request.Request(f"http://127.0.0.1:{agent.port}/metrics", headers={"Accept": OPENMETRICS})
        with urllib.request.urlopen(request, timeout=10) as reply:
            assert reply.headers["Content-Type"].startswith("application/openmetrics-text")
            openmetrics = reply.read().decode()
        agent.stop()
    assert HOSTILE_NAME.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"') in text
    checked = promtool_check_metrics(text)
    assert checked.returncode == 0 and checked.stdout + checked.stderr == "", checked.stdout + checked.stderr

    # promtool reads the Prometheus text format: the OpenMetrics document must parse in it (a HELP
    # with an escape only OpenMetrics knows failed here), and its lint may only say what differs by
    # design: an OpenMetrics counter's family (and so its HELP) is named without `_total`.
    checked = promtool_check_metrics(openmetrics)
    families = list(openmetrics_families(openmetrics))  # and OpenMetrics' own parser reads it whole
    counters = {f.name for f in families if f.type == "counter"}
    problems = [line for line in (checked.stdout + checked.stderr).splitlines() if line.strip()]
    assert checked.returncode in (0, 3), problems
    assert problems and all(line.endswith(" no help text") and line.split()[0].removesuffix("_total") in counters
                            for line in problems), problems
    assert any(s.labels.get("application") == HOSTILE_NAME for f in families for s in f.samples)
