"""The real Pushgateway, Prometheus and Alertmanager (Debian's packages) for tests: each started on a
free loopback port with its own temporary data folder, waited for until ready, stopped after."""

from __future__ import annotations

import contextlib
import json
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request

import pytest

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
