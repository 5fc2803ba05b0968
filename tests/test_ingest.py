"""`ackscope ingest` end to end: real Delta tables written by delta-rs and read back, idempotency, exit codes."""

import json
import os
import shutil
import subprocess
import sys

import pytest
from deltalake import DeltaTable

from analyzer import lake, schema
from analyzer.ingest import decode, fingerprint

from .conftest import ROOT
from .test_capture_files import traffic
from .wire import PASSWORD, write_pcap

ACKSCOPE = [sys.executable, "-m", "analyzer.cli"]


def ackscope(*args):
    return subprocess.run(ACKSCOPE + list(args), capture_output=True, text=True)


SCHEMAS = {"frames": schema.FRAMES, "connections": schema.CONNECTIONS}


def read(lake_dir, name):
    return lake.read_table(str(lake_dir), name, SCHEMAS[name])


def test_ingest_writes_partitioned_delta_tables_and_reports_json(tmp_path, corpus_dir):
    capture = os.path.join(corpus_dir, "deepflow/amqp-error.pcap")
    result = ackscope("ingest", capture, "--lake", str(tmp_path), "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    for key in ("packets", "flows", "frames_by_method", "gaps", "unsupported_flows", "errors"):
        assert key in report
    assert report["packets"] == 87 and report["flows"] == 4 and report["errors"] == []
    assert report["frames_by_method"]["connection.start-ok"] == 4
    frames = read(tmp_path, "frames")
    assert frames.schema.equals(schema.FRAMES)
    assert frames.num_rows == report["rows"]
    assert DeltaTable(os.path.join(tmp_path, "frames")).metadata().partition_columns == ["date"]
    assert set(frames["date"].to_pylist()) == {"2025-12-23"}
    methods = frames["method"].to_pylist()
    assert methods.count("basic.return") == 1 and methods.count("exchange.declare") == 3
    connections = read(tmp_path, "connections")
    assert connections.num_rows == 4 and connections.schema.equals(schema.CONNECTIONS)


def test_ingesting_the_same_file_twice_adds_nothing(tmp_path, corpus_dir):
    capture = os.path.join(corpus_dir, "nDPI/amqp.pcap")
    first = ackscope("ingest", capture, "--lake", str(tmp_path), "--json")
    copy = str(tmp_path / "same-bytes-other-name.pcap")
    shutil.copy(capture, copy)
    second = ackscope("ingest", capture, copy, "--lake", str(tmp_path), "--json")
    assert first.returncode == second.returncode == 0
    assert [f["skipped"] for f in json.loads(second.stdout)["files"]] == [True, True]
    assert read(tmp_path, "frames").num_rows == json.loads(first.stdout)["rows"] > 0
    assert read(tmp_path, "connections").num_rows == 3
    assert DeltaTable(os.path.join(tmp_path, "frames")).version() == 1  # create + one append


def test_a_run_cut_short_between_the_two_commits_is_completed_without_duplicates(tmp_path, corpus_dir):
    capture = os.path.join(corpus_dir, "deepflow/amqp1.pcap")
    frames = lake.TableWriter(str(tmp_path), "frames", schema.FRAMES)
    decode(capture, frames.write)
    frames.commit(f"ackscope-ingest-{fingerprint(capture)}")  # the crash came before connections
    rows_before = read(tmp_path, "frames").num_rows
    result = ackscope("ingest", capture, "--lake", str(tmp_path), "--json")
    assert result.returncode == 0
    assert read(tmp_path, "frames").num_rows == rows_before
    assert read(tmp_path, "connections").num_rows == 4


def test_a_truncated_file_commits_what_came_before_and_exits_3(tmp_path, corpus_dir):
    capture = os.path.join(corpus_dir, "negative-controls/Go-RabbitMQ-Streams/rabbitmq_sub.pcap")
    amqp = str(tmp_path / "amqp-truncated.pcap")
    write_pcap(amqp, traffic()[:-3])  # ends with the broker's basic.ack, without the TCP close
    with open(amqp, "rb") as f:
        data = f.read()
    with open(amqp, "wb") as f:
        f.write(data[:-10])
    result = ackscope("ingest", capture, amqp, "--lake", str(tmp_path / "lake"), "--json")
    assert result.returncode == 3
    report = json.loads(result.stdout)
    assert [f["damaged"] for f in report["files"]] == [True, True]
    assert f"{amqp}: packet " in result.stderr and "truncated" in result.stderr
    frames = read(tmp_path / "lake", "frames")
    assert frames.num_rows == report["rows"] > 0
    assert "basic.ack" not in frames["method"].to_pylist()  # the ack was in the cut-off packet
    assert "basic.publish" in frames["method"].to_pylist()


def test_a_file_that_is_not_a_capture_exits_4_and_adds_nothing(tmp_path):
    bogus = tmp_path / "notes.txt"
    bogus.write_text("not a capture")
    result = ackscope("ingest", str(bogus), "--lake", str(tmp_path / "lake"))
    assert result.returncode == 4
    assert "not a pcap or pcapng file" in result.stderr and str(bogus) in result.stderr
    assert lake.open_table(str(tmp_path / "lake"), "frames") is None


def test_the_password_never_reaches_the_table_files(tmp_path):
    capture = str(tmp_path / "login.pcap")
    write_pcap(capture, traffic())
    with open(capture, "rb") as f:
        assert PASSWORD.encode() in f.read()  # the capture itself does hold it
    result = ackscope("ingest", capture, "--lake", str(tmp_path / "lake"))
    assert result.returncode == 0, result.stderr
    assert PASSWORD not in result.stdout + result.stderr
    for folder, _, files in os.walk(tmp_path / "lake"):
        for name in files:
            with open(os.path.join(folder, name), "rb") as f:
                assert PASSWORD.encode() not in f.read(), name
    assert read(tmp_path / "lake", "connections")["user"].to_pylist() == ["guest"]


def test_summary_reads_the_lake_back(tmp_path, corpus_dir):
    ackscope("ingest", os.path.join(corpus_dir, "tomhjx-netcat/rabbit.pcap"), "--lake", str(tmp_path))
    result = ackscope("summary", "--lake", str(tmp_path), "--json")
    summary = json.loads(result.stdout)
    assert summary["rows_by_method"]["heartbeat"] == 63
    assert summary["connections"][0]["client_product"].startswith("RabbitMQ")
    human = ackscope("summary", "--lake", str(tmp_path)).stdout
    assert "heartbeat" in human and "1 connection(s)" in human


def test_help_texts_name_every_command():
    result = ackscope("--help")
    assert result.returncode == 0
    for command in ("ingest", "summary", "demo"):
        assert command in result.stdout
    ingest_help = ackscope("ingest", "--help").stdout
    assert "--lake" in ingest_help and "Exit status" in ingest_help


def test_the_command_line_parser_loads_neither_arrow_nor_delta_rs():
    """Every command pays for what its parser imports: `ackscope --help` must not load ~100 MB of
    libraries, and the agent sets their allocators before they load (cli.choose_agent_allocators)."""
    probe = ("import sys; from analyzer.cli import build_parser; build_parser(); "
             "print(sorted(m for m in ('pyarrow', 'deltalake', 'pyspark', 'numpy') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def test_workers_produce_the_same_tables_in_one_commit(tmp_path, corpus_dir):
    captures = [os.path.join(corpus_dir, name) for name in ("deepflow/amqp-error.pcap", "nDPI/amqp.pcap")]
    results = {}
    for workers in (1, 2):
        lake_dir = str(tmp_path / f"w{workers}")
        result = ackscope("ingest", *captures, "--lake", lake_dir, "--workers", str(workers), "--json")
        assert result.returncode == 0, result.stderr
        report = json.loads(result.stdout)
        frames = read(lake_dir, "frames").drop_columns(["source"]).sort_by([("connection_id", "ascending"),
                                                                             ("seq", "ascending")])
        connections = read(lake_dir, "connections").sort_by("connection_id")
        results[workers] = (report["frames_by_method"], report["flows"], frames, connections)
        assert DeltaTable(os.path.join(lake_dir, "frames")).version() == 1  # create + one commit for the capture
    one, two = results[1], results[2]
    assert one[0] == two[0] and one[1] == two[1] == 7
    assert one[2].equals(two[2])
    assert one[3].equals(two[3])


def test_data_files_leave_partition_values_to_the_delta_log(tmp_path, corpus_dir):
    import pyarrow.parquet as pq

    ackscope("ingest", os.path.join(corpus_dir, "deepflow/amqp1.pcap"), "--lake", str(tmp_path))
    for name in ("frames", "connections"):
        table = DeltaTable(os.path.join(tmp_path, name))
        for uri in table.file_uris():
            assert "date" not in pq.read_schema(uri).names
            assert "/date=" in uri


def test_data_files_dictionary_encode_only_the_strings_that_repeat(tmp_path):
    """lake.dictionary_columns: a dictionary for connection ids, methods, queues...; none for the
    numbers (mostly unique) or the message ids (unique)."""
    import pyarrow.parquet as pq

    assert not ackscope("ingest", os.path.join(ROOT, "examples", "requeue_loop.pcapng"), "--lake",
                        str(tmp_path)).returncode
    checked = set()
    for uri in DeltaTable(os.path.join(tmp_path, "frames")).file_uris():
        meta = pq.ParquetFile(uri).metadata
        for i in range(meta.num_columns):
            column = meta.row_group(0).column(i)
            dictionary = column.dictionary_page_offset is not None
            string = column.physical_type == "BYTE_ARRAY"
            assert dictionary == (string and column.path_in_schema not in lake.UNIQUE_STRINGS), column.path_in_schema
            checked.add((column.path_in_schema, dictionary))
    assert {("method", True), ("seq", False), ("message_id", False)} <= checked


def test_demo_runs_the_bundled_sample_and_exits_cleanly(tmp_path):
    lake_dir = tmp_path / "demo"
    result = ackscope("demo", "--lake", str(lake_dir))
    assert result.returncode == 0, result.stderr
    assert "basic.publish 45" in result.stdout  # what it ingested
    assert "findings: lost_confirm 2" in result.stdout  # what the analysis found
    assert "lab-lost_confirms-tcp-cut" in result.stdout and "ended (tcp.rst)" in result.stdout
    for _ in range(2):  # reading Delta tables once left threads that aborted the interpreter at exit
        summary = ackscope("summary", "--lake", str(lake_dir))
        assert summary.returncode == 0, summary.stderr
        assert "ended by tcp.rst" in summary.stdout


def test_progress_bar_shows_how_far_into_the_file(tmp_path, capsys, corpus_dir):
    from analyzer.capture_file import read_packets
    from analyzer.ingest import _Progress

    path = os.path.join(corpus_dir, "nDPI/amqp.pcap")
    progress = _Progress(path)
    packet_bytes = sum(len(data) for *_, data in read_packets(path))
    progress(160, packet_bytes)  # every packet of the file read
    progress.done()
    line = capsys.readouterr().err.split("\r")[1]
    assert line.startswith("amqp.pcap [") and "160 packets" in line
    assert "100%" in line or " 99%" in line


def test_decode_gives_the_garbage_collector_back_even_when_writing_fails(tmp_path):
    """decode() pauses the cyclic GC while it runs; it must be on again afterwards, whatever happened."""
    import gc

    path = str(tmp_path / "traffic.pcap")
    write_pcap(path, traffic())
    assert gc.isenabled()
    decode(path, lambda batch: None)
    assert gc.isenabled()

    def failing_write(batch):
        raise OSError("disk full")

    with pytest.raises(OSError):
        decode(path, failing_write)
    assert gc.isenabled()
    decode(str(tmp_path / "missing.pcap"), lambda batch: None)  # unreadable: reported, not raised
    assert gc.isenabled()


def test_read_table_reads_a_column_its_files_lack_as_nulls(tmp_path):
    """A table read in today's schema (analyzer/lake.read_table) whose files were written before a
    column existed: that column reads as nulls, the others in today's types, as Spark reads them."""
    import pyarrow as pa
    import pyarrow.compute as pc

    before = pa.schema([("date", pa.string()), ("seq", pa.int32())])
    writer = lake.TableWriter(str(tmp_path), "t", before)
    writer.write(pa.table({"date": ["2026-12-05", "2026-12-05"], "seq": [1, 2]}, schema=before))
    writer.commit("one")
    now = pa.schema([("date", pa.string()), ("seq", pa.int64()), ("added", pa.string())])
    read = lake.read_table(str(tmp_path), "t", now, where=pc.field("seq") == 2)
    assert read.schema == now and read.to_pylist() == [{"date": "2026-12-05", "seq": 2, "added": None}]
    assert lake.read_table(str(tmp_path), "t", now, columns=["added"]).to_pylist() == [{"added": None}] * 2
