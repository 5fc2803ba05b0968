"""The NSS key log format (what SSLKEYLOGFILE and `ssl.SSLContext.keylog_filename` write).

Sans-IO: `feed()` takes the file's bytes as they come (a followed file grows in pieces, a line
may arrive cut), `secrets()` answers by client random. A line is `LABEL <client random hex>
<secret hex>`; comments start with '#'. Lines that do not parse are counted and skipped, never
echoed: they may hold secrets.
"""

import re

# The labels we use; others (EXPORTER_SECRET, CLIENT_EARLY_TRAFFIC_SECRET, ...) are valid and ignored.
CLIENT_RANDOM = "CLIENT_RANDOM"  # TLS 1.2: the master secret (TLS 1.3's four labels: layer.py)
# Live, a client writes its line when its handshake ends, and the agent reads the file after: a
# connection holds its records this long (capture time) and this many bytes before it gives up.
DEFAULT_HOLD_NS = 10_000_000_000
DEFAULT_HOLD_BYTES = 1 << 20
MAX_LINE = 1024  # a real line is under 300 bytes: a longer one is not a key line
_LINE = re.compile(rb"([A-Z0-9_]{1,64}) ([0-9a-fA-F]{64}) ([0-9a-fA-F]{32,192})")


class KeyLog:
    """Secrets by client random, from one or more key log files fed in any pieces. `growing`: a
    followed file, whose keys may still come (connections hold their records for them)."""

    def __init__(self, growing: bool = False, hold_ns: int = DEFAULT_HOLD_NS, hold_bytes: int = DEFAULT_HOLD_BYTES):
        self.growing, self.hold_ns, self.hold_bytes = growing, hold_ns, hold_bytes
        self._secrets: dict[bytes, dict[str, bytes]] = {}
        self.lines = 0           # key lines read
        self.corrupted = 0       # lines that are not key lines (counted, skipped, never shown)
        self.generation = 0      # grows whenever a secret was added: holders of records try again
        self._partial = b""

    def feed(self, data: bytes) -> int:
        """Read the next bytes of a key log; a last line without its newline waits for the rest.
        Returns the number of key lines added."""
        data = self._partial + data
        lines = data.split(b"\n")
        self._partial = lines.pop()
        if len(self._partial) > MAX_LINE:  # no newline in sight: not a key log line
            self.corrupted += 1
            self._partial = b""
        added = 0
        for line in lines:
            added += self._line(line.strip())
        if added:
            self.generation += 1
        return added

    def end(self) -> int:
        """The file is complete: its last line counts even without a newline."""
        partial, self._partial = self._partial, b""
        added = self._line(partial.strip())
        if added:
            self.generation += 1
        return added

    def _line(self, line: bytes) -> int:
        if not line or line.startswith(b"#"):
            return 0
        match = _LINE.fullmatch(line) if len(line) <= MAX_LINE else None
        if match is None:
            self.corrupted += 1
            return 0
        label, random_hex, secret_hex = match.groups()
        label = label.decode()
        if len(secret_hex) % 2:
            self.corrupted += 1
            return 0
        self.lines += 1  # other labels (EXPORTER_SECRET, OpenSSL's CLIENT_TRAFFIC_SECRET_N, ...) are kept unused
        self._secrets.setdefault(bytes.fromhex(random_hex.decode()), {})[label] = bytes.fromhex(secret_hex.decode())
        return 1

    def add(self, other: "KeyLog") -> None:
        """Another key log's secrets and counts, added to these (several files, one key log)."""
        for client_random, secrets in other._secrets.items():
            self._secrets.setdefault(client_random, {}).update(secrets)
        self.lines += other.lines
        self.corrupted += other.corrupted
        if other._secrets:
            self.generation += 1

    def secrets(self, client_random: bytes) -> dict[str, bytes]:
        """The secrets logged for this handshake (by label), empty if none."""
        return self._secrets.get(client_random, {})

    def __len__(self) -> int:
        return len(self._secrets)

    def __repr__(self) -> str:  # never the secrets
        return f"KeyLog({len(self._secrets)} handshakes, {self.lines} lines, {self.corrupted} corrupted)"


def read_keylog(path: str, keylog: KeyLog | None = None) -> KeyLog:
    """A whole key log file. Errors name the file, never its contents."""
    keylog = KeyLog() if keylog is None else keylog
    with open(path, "rb") as f:
        keylog.feed(f.read())
    keylog.end()
    return keylog
