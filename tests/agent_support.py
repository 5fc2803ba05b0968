"""Running the real agent (`ackscope capture`) as a process in tests, and reading what it exposes."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import Counter

from prometheus_client.parser import text_string_to_metric_families

from analyzer import lake, schema
from tests.child_output import ChildOutput
from tests.lab.broker import HOST as BROKER_HOST, PORT as BROKER_PORT

STARTUP_TIMEOUT = 60.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class AgentProcess:
    """`ackscope capture --iface lo` with /metrics on a free loopback port. Use as a context manager;
    `stop()` sends SIGTERM and returns the --json report.

    `relayed`: the agent captures a BrokerRelay of its own, not the broker's port, so it sees only
    the connections made to `broker_port`: for tests that count what the agent saw in all (gaps,
    drops, unsupported flows) or bound its buffer below other tests' traffic. `entry`: the module run
    (and its leading arguments), for a test that starts the agent through a module of its own."""

    def __init__(self, lake_dir: str, *, agent_id: str = "test", iface: str = "lo", flush_interval: float = 1.0,
                 extra: tuple = (), run_as: tuple = (), relayed: bool = False, entry: tuple = ("analyzer.cli", "capture")):
        self.lake_dir, self.agent_id = lake_dir, agent_id
        self.port = free_port()
        self.relay = BrokerRelay() if relayed else None
        self.broker_port = self.relay.port if relayed else BROKER_PORT
        self.command = [*run_as, sys.executable, "-m", *entry, "--iface", iface,
                        "--port", str(self.broker_port),
                        "--lake", lake_dir, "--metrics-addr", f"127.0.0.1:{self.port}", "--agent-id", agent_id,
                        "--flush-interval", str(flush_interval), "--json", *extra]
        self.process: subprocess.Popen | None = None
        self.report: dict | None = None

    def start(self) -> "AgentProcess":
        if self.relay is not None:
            self.relay.start()
        self.process = subprocess.Popen(self.command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.output = ChildOutput(self.process)
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the agent exited at start ({self.process.returncode}): {self.exited(10)[1]}")
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
        return probe(self.port, path)[0]

    def answer(self, path: str) -> tuple[int, str]:
        return probe(self.port, path)

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

    def exited(self, timeout: float) -> tuple[str, str]:
        """(stdout, stderr) once the agent has exited. Both are read as they come (ChildOutput): an
        agent logging more than a pipe holds would otherwise block in its write."""
        self.output.wait(timeout)
        return self.output.stdout(), self.output.stderr()

    def describe(self) -> str:
        """What the agent says of itself, for the message of a wait that ran out: its readiness, its
        own counters that are not zero, and its last log lines."""
        try:
            ready = self.answer("/readyz")
            counters = [(n.removeprefix("ackscope_agent_"), l, v) for n, l, v in self.samples()
                        if n.startswith("ackscope_agent_") and v
                        and not n.endswith(("_created", "_bucket", "_sum", "_count"))]
        except OSError as error:  # not answering: hung, or gone
            ready, counters = f"no answer: {error}", []
        return (f"the agent: exit {self.process.poll()}, readyz {ready}, counters {counters}, "
                f"log: {self.output.stderr()[-3000:]}")

    def stop(self, sig=signal.SIGTERM, timeout: float = 120.0) -> dict:
        self.process.send_signal(sig)
        out, err = self.exited(timeout)
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
        if self.relay is not None:
            self.relay.close()


class BrokerRelay:
    """A TCP relay from a port of its own to the broker: an agent capturing that port sees only the
    connections made through it. The broker is shared with every test running at once (the lab's
    scenarios publish thousands of messages, other agent tests send TLS and garbage): measured, a
    publisher flooding the broker beside a test made its agent drop rows, and count kernel drops and
    a gap, none of them the test's. `port` is where clients connect."""

    def __init__(self, broker: tuple[str, int] = (BROKER_HOST, BROKER_PORT)):
        self.broker = broker
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]

    def start(self) -> None:
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self.listener.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:  # closed
                return
            threading.Thread(target=self._relay, args=(client,), daemon=True).start()

    def _relay(self, client: socket.socket) -> None:
        with client, socket.create_connection(self.broker) as upstream:
            back = threading.Thread(target=self._pump, args=(upstream, client), daemon=True)
            back.start()
            self._pump(client, upstream)
            back.join()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        """Bytes one way until the source's end closes (the broker resets rather than closes after
        connection.close-ok), then a FIN the same way, so the agent sees the connection end."""
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        try:
            sink.shutdown(socket.SHUT_WR)
        except OSError:  # the sink's end is gone too
            pass


