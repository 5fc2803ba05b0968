"""The findings step's reads and its rewrite in the driver, no Spark (spark_jobs/findings.py): the
scan of `frames` for evidence packets and of the deliveries for the changed rows, streamed and
pruned by statistics (analyzer.lake.scan), and the findings table patched by the driver whatever
its size (delta_io.rewrite). Real Delta tables: written by delta-rs with statistics in
the log, and by ackscope's own writers without (then each row group's own statistics prune)."""

import os
import random

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from deltalake import write_deltalake
from deltalake.transaction import AddAction

from analyzer import lake, schema
from analyzer.detectors import KINDS
from analyzer.detectors.messages import COLUMNS, candidates
from spark_jobs import delta_io, findings
from spark_jobs.delta_io import Listed, Match, Replacement, rewrite
from spark_jobs.evidence_packets import PACKETS
from spark_jobs.table_files import commit
from spark_jobs.timeline.tables import TIMELINE_TABLES

from .test_object_storage import bucket, s3_env, s3_server  # noqa: F401 - the moto fixtures, reused

DAY = "2026-03-14"
# Of one length: their order as strings (statistics') is their order here.
CONNECTIONS = [f"10.0.0.{n + 10}:{40000 + n}>10.0.0.1:5672@{n}" for n in range(12)]


def _frames(rows_per_connection: int = 300) -> pa.Table:
    """Frame rows of CONNECTIONS, each connection's seqs 1.., packets and sources set; ordered by
    connection, so files cut from it hold a few connections each."""
    rows = [{"date": DAY, "connection_id": connection_id, "seq": seq, "source_packet": 10_000 * n + seq,
             "source": f"capture-{n}.pcap", "ts_ns": 1_773_446_400_000_000_000 + seq}
            for n, connection_id in enumerate(CONNECTIONS) for seq in range(1, rows_per_connection + 1)]
    frames = pa.Table.from_pylist(rows, schema=pa.schema([schema.FRAMES.field(name) for name in
                                                           ["date", *PACKETS, "ts_ns"]]))
    return frames.cast(pa.schema([schema.FRAMES.field(name) for name in frames.column_names]))


