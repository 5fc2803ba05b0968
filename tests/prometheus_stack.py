"""The real Pushgateway, Prometheus and Alertmanager (Debian's packages) for tests: each started on a
free loopback port with its own temporary data folder, waited for until ready, stopped after."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import yaml

BINARIES = {"pushgateway": "prometheus-pushgateway", "prometheus": "prometheus",
            "alertmanager": "prometheus-alertmanager", "promtool": "promtool"}


def binary(name: str) -> str:
    path = shutil.which(BINARIES[name])
    if path is None:
        pytest.fail(f"{BINARIES[name]} is not installed: run `make services` (deploy/ci/services.sh installs it)")
    return path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def get(url: str, timeout: float = 5.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.read()


def get_json(url: str) -> dict:
    return json.loads(get(url))


@contextlib.contextmanager
def running(name: str, args: list[str], ready_path: str, port: int, log_path: str, start_timeout: float = 30.0):
    """Start the service, wait until `ready_path` answers 200, yield its base URL; stop it after."""
    base = f"http://127.0.0.1:{port}"
    with open(log_path, "wb") as log:
        process = subprocess.Popen([binary(name), *args], stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + start_timeout
        while True:
            if process.poll() is not None:
                pytest.fail(f"{name} exited with {process.returncode}: {open(log_path).read()[-2000:]}")
            try:
                get(base + ready_path, timeout=1.0)
                break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail(f"{name} not ready after {start_timeout}s: {open(log_path).read()[-2000:]}")
                time.sleep(0.1)
        yield base
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@contextlib.contextmanager
def pushgateway(tmp_dir: str):
    port = free_port()
    # Debian's build persists to /var/lib/prometheus by default: every test gets its own file.
    with running("pushgateway", [f"--web.listen-address=127.0.0.1:{port}",
                                 f"--persistence.file={tmp_dir}/pushgateway.data"], "/-/ready", port,
                 f"{tmp_dir}/pushgateway.log") as url:
        yield url


def pushgateway_series(url: str) -> list[dict]:
    """Every sample the Pushgateway holds, as {name, labels, value} (its JSON API, not text parsing)."""
    out = []
    for group in get_json(url + "/api/v1/metrics")["data"]:
        for name, family in group.items():
            if not isinstance(family, dict) or "metrics" not in family:
                continue
            for metric in family["metrics"]:
                if "value" in metric:
                    out.append({"name": name, "labels": metric["labels"], "value": float(metric["value"])})
                elif "buckets" in metric:
                    out.append({"name": name, "labels": metric["labels"], "buckets": metric["buckets"],
                                "count": float(metric["count"]), "sum": float(metric["sum"])})
    return out


def query(prometheus_url: str, promql: str) -> list[dict]:
    """An instant query's result vector; raises AssertionError with Prometheus' error if it fails."""
    url = prometheus_url + "/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    try:
        answer = get_json(url)
    except urllib.error.HTTPError as exc:
        raise AssertionError(f"{promql!r}: {exc.read().decode(errors='replace')}") from None
    assert answer["status"] == "success", answer
    return answer["data"]["result"]


@dataclass
class Webhook:
    """Alertmanager's webhook receiver: every alert it was sent, as Alertmanager's JSON has them."""
    alerts: list = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def received(self) -> list[dict]:
        with self.lock:
            return list(self.alerts)


def serve_webhook(webhook: Webhook) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            with webhook.lock:
                webhook.alerts.extend(body["alerts"])
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):  # quiet
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@contextlib.contextmanager
def alertmanager(tmp_dir: str, webhook: Webhook):
    """A real Alertmanager sending every alert, one group each, at once to `webhook` (served here).
    Yields (its URL, its port)."""
    server = serve_webhook(webhook)
    port = free_port()
    with open(os.path.join(tmp_dir, "alertmanager.yml"), "w") as out:
        yaml.safe_dump({
            "route": {"receiver": "test", "group_by": ["..."], "group_wait": "1s", "group_interval": "1s",
                      "repeat_interval": "1h"},
            "receivers": [{"name": "test", "webhook_configs": [
                {"url": f"http://127.0.0.1:{server.server_address[1]}/", "send_resolved": False}]}]}, out)
    try:
        with running("alertmanager", [f"--config.file={tmp_dir}/alertmanager.yml",
                                      f"--storage.path={tmp_dir}/alertmanager",
                                      f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address="],
                     "/-/ready", port, f"{tmp_dir}/alertmanager.log") as url:
            yield url, port
    finally:
        server.shutdown()


def write_prometheus_config(tmp_dir: str, rules_file: str, alertmanager_port: int, scrape_configs: list[dict]) -> str:
    """prometheus.yml with 1 s scrapes and evaluations (writing it again and POSTing /-/reload changes
    a running Prometheus)."""
    path = os.path.join(tmp_dir, "prometheus.yml")
    with open(path, "w") as out:
        yaml.safe_dump({
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [rules_file],
            "alerting": {"alertmanagers": [{"static_configs": [{"targets": [f"127.0.0.1:{alertmanager_port}"]}]}]},
            "scrape_configs": scrape_configs}, out)
    return path


@contextlib.contextmanager
def prometheus(tmp_dir: str, rules_file: str, alertmanager_port: int, scrape_configs: list[dict]):
    """A real Prometheus over `scrape_configs`, with the rules, sending to the Alertmanager. Yields its URL."""
    config = write_prometheus_config(tmp_dir, rules_file, alertmanager_port, scrape_configs)
    port = free_port()
    with running("prometheus", [f"--config.file={config}", f"--storage.tsdb.path={tmp_dir}/tsdb",
                                f"--web.listen-address=127.0.0.1:{port}", "--web.enable-lifecycle"],
                 "/-/ready", port, f"{tmp_dir}/prometheus.log") as url:
        yield url


def reload_prometheus(url: str) -> None:
    request = urllib.request.Request(url + "/-/reload", method="POST")
    with urllib.request.urlopen(request, timeout=10) as reply:
        assert reply.status == 200


def settle(condition, what: str, timeout: float, during=None):
    """Poll `condition` every half second until it is true and return it; fail the test with `what`
    after `timeout`. `during()`, if given, runs between polls instead of sleeping (a client that must
    go on serving its connection)."""
    deadline = time.monotonic() + timeout
    while True:
        result = condition()
        if result:
            return result
        if time.monotonic() > deadline:
            pytest.fail(f"{what} after {timeout}s")
        if during is not None:
            during()
        else:
            time.sleep(0.5)
