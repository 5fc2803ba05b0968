"""Handshake messages read in clear: what the hellos say (randoms, SNI, version, cipher suite).

Sans-IO. `HandshakeBuffer` cuts one direction's handshake bytes into messages (a message may
span records, a record may hold several); `client_hello` and `server_hello` read the fields we
need and raise `HandshakeError` on anything that does not parse.
"""

from dataclasses import dataclass

CLIENT_HELLO, SERVER_HELLO, NEW_SESSION_TICKET, FINISHED, KEY_UPDATE = 1, 2, 4, 20, 24
TLS12, TLS13 = 0x0303, 0x0304
VERSION_NAMES = {0x0300: "SSLv3", 0x0301: "TLSv1.0", 0x0302: "TLSv1.1", TLS12: "TLSv1.2", TLS13: "TLSv1.3"}
EXT_SERVER_NAME, EXT_ENCRYPT_THEN_MAC, EXT_SUPPORTED_VERSIONS = 0, 22, 43
# A ServerHello with this random is a HelloRetryRequest (RFC 8446 4.1.3): a second ClientHello follows.
HELLO_RETRY_RANDOM = bytes.fromhex("cf21ad74e59a6111be1d8c021e65b891c2a211167abb8c5e079e09e2c8a8339c")
MAX_MESSAGE = 1 << 17  # a handshake message longer than this is not one we need (certificates are skipped)
MAX_SNI = 255


class HandshakeError(ValueError):
    """The peer's handshake bytes do not parse."""


@dataclass(frozen=True, slots=True)
class ClientHello:
    random: bytes
    sni: str | None


@dataclass(frozen=True, slots=True)
class ServerHello:
    random: bytes
    version: int
    cipher_suite: int
    encrypt_then_mac: bool

    @property
    def retry(self) -> bool:
        return self.random == HELLO_RETRY_RANDOM


class HandshakeBuffer:
    """One direction's handshake stream, cut into (type, body) messages."""
    __slots__ = ("buf", "skip")

    def __init__(self):
        self.buf = b""
        self.skip = 0  # bytes of an over-long message still to pass

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        if self.skip:
            taken = min(self.skip, len(data))
            self.skip -= taken
            data = data[taken:]
        data = self.buf + data
        out, pos, n = [], 0, len(data)
        while n - pos >= 4:
            length = int.from_bytes(data[pos + 1:pos + 4], "big")
            if length > MAX_MESSAGE:  # pass over it without holding it
                out.append((data[pos], None))
                self.skip = max(0, pos + 4 + length - n)
                pos = min(n, pos + 4 + length)
                continue
            if pos + 4 + length > n:
                break
            out.append((data[pos], data[pos + 4:pos + 4 + length]))
            pos += 4 + length
        self.buf = data[pos:]
        return out


class _Reader:
    __slots__ = ("data", "pos")

    def __init__(self, data: bytes):
        self.data, self.pos = data, 0

    def take(self, n: int) -> bytes:
        if self.pos + n > len(self.data):
            raise HandshakeError("handshake message cut short")
        out = self.data[self.pos:self.pos + n]
        self.pos += n
        return out

    def number(self, n: int) -> int:
        return int.from_bytes(self.take(n), "big")

    def vector(self, length_bytes: int) -> bytes:
        return self.take(self.number(length_bytes))

    def extensions(self) -> dict[int, bytes]:
        if self.pos == len(self.data):
            return {}
        block = _Reader(self.vector(2))
        found = {}
        while block.pos < len(block.data):
            kind = block.number(2)
            found[kind] = block.vector(2)
        return found


def client_hello(body: bytes) -> ClientHello:
    r = _Reader(body)
    r.take(2)
    random = r.take(32)
    r.vector(1)  # session id
    r.vector(2)  # cipher suites
    r.vector(1)  # compression methods
    sni = None
    server_name = r.extensions().get(EXT_SERVER_NAME)
    if server_name:
        names = _Reader(_Reader(server_name).vector(2))
        while names.pos < len(names.data):
            kind, name = names.number(1), names.vector(2)
            if kind == 0:  # host_name; hostile text: bounded here, escaped where it is shown
                sni = name[:MAX_SNI].decode("ascii", "replace")
                break
    return ClientHello(random, sni)


def server_hello(body: bytes) -> ServerHello:
    r = _Reader(body)
    version = r.number(2)
    random = r.take(32)
    r.vector(1)  # session id
    suite = r.number(2)
    r.take(1)  # compression method
    extensions = r.extensions()
    selected = extensions.get(EXT_SUPPORTED_VERSIONS)
    if selected is not None and len(selected) == 2:
        version = int.from_bytes(selected, "big")
    return ServerHello(random, version, suite, EXT_ENCRYPT_THEN_MAC in extensions)
