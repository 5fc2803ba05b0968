"""`ackscope ingest --watch DIR`: follow a capture ring as its writer rotates.

dumpcap's ring buffer (`-b filesize:` / `-b duration:`), tcpdump `-C` / `-G` and the agent's
`--pcap-out` rotation write one file at a time: every file but the newest is closed. Each poll
ingests the closed files not ingested yet as one capture (ingest.ingest_files), so a connection
goes on across them and across polls through the lake's saved flows (flow_lake.py). The lake is
the watcher's memory: after a restart, files already in it are skipped (their fingerprints are
computed once more) and the saved flows continue. SIGTERM or SIGINT stops it between two ingests;
an ingest under way is finished and committed first. The file still being written is left to the
next watcher, or to a final `ackscope ingest FILE` once its writer has stopped.

The TLS key logs (`--tls-keylog`) are read again before each ingest, as clients append their keys.
One that cannot be read then (rotated away, replaced, its mode changed) stops nothing: the keys
read from it before are used, and a note names the file and the reason (never its contents).
"""

import fnmatch
import os
import signal
import threading

from .terminal import printable
from .tls.keylog import KeyLog, read_keylog

DEFAULT_PATTERN = "*.pcap*"
POLL_S = 1.0


def closed_files(folder: str, pattern: str) -> list[str]:
    """The files of `folder` matching `pattern` that the writer has rotated past: all but the one
    modified last (the one being written). Oldest first."""
    entries = []
    for name in os.listdir(folder):
        path = os.path.join(folder, name)
        if fnmatch.fnmatch(name, pattern):
            try:
                stat = os.stat(path)
            except OSError:  # rotated away (a ring deletes its oldest file) while we looked
                continue
            if os.path.isfile(path):
                entries.append((stat.st_mtime_ns, name, path))
    entries.sort()
    return [path for _, _, path in entries[:-1]]


class Watcher:
    """Polls `folder` and hands each poll's new closed files to `ingest(paths)` (which returns
    the reports); `report(reports)` shows them. `stop()` (or SIGTERM/SIGINT, see `run`) ends it."""

    def __init__(self, folder: str, pattern: str, ingest, report, poll_s: float = POLL_S):
        self.folder, self.pattern = folder, pattern
        self.ingest, self.report, self.poll_s = ingest, report, poll_s
        self.stopping = threading.Event()
        self.done: set[tuple[str, int, int]] = set()  # (path, size, mtime) ingested by this watcher

    def stop(self, *_signal) -> None:
        self.stopping.set()

    def poll(self) -> list:
        """Ingest the closed files not ingested yet; their reports."""
        new = []
        for path in closed_files(self.folder, self.pattern):
            try:
                stat = os.stat(path)
            except OSError:
                continue
            key = (path, stat.st_size, stat.st_mtime_ns)
            if key not in self.done:
                new.append((path, key))
        if not new:
            return []
        reports = self.ingest([path for path, _ in new])
        self.done.update(key for _, key in new)
        return reports

    def run(self) -> int:
        """Poll until stopped by SIGTERM or SIGINT (installed here, put back after)."""
        previous = {sig: signal.signal(sig, self.stop) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            while not self.stopping.is_set():
                reports = self.poll()
                if reports:
                    self.report(reports)
                self.stopping.wait(self.poll_s)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        return 0


class KeyLogFiles:
    """The key log files of a watcher, read again for each ingest: `read()` gives one KeyLog of
    all of them (None when none was given) and notes about the ones that could not be read."""

    def __init__(self, paths: list[str]):
        self.paths = list(paths)
        self._last: dict[str, KeyLog] = {}  # what each file held when it was last read

    def read(self) -> tuple[KeyLog | None, list[str]]:
        if not self.paths:
            return None, []
        combined, notes = KeyLog(), []
        for path in self.paths:
            try:
                keylog = read_keylog(path)
            except OSError as exc:  # its name and the system's reason; never its contents
                keylog = self._last.get(path)
                kept = (f"the {keylog.lines} key line(s) read from it before are used" if keylog is not None
                        else "no keys from it")
                notes.append(f"cannot read the TLS key log {printable(path)} ({exc.strerror or exc}): {kept}")
                if keylog is None:
                    continue
            else:
                self._last[path] = keylog
            combined.add(keylog)
        return combined, notes
