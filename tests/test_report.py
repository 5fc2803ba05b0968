"""`ackscope report`: the page of a real analysed lake (every example), hostile names escaped,
empty and partial lakes, size bounds on a lake of millions of rows, the pictures' series against
channel_metrics, and the page opened in headless Chromium (no console errors, no network, a
screenshot). Spark runs only in the shared `analysed_examples` fixture."""

from __future__ import annotations

import json
import os
import re
import struct
import time
from html import escape

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from analyzer import lake, schema
from analyzer.cli import main
from analyzer.finding_advice import ADVICE
from analyzer.findings import read_findings
from analyzer.report import write_report
from analyzer.report import charts, series
from analyzer.report.lake_view import read_lake
from analyzer.timeline.tables import CHANNELS

from .conftest import ROOT
from .headless_chromium import Browser

SECTIONS = ('id="findings"', 'id="pictures"', 'id="connections"', "Unacked deliveries over time",
            "Unconfirmed publishes over time", "Confirm and ack latency", "Publish-to-confirm order", "Requeue loops")


@pytest.fixture(scope="module")
def examples_report(analysed_examples, tmp_path_factory) -> tuple[str, str]:
    lake_dir, _ = analysed_examples
    out = str(tmp_path_factory.mktemp("report") / "report.html")
    assert main(["report", "--lake", lake_dir, "-o", out]) == 0
    with open(out, encoding="utf-8") as page:
        return out, page.read()


# -- the advice: one source --------------------------------------------------------------------

def test_readme_advice_table_is_finding_advice():
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as readme:
        text = readme.read()
    table = text[text.index("| kind | severity | what it means | what to do |"):].splitlines()[2:]
    advice, severities = {}, {}
    for line in table:
        if not line.startswith("|"):
            break
        kind, severity, meaning, todo = (cell.strip() for cell in line.strip().strip("|").split(" | "))
        advice[kind.strip("`")] = (meaning, todo)
        severities[kind.strip("`")] = severity
    assert advice == ADVICE
    assert severities == schema.FINDING_SEVERITY
    assert set(ADVICE) == set(schema.FINDING_KINDS)
    # The dashboards' panel descriptions say the same (their severities are a copy without Spark).
    from dashboards.grafana import advice
    assert advice.SEVERITY == schema.FINDING_SEVERITY
    assert advice.findings_table() == "\n".join(text[text.index("| kind | severity |"):].splitlines()[:2 + len(ADVICE)])


# -- the page of the analysed examples ---------------------------------------------------------

def test_report_shows_every_finding_with_evidence_and_advice(analysed_examples, examples_report):
    lake_dir, _ = analysed_examples
    _, html = examples_report
    findings = read_findings(lake_dir)
    assert findings, "the examples have findings"
    for section in SECTIONS:
        assert section in html, section
    articles = re.findall(r'<article class="finding sev-(\w+)"[^>]*>(.*?)</article>', html, re.S)
    assert len(articles) == len(findings)
    # Worst first, in the order `ackscope findings` prints them; each with its own evidence.
    assert [severity for severity, _ in articles] == [f["severity"] for f in findings]
    for finding, (_, article) in zip(findings, articles):
        assert escape(finding["summary"]) in article
        assert finding["finding_id"] in article
        meaning, todo = ADVICE[finding["kind"]]
        assert escape(todo).split("`")[0] in article
        evidence = json.loads(finding["evidence"])
        for packet in evidence.get("source_packets", [])[:20]:
            assert f"<code>{packet}</code>" in article
        for identity in evidence.get("message_identities", [])[:20]:
            assert escape(identity) in article
        assert os.path.basename(finding["source"]) in article
    for severity in schema.SEVERITIES:
        count = sum(1 for f in findings if f["severity"] == severity)
        assert f'<a class="tile sev-{severity}" href="#findings"><span class="n">{count}</span>' in html


