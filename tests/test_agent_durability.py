"""The agent's Delta micro-batches: SIGTERM flushes, SIGKILL loses at most a flush interval and a
restart adds no duplicates, a retried flush adds nothing, a full disk is survived and recovered
from, and several agents append to one lake at once."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter

import pyarrow as pa
import pytest

from analyzer import lake, schema
from analyzer.agent.sink import LakeSink, app_id_of
from tests.agent_support import AgentProcess, lake_frames, publish_confirmed, rows_of, wait_for

pytestmark = pytest.mark.rabbitmq


def test_sigterm_flushes_and_commits_before_exit(tmp_path):
    lake_dir = str(tmp_path / "lake")
    with AgentProcess(lake_dir, agent_id="term", flush_interval=3600) as agent:
        publish_confirmed("agent-test-sigterm", 40)
        time.sleep(0.5)
        assert lake.open_table(lake_dir, "frames") is None  # nothing flushed yet: the interval is an hour
        report = agent.stop()
    assert report["flushes"] == {"ok": 1}
    methods = Counter(r["method"] for r in rows_of(lake_dir, "agent-test-sigterm"))
    assert methods["basic.publish"] == 40 and methods["basic.ack"] == 40
    assert lake.open_table(lake_dir, "frames").transaction_version(app_id_of("term")) == 1


def test_sigkill_then_restart_keeps_the_tables_valid_and_adds_no_duplicates(tmp_path):
    lake_dir = str(tmp_path / "lake")
    with AgentProcess(lake_dir, agent_id="killed", flush_interval=0.3) as agent:
        publish_confirmed("agent-test-before-kill", 30)
        assert wait_for(lambda: len(rows_of(lake_dir, "agent-test-before-kill")) > 60, timeout=30)
        open_connection = publish_confirmed("agent-test-across-kill", 10, close=False)
        time.sleep(0.5)
        agent.stop(signal.SIGKILL)
    before = lake.open_table(lake_dir, "frames").transaction_version(app_id_of("killed"))
    with AgentProcess(lake_dir, agent_id="killed", flush_interval=0.3) as agent:
        open_connection.close()  # seen by the new agent mid-stream
        publish_confirmed("agent-test-after-kill", 20)
        agent.stop()
    table = lake.open_table(lake_dir, "frames")
    assert table.transaction_version(app_id_of("killed")) > before  # the sequence went on from the lake's
    frames = lake_frames(lake_dir, ["connection_id", "seq"])
    keys = list(zip(frames["connection_id"].to_pylist(), frames["seq"].to_pylist()))
    assert len(keys) == len(set(keys))
    assert Counter(r["method"] for r in rows_of(lake_dir, "agent-test-before-kill"))["basic.publish"] == 30
    assert Counter(r["method"] for r in rows_of(lake_dir, "agent-test-after-kill"))["basic.publish"] == 20


def _rows(n: int, connection_id: str = "c") -> pa.Table:
    from analyzer.ingest import connections_table
    return connections_table([{"connection_id": f"{connection_id}{i}", "first_ts_ns": 10**18 + i, "last_ts_ns": 10**18,
                               "protocol": "amqp-0-9-1"} for i in range(n)])


def test_a_flush_retried_after_its_commit_landed_adds_nothing(tmp_path):
    lake_dir = str(tmp_path / "lake")
    sink = LakeSink(lake_dir, "retry")
    batch = _rows(5)
    sink.add("connections", batch)
    assert sink.flush()
    # As after a commit that landed but whose call raised (a timeout, say): the same rows in flight,
    # the same sequence, the outcome unknown.
    table = sink.tables["connections"]
    table.sequence -= 1
    table.inflight, table.uncertain = [batch], True
    sink.add("connections", _rows(2, "d"))
    assert sink.flush()
    ids = lake.read_table(lake_dir, "connections", schema.CONNECTIONS)["connection_id"].to_pylist()
    assert sorted(ids) == sorted([f"c{i}" for i in range(5)] + ["d0", "d1"])
    # A new sink (a restart) continues the lake's sequence.
    assert LakeSink(lake_dir, "retry").tables["connections"].sequence == 3


@pytest.fixture
def small_disk(tmp_path):
    """A real filesystem that can be filled: a 4 MiB tmpfs (the tests run as root, for the capture)."""
    mount_point = tmp_path / "disk"
    mount_point.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount_point)], check=True)
    yield mount_point
    subprocess.run(["umount", "-l", str(mount_point)], check=True)


def _fill(directory) -> str:
    filler = os.path.join(directory, "filler")
    subprocess.run(["dd", "if=/dev/zero", f"of={filler}", "bs=64k"], capture_output=True)  # until ENOSPC
    return filler


def _usage(directory) -> str:
    """The disk's use and the lake's files, for the message of a wait that ran out."""
    files = sorted(os.path.relpath(os.path.join(folder, name), directory)
                   for folder, _, names in os.walk(directory) for name in names)
    return f"{shutil.disk_usage(directory)}, files: {files}"


def test_a_full_disk_keeps_capture_going_with_bounded_memory_and_writes_resume(small_disk):
    lake_dir = str(small_disk / "lake")
    # Relayed: 150 rows are fewer than other tests' traffic on the broker can make in a flush interval.
    with AgentProcess(lake_dir, agent_id="full", flush_interval=0.3, extra=("--max-buffered-rows", "150"),
                      relayed=True) as agent:
        publish_confirmed("agent-test-first", 5, port=agent.broker_port)
        # Both tables exist before the disk fills.
        assert wait_for(lambda: len(rows_of(lake_dir, "agent-test-first")) > 0), agent.describe()
        filler = _fill(small_disk)
        publish_confirmed("agent-test-while-full", 200, port=agent.broker_port)  # ~400 rows: more than the buffer keeps
        assert wait_for(lambda: agent.value("ackscope_agent_flushes_total", outcome="error") >= 2), agent.describe()
        assert wait_for(lambda: agent.value("ackscope_agent_rows_dropped_total", table="frames") > 0), agent.describe()
        assert agent.value("ackscope_agent_buffered_rows") <= 150
        # Capture went on.
        assert agent.value("ackscope_agent_frames_total", method="basic.publish") == 205, agent.describe()
        os.remove(filler)
        errors = agent.value("ackscope_agent_flushes_total", outcome="error")
        ok = agent.value("ackscope_agent_flushes_total", outcome="ok")
        publish_confirmed("agent-test-after", 10, port=agent.broker_port)
        assert wait_for(lambda: len(rows_of(lake_dir, "agent-test-after")) > 0), (agent.describe(), _usage(small_disk))
        # Counted just after the commit the rows came with: wait for it too.
        assert wait_for(lambda: agent.value("ackscope_agent_flushes_total", outcome="ok") > ok), agent.describe()
        assert agent.status("/readyz") == 200
        report = agent.stop()
    assert report["rows_dropped"]["frames"] > 0
    kept = Counter(r["method"] for r in rows_of(lake_dir, "agent-test-while-full"))["basic.publish"]
    assert kept < 200  # the oldest rows went, counted, rather than memory growing
    assert errors >= 2


def test_several_agents_append_to_one_new_lake_at_once(tmp_path):
    lake_dir = str(tmp_path / "lake")
    agents = [AgentProcess(lake_dir, agent_id=f"fleet-{n}", flush_interval=0.2) for n in range(3)]
    for agent in agents:
        agent.start()
    try:
        publish_confirmed("agent-test-fleet", 25)
        reports = [agent.stop() for agent in agents]
    finally:
        for agent in agents:
            agent.__exit__()
    for n, report in enumerate(reports):
        assert set(report["flushes"]) == {"ok"}, report["flushes"]
        methods = Counter(r["method"] for r in rows_of(lake_dir, "agent-test-fleet", agent_id=f"fleet-{n}"))
        assert methods["basic.publish"] == 25 and methods["basic.ack"] == 25
    frames = lake_frames(lake_dir, ["connection_id", "agent_id", "seq"])
    keys = list(zip(*(frames[c].to_pylist() for c in ("connection_id", "agent_id", "seq"))))
    assert len(keys) == len(set(keys))


def test_a_lake_unreadable_at_start_is_read_before_the_first_commit_not_guessed(tmp_path):
    """A restart while the lake cannot be read (a corrupt or unreachable log) must not start the
    sequence at 1: a later retry would take the lake's older commits for this flush's and drop it."""
    lake_dir = str(tmp_path / "lake")
    first = LakeSink(lake_dir, "restart")
    for batch in ("a", "b"):
        first.add("connections", _rows(2, batch))
        assert first.flush()
    log_file = os.path.join(lake_dir, "connections", "_delta_log", "00000000000000000001.json")
    intact = open(log_file).read()
    with open(log_file, "w") as out:
        out.write("not a delta log entry\n")
    restarted = LakeSink(lake_dir, "restart")
    assert restarted.tables["connections"].sequence is None  # unknown, not 1
    restarted.add("connections", _rows(3, "c"))
    assert not restarted.flush()
    assert restarted.tables["connections"].rows() == 3  # kept for the next flush
    with open(log_file, "w") as out:
        out.write(intact)
    assert restarted.flush()
    assert lake.open_table(lake_dir, "connections").transaction_version(app_id_of("restart")) == 3
    ids = lake.read_table(lake_dir, "connections", schema.CONNECTIONS)["connection_id"].to_pylist()
    assert sorted(ids) == ["a0", "a1", "b0", "b1", "c0", "c1", "c2"]


def _parquet_files(table_dir: str) -> set[str]:
    return {os.path.relpath(os.path.join(folder, name), table_dir) for folder, _, names in os.walk(table_dir)
            if "_delta_log" not in folder for name in names if name.endswith(".parquet")}


def test_compaction_removes_the_files_the_table_stopped_referencing_after_the_retention(tmp_path):
    """Issue 62: a sidecar's volume keeps the files the table references and, for the retention, those a
    compaction replaced (readers of older versions still read them); past it they go."""
    for retention_hours, replaced_kept in ((1, True), (0, False)):
        lake_dir = str(tmp_path / f"lake-{retention_hours}")
        sink = LakeSink(lake_dir, "vacuum", retention_hours=retention_hours)
        for n in range(4):
            sink.add("connections", _rows(3, f"b{n}"))
            assert sink.flush()
        table_dir = os.path.join(lake_dir, "connections")
        written = _parquet_files(table_dir)
        sink.compact()
        referenced = set(lake.table_files(lake.open_table(lake_dir, "connections")))
        assert len(referenced) == 1 and not referenced & written  # four small files merged into one
        assert _parquet_files(table_dir) == (referenced | written if replaced_kept else referenced)
        assert len(lake.read_table(lake_dir, "connections", schema.CONNECTIONS)) == 12


def test_capture_refuses_a_retention_below_the_floor(tmp_path):
    result = subprocess.run([sys.executable, "-m", "analyzer.cli", "capture", "--iface", "lo",
                             "--lake", str(tmp_path / "lake"), "--retention-hours", "0.5"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert "--retention-hours 0.5 is below the floor of 1 h" in result.stderr
    assert not os.path.exists(tmp_path / "lake")