def _with_log_stats(lake_dir: str, frames: pa.Table, files: int) -> None:
    """`frames` as a table of `files` files, written by delta-rs (its log keeps min and max)."""
    step = -(-frames.num_rows // files)
    for start in range(0, frames.num_rows, step):
        part = frames.slice(start, step)
        write_deltalake(os.path.join(lake_dir, "frames"), part, mode="append", partition_by=["date"])


def _without_log_stats(lake_dir: str, frames: pa.Table, row_group_rows: int) -> None:
    """`frames` as one file of row groups of `row_group_rows` rows, committed with no statistics
    but its row count in the log (as analyzer.lake.TableWriter commits the agent's files)."""
    location = os.path.join(lake_dir, "frames")
    relative = f"date={DAY}/part-0.parquet"
    os.makedirs(os.path.join(location, f"date={DAY}"))
    pq.write_table(frames.drop_columns(["date"]), os.path.join(location, relative), row_group_size=row_group_rows)
    add = AddAction(relative, os.path.getsize(os.path.join(location, relative)), {"date": DAY}, 0, True,
                    f'{{"numRecords": {frames.num_rows}}}')
    commit(location, frames.schema, [add], ["date"])


def _wanted(frames: pa.Table, connections: list[str], count: int, seed: int = 7) -> set[tuple[str, int]]:
    pairs = [(row["connection_id"], row["seq"]) for row in frames.select(["connection_id", "seq"]).to_pylist()
             if row["connection_id"] in connections]
    return set(random.Random(seed).sample(pairs, count))


def _truth(frames: pa.Table, wanted: set) -> dict:
    return {(row["connection_id"], row["seq"]): (row["source_packet"], row["source"])
            for row in frames.select(PACKETS).to_pylist() if (row["connection_id"], row["seq"]) in wanted}


def _rows_read(lake_dir: str, wanted: set) -> tuple[int, set[str]]:
    """What the scan for these frames reads: rows and files."""
    by_connection = {}
    for connection_id, seq in sorted(wanted):
        by_connection.setdefault(connection_id, []).append(seq)
    rows, files = 0, set()
    for path, batch in lake.scan(lake_dir, "frames", schema.FRAMES, PACKETS, bounded=("connection_id", "seq"),
                                 may_hold=findings._may_hold(by_connection)):
        rows += batch.num_rows
        files.add(path)
    return rows, files


def test_the_scan_for_packets_skips_files_by_the_logs_statistics_and_finds_every_packet(tmp_path):
    """Files whose logged connection_id and seq bounds hold no wanted frame are not opened; every
    wanted frame is found, with its packet and source, in batches of any size."""
    frames = _frames()
    lake_dir = str(tmp_path)
    _with_log_stats(lake_dir, frames, files=6)   # two connections a file
    wanted = _wanted(frames, CONNECTIONS[:3], 40)
    rows, files = _rows_read(lake_dir, wanted)
    table = lake.open_table(lake_dir, "frames")
    assert len(files) == 2 < len(lake.table_files(table)) == 6 and rows == 2 * 2 * 300
    for batch_rows in (None, 5):
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(lake, "SCAN_BATCH_ROWS", batch_rows or lake.SCAN_BATCH_ROWS)
            assert findings._scanned(lake_dir, table.version(), None, wanted) == _truth(frames, wanted)


def test_the_scan_for_packets_skips_row_groups_by_their_statistics_and_finds_every_packet(tmp_path):
    """A file committed without statistics (the agent's) is opened, and of it only the row groups
    whose own bounds may hold a wanted frame are read; a wanted seq beyond a connection's frames
    (none such) is not made up."""
    frames = _frames()
    lake_dir = str(tmp_path)
    _without_log_stats(lake_dir, frames, row_group_rows=100)   # 36 row groups, 3 a connection
    wanted = {(CONNECTIONS[4], seq) for seq in (150, 160, 170)} | {(CONNECTIONS[9], 299), (CONNECTIONS[9], 9_999)}
    rows, files = _rows_read(lake_dir, wanted)
    assert files == {f"date={DAY}/part-0.parquet"} and rows == 2 * 100
    assert findings._scanned(lake_dir, None, None, wanted) == _truth(frames, wanted)
    assert (CONNECTIONS[9], 9_999) not in findings._scanned(lake_dir, None, None, wanted)


def test_the_scan_for_packets_reads_the_days_from_its_first_on_and_the_runs_snapshot(tmp_path):
    """`since` leaves earlier days unread; the version is the run's snapshot, not a later append's."""
    frames = _frames(10)
    lake_dir = str(tmp_path)
    write_deltalake(os.path.join(lake_dir, "frames"), frames, partition_by=["date"])
    version = lake.open_table(lake_dir, "frames").version()
    later = frames.set_column(0, "date", pa.array(["2026-03-15"] * frames.num_rows, pa.string()).cast(
        frames.schema.field("date").type)).set_column(3, "source_packet", pa.array([-1] * frames.num_rows, pa.int64()))
    write_deltalake(os.path.join(lake_dir, "frames"), later, mode="append", partition_by=["date"])
    wanted = {(CONNECTIONS[0], 3), (CONNECTIONS[5], 7)}
    assert findings._scanned(lake_dir, version, None, wanted) == _truth(frames, wanted)
    assert findings._scanned(lake_dir, version, "2026-03-15", wanted) == {}
    assert {packet for packet, _ in findings._scanned(lake_dir, None, "2026-03-15", wanted).values()} == {-1}


def _deliveries(rows: int = 2_000, seed: int = 3) -> pa.Table:
    """Delivery rows over CONNECTIONS, some candidates (bounced, redelivered, left at a close)."""
    pick = random.Random(seed)
    out = []
    for n in range(rows):
        outcome = pick.choice(["ack", "ack", "ack", "nack", "reject", "channel_closed", "auto"])
        out.append({"date": DAY, "connection_id": CONNECTIONS[n * len(CONNECTIONS) // rows], "channel": 1,
                    "incarnation": 1, "seq": n, "ts_ns": n, "delivery_tag": n,
                    "message_identity": None if n % 17 == 0 else f"m{pick.randrange(300)}",
                    "redelivered": pick.random() < 0.1, "outcome": outcome,
                    "settle_ts_ns": n + 5 if outcome != "open" else None})
    deliveries = TIMELINE_TABLES["deliveries"]
    return pa.Table.from_pylist(out, schema=deliveries)


def test_the_changed_rows_of_connections_analysed_whole_are_what_the_message_kinds_read(tmp_path):
    """findings._of_connections: of those connections' delivery rows, streamed, the candidates
    (the one rule) and the rows of the messages named, and nothing of another connection."""
    deliveries = _deliveries()
    lake_dir = str(tmp_path)
    for start in range(0, deliveries.num_rows, 500):
        write_deltalake(os.path.join(lake_dir, "deliveries"), deliveries.slice(start, 500), mode="append",
                        partition_by=["date"])
    keys, among = (CONNECTIONS[2], CONNECTIONS[7]), {"m1", "m2", "m250"}
    version = lake.open_table(lake_dir, "deliveries").version()
    got = findings._of_connections(lake_dir, version, keys, among)
    ours = deliveries.filter(pc.is_in(deliveries["connection_id"], pa.array(keys)))
    expected = ours.filter(pc.or_(candidates(ours), pc.is_in(ours["message_identity"], pa.array(sorted(among)))))
    assert expected.num_rows > 0
    assert got.sort_by("seq").to_pylist() == expected.select(list(COLUMNS)).sort_by("seq").to_pylist()


def _findings(rows: int, seed: int, connections: list[str]) -> pa.Table:
    pick = random.Random(seed)
    out = [{"date": DAY, "finding_id": f"f{seed}-{n}", "kind": pick.choice(KINDS), "severity": "warning",
            "connection_id": connections[n % len(connections)], "channel": pick.randrange(4), "incarnation": 1,
            "message_identity": f"m{pick.randrange(50)}"} for n in range(rows)]
    return pa.Table.from_pylist(out, schema=schema.FINDINGS)


def _findings_lake(lake_dir: str) -> tuple[list[str], list, pa.Table]:
    """A findings table of seven files, six of two connections each and one of a requeue loop's
    finding; the files, and matches naming rows of three of them (connections 0 and 1, 2 and 3,
    and the loop's), and new rows."""
    writer = lake.TableWriter(lake_dir, "findings", schema.FINDINGS)
    for number in range(6):
        writer.write(_findings(200, number, CONNECTIONS[2 * number:2 * number + 2]))
    looping = _findings(1, 100, [CONNECTIONS[8]]).to_pylist()[0]
    writer.write(pa.Table.from_pylist([{**looping, "kind": "requeue_loop", "message_identity": "looping"}],
                                      schema=schema.FINDINGS))
    writer.commit("setup")
    matches = [Listed({"connection_id": (CONNECTIONS[0], CONNECTIONS[3]), "kind": KINDS}),
               Listed({"kind": ("requeue_loop",), "message_identity": ("looping",)}),
               Match(pa.table({"kind": ["redelivery_after_close"], "connection_id": [CONNECTIONS[1]], "channel": [2],
                               "incarnation": [1]}), ("kind", "connection_id", "channel", "incarnation"))]
    return sorted(lake.table_files(lake.open_table(lake_dir, "findings"))), matches, _findings(5, 99, CONNECTIONS)


@pytest.mark.parametrize("bound", ["whole", "searched"])
def test_the_driver_patches_a_findings_table_of_any_size(tmp_path, monkeypatch, bound):
    """delta_io.rewrite: the rows named by listed values and by keys deleted, new rows
    added, in one commit. Under the bound every file is rewritten; over it (here a bound of 0
    bytes) only the files holding a named row are (found by reading the columns matched), the
    others stay as they were; the rows are the same either way."""
    lake_dir = str(tmp_path)
    files, matches, new = _findings_lake(lake_dir)
    before = lake.read_table(lake_dir, "findings", schema.FINDINGS)
    holding = [path for path in files if _holds(lake_dir, path, matches)]
    assert len(holding) == 3 < len(files)
    if bound == "searched":
        monkeypatch.setattr(delta_io, "REWRITTEN_WHOLE_BYTES", 0)
    rewritten = rewrite(lake_dir, "findings", Replacement(new, schema.FINDINGS, matches))
    assert sorted(rewritten.removed) == (files if bound == "whole" else holding)
    rewritten.commit()
    after = lake.read_table(lake_dir, "findings", schema.FINDINGS)
    kept = before.filter(pc.invert(delta_io.doomed(before, matches)))
    assert kept.num_rows < before.num_rows
    key = [("finding_id", "ascending")]
    assert after.sort_by(key).to_pylist() == pa.concat_tables([kept, new]).sort_by(key).to_pylist()
    assert set(lake.table_files(lake.open_table(lake_dir, "findings"))) >= set(files) - set(rewritten.removed)


def test_the_findings_steps_reads_and_rewrite_on_s3_are_those_on_a_local_lake(
        bucket, tmp_path, monkeypatch):  # noqa: F811
    """The scan of `frames` (no statistics in the log: row groups pruned), the changed rows of
    connections analysed whole and a findings table patched by file on moto's S3, as on a folder."""
    monkeypatch.setattr(delta_io, "REWRITTEN_WHOLE_BYTES", 0)
    frames, deliveries = _frames(), _deliveries()
    wanted = _wanted(frames, CONNECTIONS[3:5], 30) | {(CONNECTIONS[11], 300)}
    keys, among = (CONNECTIONS[5],), {"m7"}
    seen = []
    for lake_dir in (f"{bucket}/lake", str(tmp_path)):
        for name, rows in (("frames", frames), ("deliveries", deliveries)):
            writer = lake.TableWriter(lake_dir, name, rows.schema)
            for start in range(0, rows.num_rows, 400):
                writer.write(rows.slice(start, 400))
            writer.commit("setup")
        files, matches, new = _findings_lake(lake_dir)
        rewritten = rewrite(lake_dir, "findings", Replacement(new, schema.FINDINGS, matches))
        rewritten.commit()
        seen.append((findings._scanned(lake_dir, None, None, wanted),
                     findings._of_connections(lake_dir, lake.open_table(lake_dir, "deliveries").version(), keys,
                                              among).sort_by("seq").to_pylist(),
                     len(rewritten.removed), len(files),
                     lake.read_table(lake_dir, "findings", schema.FINDINGS).sort_by("finding_id").to_pylist()))
    assert seen[0] == seen[1]
    assert seen[0][0] == _truth(frames, wanted) and seen[0][1] and seen[0][2] == 3 < seen[0][3]


def _holds(lake_dir: str, path: str, matches) -> bool:
    """Does this file of the findings table hold a row `matches` name?"""
    rows = lake.read_table(lake_dir, "findings", schema.FINDINGS, files={path})
    return bool(pc.any(delta_io.doomed(rows, matches)).as_py())