def test_report_pictures_and_connections(analysed_examples, examples_report):
    lake_dir, _ = analysed_examples
    _, html = examples_report
    view = read_lake(lake_dir)
    loops = [f for f in view.findings if f["kind"] == "requeue_loop"]
    assert loops
    for finding in loops[:3]:
        assert escape(f"Deliveries of message {finding['message_identity']}") in html
    svgs = html.count("<svg ")
    assert svgs >= 10, svgs
    # Every time chart has both axes labelled with units, and a legend.
    for chart in re.findall(r"<svg .*?</svg>", html, re.S):
        assert 'class="axis"' in chart and 'class="legend"' in chart
    for connection in view.connections:
        if connection["connection_name"]:
            assert escape(connection["connection_name"]) in html
    assert "CONNECTION_FORCED - lab: operator closes" in html  # how the broker-closed connection ended
    assert "TCP RST (reset)" in html
    assert "open at the end of the capture" in html


def test_report_needs_no_network(examples_report):
    _, html = examples_report
    assert not re.search(r"<(link|img|iframe|object|embed)\b", html)
    assert not re.search(r"<script[^>]*\bsrc=", html)
    assert "@import" not in html and "url(" not in html
    # The only URL: the SVG namespace, which is a name, never fetched.
    assert set(re.findall(r"https?://[^\s\"'<>]+", html)) <= {"http://www.w3.org/2000/svg"}


# -- the pictures' series agree with channel_metrics -------------------------------------------

def test_outstanding_series_match_channel_metrics(analysed_examples):
    """The report's step series follow channel_metrics' counting rules: at every bucket's end they
    hold its unacked / unconfirmed, and within the bucket they peak at its *_max."""
    lake_dir, _ = analysed_examples
    view = read_lake(lake_dir)
    metrics = lake.read_table(lake_dir, "channel_metrics", schema.CHANNEL_METRICS).to_pylist()
    checked = 0
    for key in {(m["connection_id"], m["channel"], m["incarnation"]) for m in metrics}:
        buckets = [m for m in metrics if (m["connection_id"], m["channel"], m["incarnation"]) == key]
        for events, now, peak in ((charts.unacked_events(view, key), "unacked", "unacked_max"),
                                  (charts.unconfirmed_events(view, key), "unconfirmed", "unconfirmed_max")):
            if events.num_rows == 0:
                assert all(not b[now] and not b[peak] for b in buckets), (key, now)
                continue
            line = charts.outstanding_series(view, key, events, columns=10 ** 9)  # exact, never reduced
            for b in buckets:
                assert line.value_at(b["as_of_ns"]) == b[now], (key, now, b["bucket_start_ns"])
                start, end = b["bucket_start_ns"], b["as_of_ns"]
                inside = line.values[(line.times_ns >= start) & (line.times_ns < end)]
                assert max([line.value_at(start)] + inside.tolist()) == b[peak], (key, peak, start)
                checked += 1
    assert checked >= 20, checked


def test_big_channels_are_drawn_from_channel_metrics(analysed_examples, monkeypatch, tmp_path):
    """Past MAX_EXACT_ROWS a channel's time charts come from channel_metrics' buckets instead of its
    timeline rows: the same peaks, the same lost and nacked publishes."""
    lake_dir, _ = analysed_examples
    view = read_lake(lake_dir)
    compared = 0
    for channel in view.channels:
        key = (channel["connection_id"], channel["channel"], channel["incarnation"])
        for exact, what in ((charts.unacked_source, "unacked"), (charts.unconfirmed_source, "unconfirmed")):
            from_rows, from_buckets = exact(view, key), charts._metrics_source(view, key, what)
            assert (from_rows is None) == (from_buckets is None), (key, what)
            if from_rows is None:
                continue
            assert from_buckets.line.peak == from_rows.line.peak, (key, what)
            assert ({k: int(n.sum()) for k, (_, n) in from_buckets.marks.items()}
                    == {k: int(n.sum()) for k, (_, n) in from_rows.marks.items()}), (key, what)
            compared += 1
    assert compared >= 10, compared
    monkeypatch.setattr(charts, "MAX_EXACT_ROWS", 0)
    out = str(tmp_path / "from-metrics.html")
    write_report(lake_dir, out)
    html = open(out, encoding="utf-8").read()
    assert "unacked (peak per 10 s bucket, channel_metrics)" in html
    assert "unconfirmed (peak per 10 s bucket, channel_metrics)" in html


