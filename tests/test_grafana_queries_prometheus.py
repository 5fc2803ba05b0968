"""Every panel query, run by a real Prometheus (Debian's package) over one series of every catalog
metric, labelled as the catalog says: each must be accepted (a parse or type error is a 400) and
return data. This catches what a parser cannot: a matcher or grouping on a label the metric does not
carry, a counter treated as a gauge returning nothing, a typo'd label value.

The recording rules' series are exposed directly, with the labels recorded.py promises, so this test
does not depend on how the rules are written; the end-to-end test runs the same queries against the
real rules and real traffic."""

import json
import shutil
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from analyzer import metric_names as m
from dashboards.grafana import panel_queries
from dashboards.grafana.recorded import RECORDING_RULES

LABEL_VALUES = {"vhost": "/", "application": "orders-api", "role": "consumer", "kind": "lost_confirm",
                "severity": "critical", "method": "basic.publish", "protocol": "amqp-1.0", "outcome": "ok",
                "table": "frames", "metric": "ackscope_unacked_deliveries", "label": "vhost"}
SCRAPE_SECONDS = 1


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def catalog_registry() -> CollectorRegistry:
    """One series of every catalog metric and recording rule, with every label it is declared with."""
    registry = CollectorRegistry()
    for metric in m.METRICS:
        labels = {name: LABEL_VALUES[name] for name in metric.labels}
        kind = {m.GAUGE: Gauge, m.COUNTER: Counter, m.HISTOGRAM: Histogram}[metric.type]
        series = kind(metric.name, metric.help, list(labels), registry=registry)
        series = series.labels(**labels) if labels else series
        if metric.type == m.GAUGE:
            series.set(time.time() if metric.name.endswith("_timestamp_seconds") else 3)
        elif metric.type == m.COUNTER:
            series.inc(5)
        else:
            series.observe(0.2)
    for name, labels in RECORDING_RULES.items():
        Gauge(name, "recording rule", list(labels), registry=registry).labels(
            **{label: LABEL_VALUES[label] for label in labels}).set(1)
    return registry


def serve_text_format(registry: CollectorRegistry) -> ThreadingHTTPServer:
    """/metrics in the classic text format, always: prometheus_client answers Prometheus's OpenMetrics
    Accept header with names escaped (":" becomes "_"), which would hide the recording rules' names."""
    body = generate_latest(registry)

    class Metrics(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Type", CONTENT_TYPE_LATEST)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Metrics)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory):
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.fail("prometheus is not installed: run `make test` (deploy/ci/services.sh installs it)")
    server = serve_text_format(catalog_registry())
    exporter_port = server.server_address[1]
    folder = tmp_path_factory.mktemp("prometheus")
    config = {"global": {"scrape_interval": f"{SCRAPE_SECONDS}s"},
              "scrape_configs": [{"job_name": "ackscope", "static_configs": [
                  {"targets": [f"127.0.0.1:{exporter_port}"]}]}]}
    (folder / "prometheus.yml").write_text(json.dumps(config))
    port = free_port()
    process = subprocess.Popen(
        [binary, f"--config.file={folder / 'prometheus.yml'}", f"--storage.tsdb.path={folder / 'data'}",
         f"--web.listen-address=127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL, stderr=open(folder / "prometheus.log", "w"))
    url = f"http://127.0.0.1:{port}"
    try:
        # rate() needs two samples in its window: wait until three scrapes are in
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                result = query(url, "count_over_time(ackscope_findings[1m])")
                if result and float(result[0]["value"][1]) >= 3:
                    break
            except (urllib.error.URLError, ConnectionError):
                pass
            time.sleep(0.5)
        else:
            pytest.fail("Prometheus did not scrape the catalog in time:\n" + (folder / "prometheus.log").read_text()[-2000:])
        yield url
    finally:
        process.terminate()
        process.wait(timeout=30)
        server.shutdown()
        server.server_close()


def query(url: str, expr: str) -> list:
    with urllib.request.urlopen(f"{url}/api/v1/query?" + urllib.parse.urlencode({"query": expr}), timeout=10) as r:
        return json.load(r)["data"]["result"]


def test_every_panel_query_runs_and_returns_data(prometheus):
    empty, failed = [], []
    for uid, title, expr in panel_queries():
        try:
            if not query(prometheus, expr):
                empty.append(f"{uid} / {title}: {expr}")
        except urllib.error.HTTPError as exc:
            failed.append(f"{uid} / {title}: {exc.code} {exc.read().decode()[:300]}")
    assert failed == [], "\n".join(failed)
    assert empty == [], "no data for:\n" + "\n".join(empty)


def test_the_check_sees_a_label_the_metric_does_not_have(prometheus):
    assert query(prometheus, 'sum by (application) (ackscope_unacked_deliveries{vhost=~".*"})')
    assert not query(prometheus, 'sum by (application) (ackscope_agent_buffered_rows{vhost=~".+"})')
    with pytest.raises(urllib.error.HTTPError) as bad:
        query(prometheus, "rate(ackscope_requeues_total)")
    assert bad.value.code == 400
