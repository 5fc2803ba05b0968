"""Recording loopback traffic to the broker with dumpcap, and keeping only one scenario's part.

dumpcap buffers its output file, so the file cannot tell when capturing has begun or whether
the last packets made it. Two facts are used instead: dumpcap prints "File: ..." once the
interface is open, and a probe TCP connection to the broker (a "fence") made right after the
start and right before the stop must appear in the file. The kernel hands packets over in
order, so a captured start fence proves the capture was live before the scenario's traffic,
and a captured end fence proves nothing before it was lost when dumpcap was stopped.

`start_dumpcap` and `stop_dumpcap` are how every test runs dumpcap on lo, the lab's recording
and the others (tests/port_recording.py, tests/tls_lab.py, tests/test_pieces_live.py,
tests/test_agent_churn.py).
"""

from __future__ import annotations

import os
import select
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from tests.lab import broker
from tests.lab.capture import run_tshark
from tests.lab.errors import LabError, NotObserved

CAPTURE_FILTER = f"tcp port {broker.PORT}"
# How long dumpcap may take to open its file (a readiness wait: it returns at once when ready).
STARTUP_TIMEOUT = 60.0
# dumpcap reads the kernel's packet ring in blocks with a 250 ms timeout; give it two.
DRAIN_BEFORE_STOP = 0.6


class Recording:
    def __init__(self, raw_path: Path):
        self.raw_path = raw_path
        self.fence_ports: list[int] = []
        self._dumpcap: subprocess.Popen | None = None

    def start(self) -> None:
        self.raw_path.unlink(missing_ok=True)
        self._dumpcap = start_dumpcap("-f", CAPTURE_FILTER, "-w", str(self.raw_path))
        self.fence_ports.append(fence_probe())

    def stop(self) -> None:
        if self._dumpcap is None:
            return
        dumpcap, self._dumpcap = self._dumpcap, None
        try:
            self.fence_ports.append(fence_probe())
        finally:
            stop_dumpcap(dumpcap)

    @property
    def active(self) -> bool:
        return self._dumpcap is not None

    def keep_streams(self, final_path: Path, connection_prefix: str, client_ports: set[int]) -> None:
        """Write to `final_path` only the TCP connections of one scenario: those whose
        connection.start-ok names a connection `connection_prefix...`, and those from
        `client_ports` (connections opened before the recording began). Other traffic to the
        broker during the run, and the fences, are left out.

        The raw capture may hold a lot of other traffic, so streams are picked with the AMQP
        dissector off: the start-ok is found by its bytes, the client properties field name
        and the connection name."""
        wanted = (f'(tcp.payload contains "connection_name" && tcp.payload contains "{connection_prefix}") '
                  f'|| {one_of("tcp.port", {*self.fence_ports, *client_ports})}')
        rows = run_tshark(["-r", str(self.raw_path), "--disable-protocol", "amqp", "-Y", wanted,
                           "-T", "fields", "-e", "tcp.stream", "-e", "tcp.srcport", "-e", "tcp.dstport"],
                          self.raw_path)
        clients_seen, streams = set(), set()
        for row in rows.splitlines():
            stream, source, destination = (int(value) for value in row.split("\t"))
            client = destination if source == broker.PORT else source
            clients_seen.add(client)
            if client not in self.fence_ports:
                streams.add(stream)
        missing = [port for port in self.fence_ports if port not in clients_seen]
        if missing:
            raise NotObserved(f"the capture lost packets: fence connection(s) from port {missing} not recorded")
        if not streams:
            raise NotObserved(f"no connection named {connection_prefix}* in the capture")
        run_tshark(["-r", str(self.raw_path), "--disable-protocol", "amqp", "-Y", one_of("tcp.stream", streams),
                    "-w", str(final_path)], self.raw_path)


def one_of(field: str, values: set[int]) -> str:
    """A display filter; tshark 4.0 wants commas between set members."""
    return f"{field} in {{{','.join(str(value) for value in sorted(values))}}}"


def start_dumpcap(*options: str, timeout: float = STARTUP_TIMEOUT) -> subprocess.Popen:
    """dumpcap on lo with `options` (a filter, the file), returned once it says "File: ..."."""
    dumpcap = shutil.which("dumpcap")
    if dumpcap is None:
        raise LabError("dumpcap is not installed (apt-get install tshark)")
    process = subprocess.Popen([dumpcap, "-i", "lo", *options, "-q"], stdin=subprocess.DEVNULL,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    said_file(process, timeout)
    return process


def said_file(process: subprocess.Popen, timeout: float) -> None:
    """Wait until `process` has written a line starting "File:" to its stderr pipe.

    The pipe is read with os.read, never through a buffered reader: one read can take that line
    together with the one before it ("Capturing on ..."), and a select() on the pipe would then
    wait for bytes already read. dumpcap writes the two lines within milliseconds, so on a busy
    machine they arrive together, and the wait ran out in CI while test_spark_cluster started."""
    pipe, said, deadline = process.stderr.fileno(), b"", time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if select.select([pipe], [], [], max(0.0, min(left, 0.1)))[0]:
            chunk = os.read(pipe, 4096)
            said += chunk
            if any(line.startswith(b"File:") for line in said.split(b"\n")[:-1]):
                return
            if chunk:
                continue
        if process.poll() is not None:
            raise LabError(f"dumpcap exited ({process.returncode}): {said.decode(errors='replace').strip()}")
        if left <= 0:
            process.kill()
            raise LabError(f"dumpcap did not start capturing within {timeout:.0f}s: "
                           f"{said.decode(errors='replace').strip()}")


def stop_dumpcap(process: subprocess.Popen) -> None:
    """dumpcap given DRAIN_BEFORE_STOP to read the kernel's ring, then stopped (SIGINT); a LabError
    where it does not stop or fails."""
    try:
        time.sleep(DRAIN_BEFORE_STOP)
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=STARTUP_TIMEOUT)
        except subprocess.TimeoutExpired:
            process.kill()
            raise LabError("dumpcap did not stop on SIGINT")
    if process.returncode != 0:
        said = process.stderr.read().decode(errors="replace").strip()
        raise LabError(f"dumpcap failed ({process.returncode}): {said}")


def fence_probe() -> int:
    """Open and close a TCP connection to the broker; return its client port."""
    with socket.create_connection((broker.HOST, broker.PORT), timeout=10) as probe:
        return probe.getsockname()[1]