def test_reduced_series_keep_every_peak():
    rng = np.random.default_rng(7)
    starts = np.sort(rng.integers(0, 10 ** 12, 200_000))
    settles = starts + rng.integers(1, 10 ** 8, len(starts))
    settles[::1000] = -1  # never settled
    spike_at = starts[123_456]
    starts = np.append(starts, np.full(5_000, spike_at))  # 5,000 at one instant, settled 1 ns later
    settles = np.append(settles, np.full(5_000, spike_at + 1))
    exact = series.outstanding(starts, settles, 10 ** 12, columns=10 ** 9)
    reduced = series.outstanding(starts, settles, 10 ** 12)
    assert reduced.peak_per_column and len(reduced.values) == series.COLUMNS
    assert reduced.peak == exact.peak >= 5_000
    assert exact.values[-1] == 200  # the never-settled ones, at the end
    edges = list(reduced.times_ns) + [reduced.end_ns]
    for column, (start, end) in enumerate(zip(edges, edges[1:])):
        inside = exact.values[(exact.times_ns >= start) & (exact.times_ns < end)]
        assert reduced.values[column] == max([exact.value_at(start + 1) if start < exact.times_ns[0] else
                                              exact.values[np.searchsorted(exact.times_ns, start, "right") - 1]]
                                             + inside.tolist()), column


# -- hostile names, empty and partial lakes ----------------------------------------------------

HOSTILE = '<script>alert("x")</script>'
HOSTILE_ATTR = '"><img src=x onerror=alert(1)>'


def _table(table_schema: pa.Schema, timestamps: dict, date_from: str, **columns) -> pa.Table:
    """Rows of a table's schema from the given columns, other columns null, timestamps derived."""
    n = len(next(iter(columns.values())))
    arrays = {}
    for f in table_schema:
        if f.name in columns:
            arrays[f.name] = pa.array(columns[f.name], f.type)
    for name, source in timestamps.items():
        arrays[name] = pc.divide(arrays[source], 1000).cast(pa.timestamp("us", tz="UTC"))
    arrays["date"] = pc.divide(arrays[date_from], 1000).cast(pa.timestamp("us", tz="UTC")) \
        .cast(pa.date32()).cast(pa.string())
    return pa.Table.from_arrays([arrays.get(f.name, pa.nulls(n, f.type)) for f in table_schema],
                                schema=table_schema)


def _write(lake_dir: str, name: str, table_schema: pa.Schema, table: pa.Table) -> None:
    writer = lake.TableWriter(lake_dir, name, table_schema)
    writer.write(table)
    writer.commit(f"test-{name}")


T0 = 1_795_292_831_000_000_000


