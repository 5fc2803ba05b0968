"""The lake on S3-compatible object storage (a local moto server): the agent's sink, `ingest`,
`summary`, `findings`, `push` and `report` through delta-rs and pyarrow, configured only by the AWS_* environment variables that
delta-rs reads. Each test compares what the object store holds with the same work on a local folder.
`analyze` on S3: tests/test_analyze_object_storage.py, which reuses these fixtures."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from analyzer import cli, lake, push, schema
from analyzer.agent.sink import LakeSink, app_id_of
from analyzer.report.lake_view import read_lake
from analyzer.report.page import render_page

from .conftest import ROOT
from .prometheus_stack import free_port, pushgateway, pushgateway_series
from .test_push import analysed_lake

GENERATED_NS = 1_800_000_000 * 10**9
SAMPLE = os.path.join(ROOT, "analyzer", "samples", "lost_confirms.pcapng")


@dataclass(frozen=True)
class S3Server:
    url: str
    log: Path  # one line per request, with its status

    def refused_commits(self, bucket: str) -> int:
        """Commits to a Delta log in this bucket that the server refused because the version existed
        (HTTP 412 to a conditional PUT of _delta_log/NNN.json)."""
        name = bucket.removeprefix("s3a://")
        return len(re.findall(rf'PUT /{re.escape(name)}/\S*/_delta_log/\d+\.json[^"]*"\s+412', self.log.read_text()))


@pytest.fixture(scope="module")
def s3_server(tmp_path_factory):
    """moto's S3 server on a loopback port."""
    moto = shutil.which("moto_server", path=os.path.dirname(sys.executable))
    assert moto, "moto_server is not installed: pip install -e '.[test]' (moto[server])"
    port = free_port()
    log_path = tmp_path_factory.mktemp("moto") / "moto.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen([moto, "-H", "127.0.0.1", "-p", str(port)], stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(url + "/moto-api/", timeout=1).read()
                break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"moto_server did not start: {log_path.read_text()[-2000:]}")
                time.sleep(0.1)
        yield S3Server(url, log_path)
    finally:
        process.terminate()
        process.wait(timeout=10)


@pytest.fixture
def s3_env(s3_server, monkeypatch):
    """The environment a pod gets from docs/deployment.md's Secret and ConfigMap."""
    env = {"AWS_ENDPOINT_URL": s3_server.url, "AWS_ACCESS_KEY_ID": "ackscope", "AWS_SECRET_ACCESS_KEY": "secret",
           "AWS_REGION": "us-east-1", "AWS_ALLOW_HTTP": "true"}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return env


@pytest.fixture
def bucket(s3_env, request):
    """A fresh bucket per test: its s3a:// URL, the spelling Spark's s3a connector and delta-rs share."""
    import boto3

    name = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower())[:50].strip("-")
    boto3.client("s3").create_bucket(Bucket=name)
    return f"s3a://{name}"


def frames(rows: int, agent: str, first: int = 0) -> pa.Table:
    return pa.Table.from_pylist([{"date": "2026-11-25", "connection_id": f"{agent}-c", "seq": first + i,
                                  "method": "basic.publish"} for i in range(rows)], schema=schema.FRAMES)


def sorted_rows(table: pa.Table) -> list[dict]:
    return sorted(table.to_pylist(), key=lambda r: (r["connection_id"], r.get("seq", 0)))


def test_the_agents_sink_commits_continues_its_sequence_and_compacts_on_s3(bucket):
    lake_url = f"{bucket}/lake"
    sink = LakeSink(lake_url, "pod-a")
    for flush in range(3):
        sink.add("frames", frames(5, "pod-a", first=5 * flush))
        assert sink.flush({"flush": flush}), sink.last_error
    held = lake.read_table(lake_url, "frames", schema.FRAMES)
    assert sorted_rows(held) == sorted_rows(frames(15, "pod-a"))
    table = DeltaTable(f"{lake_url}/frames")
    assert table.transaction_version(app_id_of("pod-a")) == 3

    restarted = LakeSink(lake_url, "pod-a")  # a restarted agent continues the sequence from the lake
    assert restarted.tables["frames"].sequence == 4
    sink.compact()
    assert sink.compactions == 1
    assert DeltaTable(f"{lake_url}/frames").get_add_actions(flatten=True).num_rows == 1
    assert sorted_rows(lake.read_table(lake_url, "frames", schema.FRAMES)) == sorted_rows(held)


