"""`ackscope analyze` on a lake given by URL: the whole analysis on a file:// lake (the URI code path,
real Spark) against the same lake by folder path; against moto's S3 server, the driver's side of the
delta-rs bridge (`changes_between`, `committed`, the s3a:// files a read hands Spark), the s3a settings Spark's Hadoop gets from the
AWS_* environment, and the clear error when Spark has no s3a connector.

What is not tested here: Spark's own s3a reads and writes, which need the hadoop-aws JAR and the
AWS SDK bundle from Maven Central, out of these machines' reach (docs/deployment.md)."""

from __future__ import annotations

import glob
import os
import subprocess
import sys
import uuid

import pyarrow as pa
from deltalake import DeltaTable, QueryBuilder

from analyzer import lake, schema
from analyzer.ingest import ingest_file
from spark_jobs.analyze import OUTPUT_TABLES, analyze
from spark_jobs.session import AWS_SDK_V2_CLIENT, S3A_FILESYSTEM, hadoop_version, s3a_settings, use_lake
from spark_jobs.table_files import changes_between, commit, files_to_read

from .conftest import ROOT
from .test_object_storage import SAMPLE, bucket, s3_env, s3_server  # noqa: F401 - the moto fixtures, reused

EXAMPLES = sorted(glob.glob(os.path.join(ROOT, "examples", "*.pcapng")))
SORT_KEYS = ("finding_id", "connection_id", "channel", "incarnation", "seq", "bucket_start_ns", "kind")
ACKSCOPE = os.path.join(os.path.dirname(sys.executable), "ackscope")


def _tables(lake_dir: str) -> dict[str, list]:
    out = {}
    for name, table_schema in OUTPUT_TABLES.items():
        table = lake.read_table(lake_dir, name, table_schema)
        out[name] = table.sort_by([(k, "ascending") for k in SORT_KEYS if k in table.column_names]).to_pylist()
    return out


def test_analyze_on_a_file_uri_lake_writes_the_tables_of_the_same_lake_by_path(spark, tmp_path):
    """Two runs (the first full, the second on the frames appended since) on one lake named by folder
    path and on another named by file:// URI: every output table equal after each run."""
    by_path, by_uri = str(tmp_path / "by-path"), (tmp_path / "by-uri").as_uri()
    assert by_uri.startswith("file:///")
    batches = [EXAMPLES[:3], EXAMPLES[3:6]]
    for number, captures in enumerate(batches):
        reports = []
        for lake_dir in (by_path, by_uri):
            for capture in captures:
                assert not ingest_file(capture, lake_dir).errors
            reports.append(analyze(spark, lake_dir))
        assert [r.scope for r in reports] == (["full"] * 2 if number == 0 else ["new_data"] * 2)
        assert reports[0].connections == reports[1].connections > 0
        assert reports[0].rows == reports[1].rows
        assert _tables(by_path) == _tables(by_uri)
    assert any(_tables(by_uri)["findings"])
    # The URI lake's files are where the folder's would be: Spark wrote under the URI's path.
    assert os.path.isdir(tmp_path / "by-uri" / "deliveries" / "_delta_log")


def _written(location: str, rows: list[dict]) -> tuple[pa.Table, list]:
    """Rows written into the table's `date=` folders (analyzer.lake.TableWriter), not committed:
    the rows and the files' add actions."""
    lake_url, name = location.rsplit("/", 1)
    writer = lake.TableWriter(lake_url, name, schema.FRAMES)
    table = pa.Table.from_pylist(rows, schema=schema.FRAMES)
    writer.write(table)
    return table, writer.actions


def _frame_rows(first: int, n: int, day: str) -> list[dict]:
    return [{"date": day, "connection_id": "c1", "seq": first + i, "method": "basic.publish"} for i in range(n)]