def test_hostile_names_are_escaped(tmp_path):
    lake_dir = str(tmp_path / "lake")
    connection_id = "10.0.0.1:5000>10.0.0.2:5672@1"
    _write(lake_dir, "connections", schema.CONNECTIONS, _table(
        schema.CONNECTIONS, schema.CONNECTION_TIMESTAMPS, schema.CONNECTION_DATE_FROM,
        connection_id=[connection_id], first_ts_ns=[T0], last_ts_ns=[T0 + 10 ** 9], protocol=["amqp-0-9-1"],
        client_addr=["10.0.0.1"], client_port=[5000], server_addr=["10.0.0.2"], server_port=[5672],
        started_at_syn=[True], connection_name=[HOSTILE], client_product=[HOSTILE_ATTR], user=[HOSTILE],
        vhost=[HOSTILE_ATTR], ended_by=["connection.close"], closed_by=["broker"], close_code=[320],
        close_text=[HOSTILE], server_product=[HOSTILE]))
    evidence = json.dumps({"seqs": [1, 2], "tags": [5, 6], "message_identities": [HOSTILE, HOSTILE_ATTR],
                           "source_packets": [10, 11], "reason": HOSTILE, "queues": [HOSTILE_ATTR]})
    _write(lake_dir, "findings", schema.FINDINGS, _table(
        schema.FINDINGS, schema.FINDING_TIMESTAMPS, schema.FINDING_DATE_FROM,
        finding_id=["f1", "f2"], kind=["requeue_loop", HOSTILE], severity=["warning", "critical"],
        connection_id=[connection_id] * 2, connection_name=[HOSTILE] * 2, client=[HOSTILE_ATTR] * 2,
        server=["10.0.0.2:5672"] * 2, channel=[1, 1], incarnation=[1, 1], first_ts_ns=[T0, T0],
        last_ts_ns=[T0 + 5, T0 + 5], count=[25, 1], message_identity=[HOSTILE, None],
        summary=[HOSTILE, HOSTILE_ATTR], evidence=[evidence, "not json " + HOSTILE], source=[f"/tmp/{HOSTILE}.pcap"] * 2))
    # The looping message's deliveries, so its picture (lanes, tooltips) carries the names too.
    _write(lake_dir, "deliveries", schema.DELIVERIES, _table(
        schema.DELIVERIES, schema.DELIVERY_TIMESTAMPS, schema.DELIVERY_DATE_FROM,
        connection_id=[connection_id] * 3, channel=[1] * 3, incarnation=[1] * 3, seq=[1, 2, 3],
        ts_ns=[T0, T0 + 10, T0 + 20], delivery_tag=[1, 2, 3], consumer_tag=[HOSTILE_ATTR] * 3, queue=[HOSTILE] * 3,
        message_identity=[HOSTILE] * 3, no_ack=[False] * 3, outcome=["nack", "nack", "ack"],
        requeue=[True, True, None], settle_ts_ns=[T0 + 5, T0 + 15, T0 + 25], settle_latency_ns=[5, 5, 5]))
    _write(lake_dir, "channels", CHANNELS, _table(
        CHANNELS, {"open_ts": "open_ts_ns", "end_ts": "end_ts_ns"}, "open_ts_ns",
        connection_id=[connection_id], channel=[1], incarnation=[1], open_ts_ns=[T0], end_ts_ns=[T0 + 30],
        deliveries=[3], publishes=[0]))
    out = str(tmp_path / "report.html")
    write_report(lake_dir, out)
    html = open(out, encoding="utf-8").read()
    assert escape(f"Deliveries of message {HOSTILE}") in html  # the pictures were drawn
    assert escape(f"consumer {HOSTILE_ATTR}") in html
    for raw in (HOSTILE, HOSTILE_ATTR, "<img", "<script>alert"):
        assert raw not in html, raw
    assert escape(HOSTILE) in html and escape(HOSTILE_ATTR) in html
    # Partial lake: findings without the timeline tables still make a page.
    assert html.count('<article class="finding') == 2
    with Browser() as browser:
        browser.open(out)
        assert browser.problems == []
        assert browser.evaluate("document.scripts.length") == 1
        assert browser.evaluate("document.images.length") == 0
        assert browser.evaluate("document.querySelectorAll('[onerror]').length") == 0


def test_a_finding_whose_connection_has_no_row_is_named_by_the_ends_its_id_names(tmp_path):
    """The analysis ran while the connection was open (the agent writes its row when it ends)."""
    lake_dir = str(tmp_path / "lake")
    _write(lake_dir, "findings", schema.FINDINGS, _table(
        schema.FINDINGS, schema.FINDING_TIMESTAMPS, schema.FINDING_DATE_FROM, finding_id=["f1"],
        kind=["lost_confirm"], severity=["critical"], connection_id=["10.0.0.1:5000>10.0.0.2:5672@1"],
        channel=[1], incarnation=[1], first_ts_ns=[T0], last_ts_ns=[T0 + 5], count=[3], summary=["lost"]))
    out = str(tmp_path / "report.html")
    write_report(lake_dir, out)
    html = open(out, encoding="utf-8").read()
    assert escape("10.0.0.1:5000 → 10.0.0.2:5672") in html and "? → ?" not in html and "None" not in html


