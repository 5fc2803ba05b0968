"""Real TLS conversations in memory, for the TLS layer's tests: OpenSSL on both ends (Python's ssl
with memory BIOs), the client writing its key log. Each conversation is the list of
(direction, bytes) the wire carried, in order: 0 client to server, 1 server to client."""

from __future__ import annotations

import ssl
from pathlib import Path

CERT, KEY = "/var/lib/ackscope-test-tls/server.pem", "/var/lib/ackscope-test-tls/server.key"


class Conversation:
    def __init__(self, keylog: Path, version: ssl.TLSVersion, ciphers: str | None = None,
                 session: ssl.SSLSession | None = None, server: ssl.SSLContext | None = None,
                 client: ssl.SSLContext | None = None):
        self.server_context = server or server_context()
        self.client_context = client = client or client_context(keylog, version, ciphers)
        self._bios = [ssl.MemoryBIO() for _ in range(4)]
        c_in, c_out, s_in, s_out = self._bios
        self.client = client.wrap_bio(c_in, c_out, server_hostname="broker.example", session=session)
        self.server = self.server_context.wrap_bio(s_in, s_out, server_side=True)
        self.wire: list[tuple[int, bytes]] = []
        for _ in range(6):
            for end in (self.client, self.server):
                try:
                    end.do_handshake()
                except ssl.SSLWantReadError:
                    pass
            self._pump()

    def _pump(self) -> None:
        c_in, c_out, s_in, s_out = self._bios
        for _ in range(4):
            for source, sink, direction in ((c_out, s_in, 0), (s_out, c_in, 1)):
                data = source.read()
                if data:
                    self.wire.append((direction, data))
                    sink.write(data)

    def send(self, direction: int, data: bytes) -> None:
        """`data` from one end, read whole by the other."""
        writer, reader = (self.client, self.server) if direction == 0 else (self.server, self.client)
        writer.write(data)
        self._pump()
        got = b""
        while len(got) < len(data):
            got += reader.read(1 << 20)
        assert got == data

    def stream(self, direction: int) -> bytes:
        return b"".join(data for d, data in self.wire if d == direction)


def client_context(keylog: Path, version: ssl.TLSVersion, ciphers: str | None = None) -> ssl.SSLContext:
    client = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    client.check_hostname, client.verify_mode = False, ssl.CERT_NONE
    client.minimum_version = client.maximum_version = version
    if ciphers:
        client.set_ciphers(ciphers)
    client.keylog_filename = str(keylog)
    return client


def server_context() -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(CERT, KEY)
    context.set_ciphers("ALL:@SECLEVEL=0")  # the broker's CBC suites too
    return context