def test_the_bridge_driver_commits_and_lists_files_on_s3(bucket):  # noqa: F811
    lake_url = f"{bucket}/lake"
    location = f"{lake_url}/frames"
    written, adds = _written(location, _frame_rows(0, 5, "2026-11-24") + _frame_rows(5, 3, "2026-11-25"))
    assert sorted(a.path.split("/")[0] for a in adds) == ["date=2026-11-24", "date=2026-11-25"]
    commit(location, schema.FRAMES, adds, ["date"])

    # deltalake reads the rows (its own object-store reader, not pyarrow's).
    table = DeltaTable(location)
    held = pa.table(QueryBuilder().register("frames", table).execute("SELECT date, seq FROM frames ORDER BY seq")
                    .read_all())
    assert held.to_pylist() == written.select(["date", "seq"]).sort_by("seq").to_pylist()
    assert sorted(lake.read_table(lake_url, "frames", schema.FRAMES)["seq"].to_pylist()) == list(range(8))
    fs, _ = lake.filesystem(location)

    # What a read hands Spark: the s3a:// URIs of exactly the snapshot's files, below the table's base.
    snapshot = files_to_read(table, location, None, None)
    assert snapshot.base == location and len(snapshot.files) == 2
    for uri in snapshot.files:
        assert uri.startswith(f"{location}/date=")
        assert fs.get_file_info(uri.removeprefix("s3a://")).size > 0
    assert [f.split("/")[-2] for f in files_to_read(table, location, "2026-11-25", None).files] == ["date=2026-11-25"]

    # changes_between reads the commits from S3: an append.
    first = table.version()
    writer = lake.TableWriter(lake_url, "frames", schema.FRAMES)
    writer.write(pa.Table.from_pylist(_frame_rows(8, 2, "2026-11-25"), schema=schema.FRAMES))
    writer.commit("run-2")
    changes = changes_between(lake_url, "frames", first, DeltaTable(location).version())
    assert changes.added == (f"{location}/{writer.actions[0].path}",) and changes.removed == ()
    assert lake.committed(lake_url, "frames", "run-2") and not lake.committed(lake_url, "frames", "run-3")

    # Through the s3a spelling and the s3 one alike.
    assert changes_between(lake_url.replace("s3a://", "s3://"), "frames", first, first + 1) == changes


def test_changes_between_compares_snapshots_when_a_commit_is_gone_on_s3(bucket):  # noqa: F811
    lake_url = f"{bucket}/lake"
    location = f"{lake_url}/frames"
    added = []
    for run in range(2):
        added += _written(location, _frame_rows(10 * run, 2, "2026-11-25"))[1]
        commit(location, schema.FRAMES, added[-1:], ["date"])
    # A log cleaned up after a checkpoint: commit 1 is gone, version 2 loads from the checkpoint.
    DeltaTable(location).create_checkpoint()
    fs, root = lake.filesystem(location)
    fs.delete_file(f"{root}/_delta_log/{1:020d}.json")
    changes = changes_between(lake_url, "frames", 0, 2)
    assert changes.added == tuple(sorted(f"{location}/{a.path}" for a in added)) and changes.removed == ()


