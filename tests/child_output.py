"""A child process's stdout and stderr read as they come, each by a thread of its own.

A pipe holds 64 KiB on Linux: a child that writes more while the test reads nothing (the agent's
log lines over a long test, analyze --every's reports) blocks in its write, holding whatever it was
doing, and the test then waits for a child that waits for the test."""

from __future__ import annotations

import subprocess
import threading


class ChildOutput:
    """`out` and `err`: the lines so far, without their newline (text-mode pipes)."""

    def __init__(self, process: subprocess.Popen):
        self.process = process
        self.out: list[str] = []
        self.err: list[str] = []
        self._readers = [threading.Thread(target=self._read, args=(pipe, lines), daemon=True)
                         for pipe, lines in ((process.stdout, self.out), (process.stderr, self.err))]
        for reader in self._readers:
            reader.start()

    @staticmethod
    def _read(pipe, lines: list) -> None:
        for line in pipe:
            lines.append(line.rstrip("\n"))

    def stdout(self) -> str:
        return "\n".join(self.out)

    def stderr(self) -> str:
        return "\n".join(self.err)

    def wait(self, timeout: float) -> int:
        """The child's exit status, once it has exited and both pipes are read to their end."""
        status = self.process.wait(timeout)
        for reader in self._readers:
            reader.join(10)
        return status
