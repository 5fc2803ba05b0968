"""Running the real agent (`ackscope capture`) as a process in tests, and reading what it exposes."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections import Counter

from prometheus_client.parser import text_string_to_metric_families

from analyzer import lake, schema

STARTUP_TIMEOUT = 60.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class AgentProcess:
    """`ackscope capture --iface lo` with /metrics on a free loopback port. Use as a context manager;
    `stop()` sends SIGTERM and returns the --json report."""

    def __init__(self, lake_dir: str, *, agent_id: str = "test", iface: str = "lo", flush_interval: float = 1.0,
                 extra: tuple = ()):
        self.lake_dir, self.agent_id = lake_dir, agent_id
        self.port = free_port()
        self.command = [sys.executable, "-m", "analyzer.cli", "capture", "--iface", iface, "--port", "5672",
                        "--lake", lake_dir, "--metrics-addr", f"127.0.0.1:{self.port}", "--agent-id", agent_id,
                        "--flush-interval", str(flush_interval), "--json", *extra]
        self.process: subprocess.Popen | None = None
        self.report: dict | None = None

    def start(self) -> "AgentProcess":
        self.process = subprocess.Popen(self.command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the agent exited at start ({self.process.returncode}): {self.process.stderr.read()}")
            try:
                self.get("/healthz")  # served only once the capture socket is open
                return self
            except (urllib.error.URLError, ConnectionError):
                time.sleep(0.1)
        self.process.kill()
        raise RuntimeError("the agent did not start serving within a minute")

    def get(self, path: str) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=10) as reply:
            return reply.read().decode()

    def status(self, path: str) -> int:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=10) as reply:
                return reply.status
        except urllib.error.HTTPError as error:
            return error.code

    def samples(self) -> list:
        """Every sample of /metrics: (name, labels, value)."""
        out = []
        for family in text_string_to_metric_families(self.get("/metrics")):
            for sample in family.samples:
                out.append((sample.name, sample.labels, sample.value))
        return out

    def value(self, name: str, **labels) -> float:
        """Sum of the samples of `name` whose labels include `labels` (0 if none)."""
        return sum(v for n, l, v in self.samples() if n == name and all(l.get(k) == x for k, x in labels.items()))

    def stop(self, sig=signal.SIGTERM, timeout: float = 120.0) -> dict:
        self.process.send_signal(sig)
        out, err = self.process.communicate(timeout=timeout)
        self.stderr = err
        if sig == signal.SIGKILL:
            return {}
        assert self.process.returncode == 0, f"agent exit {self.process.returncode}: {err}"
        self.report = json.loads(out)
        return self.report

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()


def wait_for(predicate, timeout: float = 30.0, every: float = 0.2):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(every)


def lake_frames(lake_dir: str, columns=None):
    return lake.read_table(lake_dir, "frames", schema.FRAMES, columns)


def lake_connections(lake_dir: str):
    return lake.read_table(lake_dir, "connections", schema.CONNECTIONS)


def methods_of_ports(lake_dir: str, client_ports: set[int]) -> Counter:
    """Frame rows by method for the connections from these client ports (heartbeats included)."""
    frames = lake_frames(lake_dir, ["client_port", "method"])
    counts: Counter = Counter()
    for port, method in zip(frames["client_port"].to_pylist(), frames["method"].to_pylist()):
        if port in client_ports:
            counts[method] += 1
    return counts


def env_root() -> str:
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def publish_confirmed(name: str, count: int, *, queue: str | None = None, close: bool = True):
    """A pika publisher named `name` sends `count` messages in confirm mode to a fresh exclusive
    queue (or `queue`), each confirmed; returns the open connection when close is False."""
    import pika

    from tests.lab.clients import pika_connection
    connection = pika_connection(name)
    channel = connection.channel()
    channel.confirm_delivery()
    target = queue or channel.queue_declare("", exclusive=True).method.queue
    for number in range(count):
        channel.basic_publish("", target, b"message %d" % number, pika.BasicProperties(message_id=f"{name}-{number}"))
    if close:
        connection.close()
        return None
    return connection


def rows_of(lake_dir: str, connection_name: str, agent_id: str | None = None) -> list[dict]:
    """Frame rows of the connections named `connection_name` (by the connections table)."""
    connections = lake_connections(lake_dir)
    if connections is None:
        return []
    # Agents watching the same traffic name a connection alike (addresses and first packet time):
    # a connection is (connection_id, agent_id).
    keys = {(c["connection_id"], c["agent_id"]) for c in connections.to_pylist()
            if c["connection_name"] == connection_name and (agent_id is None or c["agent_id"] == agent_id)}
    frames = lake_frames(lake_dir, ["connection_id", "agent_id", "seq", "method"])
    if frames is None:
        return []
    return [r for r in frames.to_pylist() if (r["connection_id"], r["agent_id"]) in keys]