def test_agents_appending_at_once_lose_and_duplicate_nothing(bucket, s3_server):
    """Concurrent commits to one table, started together: delta-rs writes each log entry with a
    conditional PUT (If-None-Match), so of two commits of one version the server refuses the second
    (HTTP 412) and delta-rs commits it as the next version; a commit that fails anyway is retried by
    the sink at its next flush, as the sink's thread does."""
    lake_url = f"{bucket}/lake"
    sinks = [LakeSink(lake_url, f"pod-{k}") for k in range(3)]
    together = threading.Barrier(len(sinks))

    def agent(sink: LakeSink) -> None:
        for flush in range(4):
            sink.add("frames", frames(10, sink.agent_id, first=10 * flush))
            together.wait(timeout=60)
            for _ in range(20):
                if sink.flush():
                    break
            else:
                raise AssertionError(sink.last_error)

    threads = [threading.Thread(target=agent, args=(sink,)) for sink in sinks]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert all(sink.flushes["ok"] == 4 for sink in sinks), [(s.flushes, s.last_error) for s in sinks]
    held = sorted_rows(lake.read_table(lake_url, "frames", schema.FRAMES))
    assert held == sorted_rows(pa.concat_tables([frames(40, s.agent_id) for s in sinks]))
    table = DeltaTable(f"{lake_url}/frames")
    assert [table.transaction_version(app_id_of(s.agent_id)) for s in sinks] == [4, 4, 4]
    assert s3_server.refused_commits(bucket) > 0  # the races happened, and the store settled them


def test_ingest_to_s3_writes_the_tables_a_local_ingest_writes(bucket, s3_env, tmp_path, capsys):
    local = str(tmp_path / "lake")
    for target in (local, f"{bucket}/lake"):
        run = subprocess.run([os.path.join(os.path.dirname(sys.executable), "ackscope"), "ingest", SAMPLE,
                              "--lake", target, "--json"], capture_output=True, text=True,
                             env={**os.environ, **s3_env}, timeout=120)
        assert run.returncode == 0, run.stderr
    for name, table_schema in (("frames", schema.FRAMES), ("connections", schema.CONNECTIONS)):
        remote = lake.read_table(f"{bucket}/lake", name, table_schema)
        assert remote.num_rows > 0
        assert sorted_rows(remote) == sorted_rows(lake.read_table(local, name, table_schema))
    assert lake.is_dir(f"{bucket}/lake/frames") and not lake.is_dir(f"{bucket}/elsewhere")
    summaries = []
    for target in (local, f"{bucket}/lake"):
        assert cli.main(["summary", "--lake", target, "--json"]) == 0
        summary = json.loads(capsys.readouterr().out)
        assert summary.pop("lake") == target
        summaries.append(summary)
    assert summaries[0] == summaries[1] and summaries[0]["rows_by_method"]["basic.publish"] == 45


def test_push_and_report_read_an_analysed_lake_on_s3(bucket, tmp_path, capsys):
    local = analysed_lake(str(tmp_path / "lake"))
    remote = analysed_lake(f"{bucket}/lake")

    def families(lake_dir):
        return [(f.name, f.type, sorted((s.name, sorted(s.labels.items()), s.value) for s in f.samples))
                for f in push.analysis_families(lake_dir).families]

    assert families(remote) == families(local)
    assert any(name == "ackscope_findings" and samples for name, _, samples in families(remote))

    pages = {name: render_page(read_lake(lake_dir), GENERATED_NS).replace(lake_dir, "LAKE")
             for name, lake_dir in (("local", local), ("remote", remote))}
    assert "lost_confirm" in pages["remote"]
    assert pages["remote"] == pages["local"]

    (tmp_path / "pushgateway").mkdir()
    with pushgateway(str(tmp_path / "pushgateway")) as url:
        assert cli.main(["push", "--lake", remote, "--pushgateway", url, "--job", "s3"]) == 0
        pushed = [s for s in pushgateway_series(url) if s["name"] == "ackscope_findings"]
    assert {s["labels"]["lake"] for s in pushed} == {remote}
    capsys.readouterr()
    listed = []
    for lake_dir in (local, remote):
        assert cli.main(["findings", "--lake", lake_dir, "--json"]) == 0
        listed.append(capsys.readouterr().out)
    assert listed[0] == listed[1] and "lost_confirm" in listed[0]
    out = str(tmp_path / "report.html")
    assert cli.main(["report", "--lake", remote, "-o", out]) == 0 and "lost_confirm" in open(out).read()
    assert sum(s["value"] for s in pushed) == 4


def test_a_missing_lake_on_s3_is_refused_by_name(bucket, capsys):
    assert cli.main(["push", "--lake", f"{bucket}/nothing-here", "--pushgateway", "http://127.0.0.1:9"]) == 2
    assert f"no lake at {bucket}/nothing-here" in capsys.readouterr().err