def test_the_hadoop_s3a_settings_come_from_the_environment_delta_rs_reads(spark):
    environ = {"AWS_ENDPOINT_URL": "http://127.0.0.1:9000", "AWS_REGION": "eu-west-3",
               "AWS_ACCESS_KEY_ID": "AKIDEXAMPLE", "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI-not-a-secret",
               "AWS_ALLOW_HTTP": "true"}
    settings = s3a_settings(environ)
    assert settings == {
        "fs.s3a.endpoint": "http://127.0.0.1:9000", "fs.s3a.connection.ssl.enabled": "false",
        "fs.s3a.path.style.access": "true", "fs.s3a.endpoint.region": "eu-west-3",
        "fs.s3a.access.key": "AKIDEXAMPLE", "fs.s3a.secret.key": "wJalrXUtnFEMI-not-a-secret",
        "fs.s3a.aws.credentials.provider": "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider"}
    with_token = s3a_settings({**environ, "AWS_SESSION_TOKEN": "FwoGZXIv-token"})
    assert with_token["fs.s3a.session.token"] == "FwoGZXIv-token"
    assert with_token["fs.s3a.aws.credentials.provider"] == "org.apache.hadoop.fs.s3a.TemporaryAWSCredentialsProvider"
    # AWS itself, virtual-hosted, credentials from the instance role or IRSA: s3a's own chain.
    assert s3a_settings({"AWS_REGION": "us-east-1", "AWS_VIRTUAL_HOSTED_STYLE_REQUEST": "true"}) == {
        "fs.s3a.path.style.access": "false", "fs.s3a.endpoint.region": "us-east-1"}
    assert s3a_settings({"AWS_ENDPOINT_URL": "https://minio.example:9000"})["fs.s3a.connection.ssl.enabled"] == "true"
    # A lake that is not on S3 leaves the session's Hadoop configuration alone.
    hadoop = spark.sparkContext._jsc.hadoopConfiguration()
    use_lake(spark, "/tmp/a-lake")
    use_lake(spark, "file:///tmp/a-lake")
    assert hadoop.get("fs.s3a.endpoint") is None


def test_analyze_on_s3_without_hadoop_aws_fails_at_once_naming_what_is_missing(
        bucket, s3_env, monkeypatch, tmp_path, spark):  # noqa: F811
    """Real Spark (no hadoop-aws here), a real frames table in a moto bucket: exit 2 with one line,
    no stack trace, no step run; no credential in stdout, stderr or Spark's log."""
    secret, key = "SeCrEt-" + uuid.uuid4().hex, "AKID" + uuid.uuid4().hex[:16].upper()
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", key)
    monkeypatch.setenv("AWS_SESSION_TOKEN", "token-" + uuid.uuid4().hex)
    lake_url = f"{bucket}/lake"
    assert not ingest_file(SAMPLE, lake_url).errors
    spark_log = tmp_path / "spark.log"
    # Left to Spark (--local-up-to 0): on a lake this small the local executor, which needs no connector, runs.
    run = subprocess.run([ACKSCOPE, "analyze", "--lake", lake_url, "--master", "local[1]", "--local-up-to", "0",
                          "--json"],
                         capture_output=True, text=True, timeout=300,
                         env={**os.environ, "ACKSCOPE_SPARK_LOG": str(spark_log)})
    assert run.returncode == 2, run.stderr[-3000:]
    ours = [line for line in run.stderr.splitlines() if line.startswith("ackscope analyze")]
    assert len(ours) == 1, run.stderr
    message = ours[0]
    hadoop = hadoop_version(spark)
    assert f"{lake_url} is on S3" in message and "hadoop-aws JAR and the AWS SDK bundle" in message
    assert S3A_FILESYSTEM in message and AWS_SDK_V2_CLIENT in message
    assert f"--packages org.apache.hadoop:hadoop-aws:{hadoop}" in message and "jars" in message
    assert "Traceback" not in run.stderr and "Exception" not in run.stderr and run.stdout == ""
    assert not lake.is_dir(f"{lake_url}/analysis_runs")  # no step ran
    logged = spark_log.read_text() if spark_log.exists() else ""
    for credential in (secret, key, os.environ["AWS_SESSION_TOKEN"]):
        assert credential not in run.stdout + run.stderr + logged


def test_pyspark_ships_the_hadoop_version_the_docs_name(spark):
    """docs/deployment.md names the hadoop-aws version to add; it must be this pyspark's Hadoop."""
    hadoop = hadoop_version(spark)
    jars = os.listdir(os.path.join(os.path.dirname(__import__("pyspark").__file__), "jars"))
    assert f"hadoop-client-api-{hadoop}.jar" in jars
    docs = open(os.path.join(ROOT, "docs", "deployment.md")).read()
    assert f"org.apache.hadoop:hadoop-aws:{hadoop}" in docs
