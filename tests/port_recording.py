"""dumpcap recording one TCP port on loopback: the reference capture beside the agent in tests
whose clients go through the agent's own BrokerRelay (tests/agent_support.py), so the file holds
their connections only, whatever else the shared broker carries."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.lab.recording import start_dumpcap, stop_dumpcap


class PortRecording:
    def __init__(self, path: Path, port: int):
        self.path, self.port = Path(path), port
        self.process: subprocess.Popen | None = None

    def __enter__(self) -> "PortRecording":
        self.process = start_dumpcap("-f", f"tcp port {self.port}", "-w", str(self.path))
        return self

    def stop(self) -> Path:
        if self.process is not None and self.process.poll() is None:
            stop_dumpcap(self.process)
        return self.path

    def __exit__(self, *exc):
        self.stop()