def test_empty_and_unanalysed_lakes(tmp_path, capsys):
    out = str(tmp_path / "r.html")
    assert main(["report", "--lake", str(tmp_path / "missing"), "-o", out]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert not os.path.exists(out)

    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["report", "--lake", str(empty), "-o", str(tmp_path)]) == 2  # a folder: cannot be written
    assert "cannot write" in capsys.readouterr().err
    assert not [name for name in os.listdir(tmp_path.parent) if ".partial-" in name]
    assert main(["report", "--lake", str(empty), "-o", out]) == 0
    html = open(out, encoding="utf-8").read()
    assert "This lake holds no tables yet." in html and 'id="findings"' not in html

    from analyzer.ingest import ingest_file
    ingested = str(tmp_path / "ingested")
    assert not ingest_file(os.path.join(ROOT, "examples", "heartbeats.pcapng"), ingested).errors
    assert main(["report", "--lake", ingested, "-o", out]) == 0
    html = open(out, encoding="utf-8").read()
    assert "has not been analysed yet" in html and 'id="connections"' in html and 'id="findings"' not in html
    assert "lab-heartbeats-idle" in html


# -- size bounds on a lake of millions of rows -------------------------------------------------

def test_report_of_millions_of_rows_stays_small(tmp_path):
    """One consumer channel with 1.5 M deliveries and one publisher channel with 1.5 M publishes,
    2,000 connections and 1,000 findings: the page stays far below a few MB."""
    lake_dir = str(tmp_path / "big")
    n = 1_500_000
    rng = np.random.default_rng(1)
    ts = T0 + np.cumsum(rng.integers(1_000, 200_000, n))
    settle = ts + rng.integers(10_000, 50_000_000, n)
    consumer, publisher = "c:1>b:5672@1", "p:2>b:5672@2"
    _write(lake_dir, "deliveries", schema.DELIVERIES, _table(
        schema.DELIVERIES, schema.DELIVERY_TIMESTAMPS, schema.DELIVERY_DATE_FROM,
        connection_id=[consumer] * n, channel=np.ones(n, np.int32),
        incarnation=np.ones(n, np.int32), seq=np.arange(n), ts_ns=ts, delivery_tag=np.arange(1, n + 1),
        no_ack=np.zeros(n, bool), consumer_prefetch=np.full(n, 250, np.int32), outcome=["ack"] * n,
        settle_ts_ns=settle, settle_latency_ns=settle - ts, message_identity=[f"id:{i % 1000}" for i in range(n)]))
    _write(lake_dir, "publishes", schema.PUBLISHES, _table(
        schema.PUBLISHES, schema.PUBLISH_TIMESTAMPS, schema.PUBLISH_DATE_FROM,
        connection_id=[publisher] * n, channel=np.ones(n, np.int32), incarnation=np.ones(n, np.int32),
        seq=np.arange(n), ts_ns=ts, mode=["confirm"] * n, outcome=["acked"] * (n - 10) + ["lost"] * 10,
        confirm_seq=np.arange(1, n + 1), out_of_order_by=rng.integers(0, 3, n), settle_ts_ns=settle,
        settle_latency_ns=settle - ts))
    _write(lake_dir, "channels", CHANNELS, _table(
        CHANNELS, {"open_ts": "open_ts_ns", "end_ts": "end_ts_ns"}, "open_ts_ns",
        connection_id=[consumer, publisher], channel=[1, 1], incarnation=[1, 1], open_ts_ns=[T0, T0],
        end_ts_ns=[int(settle.max())] * 2, deliveries=[n, 0], publishes=[0, n]))
    connections = 2_000
    _write(lake_dir, "connections", schema.CONNECTIONS, _table(
        schema.CONNECTIONS, schema.CONNECTION_TIMESTAMPS, schema.CONNECTION_DATE_FROM,
        connection_id=[consumer, publisher] + [f"x:{i}>b:5672@{i}" for i in range(connections - 2)],
        first_ts_ns=[T0] * connections, last_ts_ns=[int(settle.max())] * connections,
        protocol=["amqp-0-9-1"] * connections, connection_name=[f"app-{i}" for i in range(connections)]))
    findings = 1_000
    _write(lake_dir, "findings", schema.FINDINGS, _table(
        schema.FINDINGS, schema.FINDING_TIMESTAMPS, schema.FINDING_DATE_FROM,
        finding_id=[f"f{i}" for i in range(findings)], kind=["requeue_loop"] * findings,
        severity=["warning"] * findings, connection_id=[consumer] * findings, channel=[1] * findings,
        incarnation=[1] * findings, first_ts_ns=[T0] * findings, last_ts_ns=[T0 + 1] * findings,
        count=[1500] * findings, message_identity=[f"id:{i}" for i in range(findings)],
        summary=["loop"] * findings, evidence=[json.dumps({"tags": list(range(20))})] * findings))
    out = str(tmp_path / "big.html")
    started = time.monotonic()
    size = write_report(lake_dir, out)
    seconds = time.monotonic() - started
    html = open(out, encoding="utf-8").read()
    assert size < 3_000_000, size
    assert html.count('<article class="finding') == 200 and "800 more findings not shown" in html
    assert "1,700 more connections not listed" in html
    assert "peak per pixel" in html  # the unacked and unconfirmed series were reduced
    assert "The first 200 of its 1,500 deliveries are drawn." in html
    assert "1,499,990 confirms" in html and "1,500,000 acks" in html  # 10 publishes were lost
    print(f"report of {2 * n:,} timeline rows: {size / 1e6:.2f} MB in {seconds:.1f} s")
    if os.environ.get("ACKSCOPE_SCREENSHOTS"):
        import shutil
        shutil.copy(out, os.path.join(os.environ["ACKSCOPE_SCREENSHOTS"], "big.html"))