def probe(port: int, path: str) -> tuple[int, str]:
    """(HTTP status, body) of GET path, whatever the status."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


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


TLS_CLIENT_HELLO = bytes.fromhex("16030100a5010000a10303") + os.urandom(32) + b"\x00" * 20


def send_and_close(payload: bytes, port: int = BROKER_PORT) -> None:
    """Bytes to the broker's port from a client of no protocol the agent decodes, until the broker hangs up."""
    with socket.create_connection((BROKER_HOST, port), timeout=10) as s:
        s.sendall(payload)
        s.settimeout(2)
        try:
            while s.recv(65536):
                pass
        except (socket.timeout, ConnectionResetError):
            pass


def env_root() -> str:
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def publish_confirmed(name: str, count: int, *, queue: str | None = None, close: bool = True, port: int = BROKER_PORT):
    """A pika publisher named `name` sends `count` messages in confirm mode to a fresh exclusive
    queue (or `queue`), each confirmed, through `port`; returns the open connection when close is False."""
    import pika

    from tests.lab.clients import pika_connection
    connection = pika_connection(name, port=port)
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


NOBODY, NOGROUP = "nobody", "nogroup"
CAP_NET_RAW = 13


def run_as_nobody(workdir: str, caps: tuple[str, ...] = ("net_raw",)) -> tuple[str, ...]:
    """A command prefix that runs what follows as user nobody with exactly `caps` (setpriv: inheritable
    and ambient, so they survive the exec; the bounding set cut to them too).

    The interpreter must be reachable by nobody. Where it lives under a folder only root may enter
    (this machine's venv points into /root/.pyenv, /root being mode 700), the command runs in a mount
    namespace of its own in which that folder is an empty tmpfs with only the interpreter's tree bound
    back in: nothing else of it is visible, and the host's mounts are untouched."""
    caps_list = ",".join(["-all"] + [f"+{c}" for c in caps])
    setpriv = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOGROUP}", "--clear-groups", "--no-new-privs",
               f"--inh-caps={caps_list}", f"--ambient-caps={caps_list}", f"--bounding-set={caps_list}"]
    closed = _closed_ancestor(os.path.realpath(sys.executable))
    if closed is None:
        return tuple(setpriv)
    folder, child = closed
    stash = os.path.join(workdir, "interpreter")
    os.makedirs(stash, exist_ok=True)
    script = os.path.join(workdir, "as-nobody.sh")
    with open(script, "w") as out:
        out.write("set -e\n"
                  f'mount --bind "{child}" "{stash}"\n'
                  f'mount -t tmpfs -o mode=755,size=1m tmpfs "{folder}"\n'
                  f'mkdir "{child}"\n'
                  f'mount --bind "{stash}" "{child}"\n'
                  'exec "$@"\n')
    return ("unshare", "--mount", "--propagation", "private", "sh", script, *setpriv)


def _closed_ancestor(path: str) -> tuple[str, str] | None:
    """(the first folder above `path` that others may not enter, its child on the way to `path`)."""
    parts = path.split(os.sep)
    for depth in range(2, len(parts)):
        folder = os.sep.join(parts[:depth]) or os.sep
        if not os.stat(folder).st_mode & 0o001:
            return folder, os.sep.join(parts[:depth + 1])
    return None


def folder_for_nobody(parent: str, name: str, owner: str = NOBODY) -> str:
    """A folder nobody can reach (pytest's own tmp folders are root's, mode 700), owned by `owner`."""
    import pwd
    import tempfile
    base = tempfile.mkdtemp(prefix="ackscope-nobody-", dir=parent)
    os.chmod(base, 0o755)
    folder = os.path.join(base, name)
    os.mkdir(folder, 0o755)
    entry = pwd.getpwnam(owner)
    os.chown(folder, entry.pw_uid, entry.pw_gid)
    return folder


def process_credentials(pid: int) -> dict[str, str]:
    """Uid, Gid, CapPrm, CapEff, CapAmb, ... of a running process, from /proc."""
    with open(f"/proc/{pid}/status") as status:
        return dict(line.rstrip("\n").split(":\t", 1) for line in status if ":\t" in line)
