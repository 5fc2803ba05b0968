"""The live agent over amqps: `ackscope capture --tls-keylog` on lo beside dumpcap, the clients
writing their key log as they connect (the agent reads each key after the connection's first
encrypted records and holds those until it comes), a connection whose key never comes, the
gauges moving as in plaintext, and a key log others may read refused."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections import Counter

import pytest

from tests import tls_lab
from tests.agent_support import AgentProcess, lake_connections, lake_frames, wait_for
from tests.tshark import frames_by_method

pytestmark = [pytest.mark.rabbitmq, pytest.mark.tshark]
MARKER = "5ec2e75ec2e7" * 8  # 48 bytes in hex, as a TLS 1.2 master secret


def private_file(path) -> str:
    path.touch(mode=0o600)
    os.chmod(path, 0o600)  # the application appends to it; the agent refuses anything looser
    return str(path)


def test_live_frames_over_tls_equal_tsharks_and_the_gauges_move(tmp_path):
    keylog = private_file(tmp_path / "keys.log")
    with open(keylog, "a") as f:  # secret-shaped markers, one in a corrupted line: never to be seen again
        f.write(f"CLIENT_RANDOM {'00' * 32} {MARKER}\nCLIENT_RANDOM broken {MARKER}\n")
    other = tmp_path / "other-app.log"
    lake_dir = str(tmp_path / "lake")
    run = uuid.uuid4().hex[:8]
    agent = AgentProcess(lake_dir, agent_id="tls", flush_interval=0.5, extra=("--tls-keylog", keylog))
    agent.command[agent.command.index("--port") + 1] = str(tls_lab.TLS_PORT)  # the broker's TLS port only
    with tls_lab.recorded(tmp_path / "oracle.pcapng"), agent:
        tls_lab.clean_traffic(f"live-tls13-{run}", tls_lab.client_context("1.3", tmp_path / "keys.log"), f"live13-{run}")
        tls_lab.requeue_loop(f"live-tls12-{run}", tls_lab.client_context("1.2", tmp_path / "keys.log"), f"live12-{run}")
        tls_lab.aio_clean_traffic(f"live-aio-{run}", tls_lab.client_context("1.3", tmp_path / "keys.log"), f"liveaio-{run}")
        tls_lab.clean_traffic(f"live-nokey-{run}", tls_lab.client_context("1.3", other), f"livenokey-{run}")
        # A client whose key lines reach the agent's key log only seconds after its connection ended:
        # its records wait for them (bounded: 10 s), and are decrypted when they come.
        late = tmp_path / "late.log"
        tls_lab.clean_traffic(f"live-late-{run}", tls_lab.client_context("1.2", late), f"livelate-{run}")
        time.sleep(2.0)
        assert agent.value("ackscope_agent_frames_total", method="basic.publish") == 20 + 1 + 20  # not the late ones yet
        with open(keylog, "ab") as f:
            f.write(late.read_bytes())
        # A consumer holding deliveries unacked, connection open: the live gauge shows them.
        holder = tls_lab.pika_connection(f"live-holder-{run}", tls_lab.client_context("1.3", tmp_path / "keys.log"))
        channel = holder.channel()
        queue = channel.queue_declare(f"liveholder-{run}", arguments={"x-expires": 60_000}).method.queue
        for number in range(7):
            channel.basic_publish("", queue, b"held %d" % number)
        channel.basic_consume(queue, lambda *args: None)
        holder.process_data_events(time_limit=0.5)
        assert wait_for(lambda: agent.value("ackscope_unacked_deliveries", application=f"live-holder-{run}") == 7)
        holder.close()
        assert wait_for(lambda: agent.value("ackscope_unacked_deliveries", application=f"live-holder-{run}") == 0)
        assert wait_for(lambda: agent.value("ackscope_agent_tls_not_decrypted_total") == 1, timeout=30)
        report = agent.stop()
    oracle = frames_by_method(str(tmp_path / "oracle.pcapng"), tls_keylog=str(tmp_path / "keys.log"))
    assert oracle["basic.publish"] == 20 + 1 + 20 + 20 + 7 and oracle["basic.nack"] == 15
    assert report["frames_by_method"] == dict(sorted(oracle.items()))
    assert report["tls_connections"] == 6 and report["tls_not_decrypted"] == 1
    rows = {row["connection_name"]: row for row in lake_connections(lake_dir).to_pylist()}
    for case in ("tls13", "tls12", "aio", "holder", "late"):
        row = rows[f"live-{case}-{run}"]
        assert row["tls_decrypted"] and row["tls_version"] == ("TLSv1.2" if case in ("tls12", "late") else "TLSv1.3"), case
    hidden = [row for row in rows.values() if row["protocol"] == "tls"]
    assert len(hidden) == 1 and hidden[0]["tls_note"] == "no key for that client random"
    frames = Counter(lake_frames(lake_dir, ["method"])["method"].to_pylist())
    assert frames["basic.publish"] == oracle["basic.publish"]
    assert MARKER not in agent.stderr + json.dumps(report)
    for folder, _, files in os.walk(lake_dir):
        for file in files:
            data = open(os.path.join(folder, file), "rb").read()
            assert MARKER.encode() not in data and bytes.fromhex(MARKER) not in data, file


def test_a_key_log_others_may_read_is_refused_with_a_clear_message(tmp_path):
    keylog = tmp_path / "keys.log"
    keylog.write_text("")
    os.chmod(keylog, 0o644)
    result = subprocess.run([sys.executable, "-m", "analyzer.cli", "capture", "--iface", "lo", "--port", "5671",
                             "--lake", str(tmp_path / "lake"), "--tls-keylog", str(keylog)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert f"the TLS key log {keylog} is readable by others than its owner (mode 0644)" in result.stderr


def test_a_key_log_that_appears_later_is_followed_and_refused_while_others_may_read_it(tmp_path):
    from analyzer.agent.keylog_file import KeyLogFile
    path = tmp_path / "keys.log"
    follower = KeyLogFile(str(path))  # not written yet: accepted, read when it appears
    assert follower.poll() == 0
    line = f"CLIENT_RANDOM {'ab' * 32} {'cd' * 48}\n"
    path.write_text(line[:40])
    os.chmod(path, 0o600)
    assert follower.poll() == 0  # a line cut short waits for its end
    with open(path, "a") as f:
        f.write(line[40:])
    assert follower.poll() == 1 and follower.keylog.secrets(bytes.fromhex("ab" * 32))
    os.chmod(path, 0o640)
    with open(path, "a") as f:
        f.write(line.replace("ab", "ef"))
    assert follower.poll() == 0 and follower.refused == 1
    os.chmod(path, 0o600)
    assert follower.poll() == 1
    path.unlink()
    path.write_text(line.replace("ab", "12"))  # replaced (the application restarted): read from its start
    os.chmod(path, 0o600)
    assert follower.poll() == 1 and follower.keylog.secrets(bytes.fromhex("12" * 32))
