"""The agent's HTTP endpoints: /metrics (Prometheus text format), /healthz (the process answers),
/readyz (capturing, and the last flush succeeded recently enough: 503 otherwise, with the reason)."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder


def parse_address(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"--metrics-addr wants HOST:PORT, not {text!r}")
    return host.strip("[]") or "0.0.0.0", int(port)


def serve(address: tuple[str, int], registry: CollectorRegistry, ready) -> ThreadingHTTPServer:
    """Start serving on a daemon thread. `ready()` returns (is ready, reason)."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (the http.server API)
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                encoder, content_type = choose_encoder(self.headers.get("Accept"))
                self._reply(200, encoder(registry), content_type)
            elif path == "/healthz":
                self._reply(200, b"ok\n")
            elif path == "/readyz":
                ok, reason = ready()
                self._reply(200 if ok else 503, (reason + "\n").encode())
            else:
                self._reply(404, b"not found\n")

        def _reply(self, status: int, body: bytes, content_type: str = "text/plain; charset=utf-8"):
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):  # scrapes every few seconds: not worth a log line each
            pass

    server = ThreadingHTTPServer(address, Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="ackscope-http", daemon=True).start()
    return server
