"""dumpcap recording one TCP port on loopback: the reference capture beside the agent in tests
whose clients go through the agent's own BrokerRelay (tests/agent_support.py), so the file holds
their connections only, whatever else the shared broker carries."""

from __future__ import annotations

import select
import shutil
import signal
import subprocess
import time
from pathlib import Path

STARTUP_TIMEOUT = 20.0
# dumpcap reads the kernel's packet ring in blocks with a 250 ms timeout: give it two before stopping.
DRAIN_BEFORE_STOP = 0.6


class PortRecording:
    def __init__(self, path: Path, port: int):
        self.path, self.port = Path(path), port
        self.process: subprocess.Popen | None = None

    def __enter__(self) -> "PortRecording":
        dumpcap = shutil.which("dumpcap")
        if dumpcap is None:
            raise RuntimeError("dumpcap is not installed: run `make test` (deploy/ci/services.sh installs it)")
        self.process = subprocess.Popen([dumpcap, "-i", "lo", "-f", f"tcp port {self.port}", "-w", str(self.path), "-q"],
                                        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                        text=True)
        deadline, seen = time.monotonic() + STARTUP_TIMEOUT, []
        while time.monotonic() < deadline:  # dumpcap says "File: ..." once the interface is open
            if select.select([self.process.stderr], [], [], 0.1)[0]:
                line = self.process.stderr.readline()
                seen.append(line.strip())
                if line.startswith("File:"):
                    return self
            if self.process.poll() is not None:
                raise RuntimeError(f"dumpcap exited ({self.process.returncode}): {' '.join(seen)}")
        self.process.kill()
        raise RuntimeError(f"dumpcap did not start within {STARTUP_TIMEOUT:.0f}s: {' '.join(seen)}")

    def stop(self) -> Path:
        if self.process is not None and self.process.poll() is None:
            time.sleep(DRAIN_BEFORE_STOP)
            self.process.send_signal(signal.SIGINT)
            self.process.wait(timeout=STARTUP_TIMEOUT)
        return self.path

    def __exit__(self, *exc):
        self.stop()
