"""The live agent's TLS key log: a file the application appends to, followed as it grows.

The key log is as sensitive as the traffic it decrypts: the agent refuses one that others than
its owner may read (group or world permission bits), and nothing it reads is ever logged. The
file may not exist yet when the agent starts (the application writes it at its first TLS
handshake); it may be truncated or replaced (the application restarted): it is read again from
its start, and secrets already read stay (an old connection may still be open).
"""

from __future__ import annotations

import logging
import os
import stat

from ..tls import KeyLog

READ_CHUNK = 1 << 20
log = logging.getLogger("ackscope.agent")


class KeyLogError(ValueError):
    """The key log cannot be used (its permissions): the message names the file, never its contents."""


def check_private(path: str, st: os.stat_result) -> None:
    if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise KeyLogError(f"the TLS key log {path} is readable by others than its owner "
                          f"(mode {stat.S_IMODE(st.st_mode):04o}): it holds the keys to the traffic; "
                          f"make it private (chmod 600, or an emptyDir only the two containers mount)")
    if not stat.S_ISREG(st.st_mode) and not stat.S_ISFIFO(st.st_mode):
        raise KeyLogError(f"the TLS key log {path} is not a regular file")


class KeyLogFile:
    """Follows one key log file into a growing `tls.KeyLog` (connections hold records for keys to come)."""

    def __init__(self, path: str, keylog: KeyLog | None = None):
        self.path = path
        self.keylog = keylog if keylog is not None else KeyLog(growing=True)
        self._identity: tuple | None = None  # (device, inode) of the file being read
        self._offset = 0
        self.refused = 0  # times the file was found with loose permissions after the start
        self._warned = False
        try:
            check_private(path, os.stat(path))
        except FileNotFoundError:
            pass  # not written yet: checked when it appears

    def poll(self) -> int:
        """Read what was appended since the last call; returns key lines added. Never raises for a
        missing file; a file that became readable by others is not read (counted in `refused`)."""
        try:
            with open(self.path, "rb") as f:
                st = os.fstat(f.fileno())
                try:
                    check_private(self.path, st)
                except KeyLogError as exc:
                    self.refused += 1
                    if not self._warned:  # once, until it is private again: the name and mode, never the contents
                        log.warning("%s; not read until it is", exc)
                        self._warned = True
                    return 0
                self._warned = False
                identity = (st.st_dev, st.st_ino)
                if identity != self._identity or st.st_size < self._offset:  # replaced or truncated: from the start
                    self._identity, self._offset = identity, 0
                    self.keylog.end()  # a cut last line of the old file is not glued to the new one
                f.seek(self._offset)
                added = 0
                while True:
                    data = f.read(READ_CHUNK)
                    if not data:
                        break
                    self._offset += len(data)
                    added += self.keylog.feed(data)
                return added
        except FileNotFoundError:
            return 0
