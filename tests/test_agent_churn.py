"""The real agent under connection churn of issue 62's shape (tests/churn.py), beside dumpcap: it runs
without error, files every publish each client sent exactly once under that client's connection (the
clients' own counts, and tshark's reading of dumpcap's file), and leaves a lake `ackscope analyze`
reads. Before the fix the agent misfiled publishes within a minute of such traffic (a duplicate
(connection_id, seq), after which analyze exits 5) and crashed within two."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter

import pytest

from tests.agent_support import AgentProcess, lake_connections, lake_frames
from tests.churn import Churn
from tests.lab.recording import start_dumpcap, stop_dumpcap
from tests.tshark import frames_by_client_port

pytestmark = pytest.mark.rabbitmq

# The agent runs with a linger of LINGER_S (tests/agent_linger.py) instead of its 30 s, and the
# traffic lasts TRAFFIC_S, past it six times over: connections are forgotten while others' rows wait.
LINGER_S = 5.0
TRAFFIC_S = 30.0


def test_under_churn_every_publish_is_filed_once_under_its_connection(tmp_path):
    lake_dir, capture = str(tmp_path / "lake"), str(tmp_path / "churn.pcapng")
    with AgentProcess(lake_dir, agent_id="churn", relayed=True, flush_interval=2.0,
                      entry=("tests.agent_linger", str(LINGER_S))) as agent:
        recorder = start_dumpcap("-f", f"tcp port {agent.broker_port}", "-B", "64", "-w", capture)
        try:
            churn = Churn(agent.broker_port, f"churn{os.getpid()}").start()
            time.sleep(TRAFFIC_S)
            churn.stop()
            assert agent.process.poll() is None, agent.exited(10)[1]
            assert agent.answer("/readyz")[0] == 200
        finally:
            stop_dumpcap(recorder)
        report = agent.stop()
    assert churn.errors == []
    assert churn.opened >= 0.8 * 5 * TRAFFIC_S and churn.resets >= 2  # the shape asked for, on a busy machine
    assert report["error_count"] == 0 and report["kernel_drops"] == 0 and report["rows_dropped"] == {}

    connections = lake_connections(lake_dir).to_pylist()
    named = {c["connection_id"]: c for c in connections}
    assert len(named) == len(connections) == len(churn.sent)  # one row per connection
    assert {c["connection_name"] for c in connections} == set(churn.sent)
    frames = lake_frames(lake_dir, ["connection_id", "seq", "method", "client_port"]).to_pylist()
    keys = [(r["connection_id"], r["seq"]) for r in frames]
    assert len(keys) == len(set(keys)), "a (connection_id, seq) filed twice"
    filed = Counter()
    for row in frames:
        connection = named[row["connection_id"]]  # no row of a connection the table does not know
        assert row["client_port"] == connection["client_port"]
        if row["method"] == "basic.publish":
            filed[connection["connection_name"]] += 1
    assert filed == churn.sent  # every publish, once, under the connection that sent it
    assert {c["connection_name"]: c["client_port"] for c in connections} == churn.client_ports
    ended = Counter(c["ended_by"] for c in connections)
    assert ended["tcp.rst"] >= churn.resets and ended["decoder-error"] == 0

    seen = frames_by_client_port(capture, agent.broker_port)
    by_port = Counter()
    for name, port in churn.client_ports.items():
        by_port[port] += churn.sent[name]
    assert {port: counts["basic.publish"] for port, counts in seen.items() if counts["basic.publish"]} == \
        dict(by_port)

    analysis = subprocess.run([sys.executable, "-m", "analyzer.cli", "analyze", "--lake", lake_dir, "--json"],
                              capture_output=True, text=True, timeout=600)
    assert analysis.returncode == 0, analysis.stderr[-3000:]
    assert json.loads(analysis.stdout.splitlines()[-1])