# -- in a real browser ---------------------------------------------------------------------------

def test_report_in_headless_chromium(examples_report, tmp_path):
    out, _ = examples_report
    shots = os.environ.get("ACKSCOPE_SCREENSHOTS", str(tmp_path))
    with Browser(width=1280, height=1000) as browser:
        browser.open(out)
        assert browser.problems == [], browser.problems
        assert browser.requests == [f"file://{os.path.abspath(out)}"], browser.requests  # nothing else fetched
        height = browser.evaluate("document.documentElement.scrollHeight")
        assert height > 3000
        # The script's niceties work: the severity filter hides what is unchecked.
        shown = "document.querySelectorAll('article.finding:not(.hidden)').length"
        total = browser.evaluate(shown)
        infos = browser.evaluate("document.querySelectorAll('article.sev-info').length")
        browser.evaluate("var b = document.querySelector('.sev-filter[value=info]'); b.click();")
        assert browser.evaluate(shown) == total - infos and infos > 0
        browser.evaluate("document.querySelector('.sev-filter[value=info]').click()")
        for name, selector in (("top", None), ("pictures", "#pictures"), ("connections", "#connections")):
            y = 0 if selector is None else int(browser.evaluate(
                f"document.querySelector('{selector}').getBoundingClientRect().top + window.scrollY"))
            path = os.path.join(shots, f"report-{name}.png")
            browser.screenshot(path, y, min(1400, height - y))
            with open(path, "rb") as png:
                head = png.read(24)
            assert head[:8] == b"\x89PNG\r\n\x1a\n"
            assert struct.unpack(">II", head[16:24]) == (1280, min(1400, height - y))
        assert browser.problems == [], browser.problems
