"""spark_jobs/compaction.py on a real Delta table (delta-rs, no Spark): which files it merges, that
the rows and their flags' statistics stay as they were, and what its commit says. That runs with it
end as one run over everything is tests/test_incremental.py's `appended_many`."""

import json
import os

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from analyzer.lake import TableWriter
from analyzer.schema import PARTITION_BY
from spark_jobs import compaction
from spark_jobs.table_files import commit

SCHEMA = pa.schema([("date", pa.string()), ("provisional", pa.bool_()), ("requeue_related", pa.bool_()),
                    ("seq", pa.int64())])


def _commit_files(lake_dir: str, rows_per_file: list[list[dict]]) -> None:
    """One commit a file, as the runs add them."""
    for rows in rows_per_file:
        writer = TableWriter(lake_dir, "deliveries", SCHEMA, split_by=("provisional", "requeue_related"))
        writer.write(pa.Table.from_pylist(rows, schema=SCHEMA))
        commit(os.path.join(lake_dir, "deliveries"), SCHEMA, writer.actions, PARTITION_BY, tag="run-1")


def _row(seq: int, date: str = "2026-11-24", provisional: bool = False, requeue: bool = False) -> dict:
    return {"date": date, "provisional": provisional, "requeue_related": requeue, "seq": seq}


def _files(lake_dir: str) -> list[dict]:
    return pa.table(DeltaTable(os.path.join(lake_dir, "deliveries")).get_add_actions(flatten=True)).to_pylist()


def test_final_files_are_merged_by_partition_and_flag_and_provisional_ones_are_left(tmp_path, monkeypatch):
    monkeypatch.setattr(compaction, "FILES_TO_MERGE", 3)
    lake_dir = str(tmp_path)
    _commit_files(lake_dir, [[_row(s)] for s in range(0, 4)]                                  # 4 final
                  + [[_row(s, requeue=True)] for s in range(10, 13)]                         # 3 final, requeue
                  + [[_row(s, provisional=True)] for s in range(20, 24)]                     # 4 provisional
                  + [[_row(s, date="2026-11-25")] for s in range(30, 32)])                   # 2 final, next day
    before = _files(lake_dir)
    rows_before = sorted(DeltaTable(os.path.join(lake_dir, "deliveries")).to_pyarrow_table().to_pylist(),
                         key=lambda r: r["seq"])
    groups = compaction.small_final_files(lake_dir, "deliveries")
    assert sorted(len(paths) for _, paths in groups.groups) == [3, 4]  # the next day's two are too few; provisional ones never
    assert compaction.compact(lake_dir, "deliveries", groups, "run-2") == 7
    table = DeltaTable(os.path.join(lake_dir, "deliveries"))
    after = _files(lake_dir)
    assert len(after) == len(before) - 7 + 2
    rows_after = sorted(table.to_pyarrow_table().to_pylist(), key=lambda r: r["seq"])
    assert rows_after == rows_before
    kept = {f["path"] for f in before if f["max.provisional"] or f["partition.date"] == "2026-11-25"}
    assert kept <= {f["path"] for f in after}
    # Every file still holds one value of each flag, which its statistics say (reads skip by them).
    for file in after:
        for flag in ("provisional", "requeue_related"):
            assert file[f"min.{flag}"] == file[f"max.{flag}"] is not None
    merged = sorted((f["max.requeue_related"], f["num_records"]) for f in after if f["path"] not in kept)
    assert merged == [(False, 4), (True, 3)]
    # One commit, that changes no row, tagged with the run that made it.
    last = table.history(1)[0]
    assert last["userMetadata"] == "run-2"
    log = os.path.join(lake_dir, "deliveries", "_delta_log", f"{table.version():020d}.json")
    actions = [json.loads(line) for line in open(log) if line.strip()]
    changes = [a.get("add") or a.get("remove") for a in actions if "add" in a or "remove" in a]
    assert len(changes) == 9 and not any(change["dataChange"] for change in changes)
    assert compaction.small_final_files(lake_dir, "deliveries").groups == []
    # The log is checkpointed at the compaction; the merged files stay on disk for the retention.
    assert os.path.exists(os.path.join(lake_dir, "deliveries", "_delta_log",
                                       f"{table.version():020d}.checkpoint.parquet"))
    removed = [os.path.join(lake_dir, "deliveries", c["path"]) for c in changes if c not in
               [a["add"] for a in actions if "add" in a]]
    assert len(removed) == 7 and all(os.path.exists(path) for path in removed)


def test_a_reader_of_the_snapshot_before_a_compaction_reads_its_files(tmp_path, monkeypatch):
    """A run's driver picks files in one snapshot and reads them while the compaction beside it
    commits (findings.stored_candidates): read at that version, the files it picked hold their rows."""
    from analyzer.lake import open_table, read_table
    from spark_jobs.table_files import files_that_may_hold

    monkeypatch.setattr(compaction, "FILES_TO_MERGE", 3)
    lake_dir = str(tmp_path)
    _commit_files(lake_dir, [[_row(s, requeue=True)] for s in range(10, 13)] + [[_row(s)] for s in range(0, 3)])
    table = open_table(lake_dir, "deliveries")
    picked, version = files_that_may_hold(table, "requeue_related"), table.version()
    assert len(picked) == 3
    assert compaction.compact(lake_dir, "deliveries", compaction.small_final_files(lake_dir, "deliveries"), "r") == 6

    def seqs(**at) -> list[int]:
        return sorted(read_table(lake_dir, "deliveries", SCHEMA, files=picked, **at)["seq"].to_pylist())

    assert seqs(version=version) == [10, 11, 12]
    assert seqs() == []   # the current snapshot holds none of those files


def test_files_removed_longer_ago_than_the_retention_are_deleted(tmp_path, monkeypatch):
    monkeypatch.setattr(compaction, "FILES_TO_MERGE", 3)
    monkeypatch.setattr(compaction, "VACUUM_RETENTION_HOURS", 0)
    lake_dir = str(tmp_path)
    _commit_files(lake_dir, [[_row(s)] for s in range(3)])
    before = {os.path.join(lake_dir, "deliveries", f["path"]) for f in _files(lake_dir)}
    compaction.compact(lake_dir, "deliveries", compaction.small_final_files(lake_dir, "deliveries"), "run-2")
    assert not any(os.path.exists(path) for path in before)
    table = DeltaTable(os.path.join(lake_dir, "deliveries"))
    assert sorted(table.to_pyarrow_table()["seq"].to_pylist()) == [0, 1, 2]


def test_a_big_group_is_merged_into_files_of_a_bounded_size(tmp_path, monkeypatch):
    monkeypatch.setattr(compaction, "FILES_TO_MERGE", 3)
    lake_dir = str(tmp_path)
    _commit_files(lake_dir, [[_row(s)] for s in range(7)])
    size = max(f["size_bytes"] for f in _files(lake_dir))
    monkeypatch.setattr(compaction, "MERGED_FILE_BYTES", 3 * size)
    groups = compaction.small_final_files(lake_dir, "deliveries")
    assert [len(paths) for _, paths in groups.groups] == [3, 3]  # and the seventh file, alone, stays as it is
    compaction.compact(lake_dir, "deliveries", groups, "run-2")
    assert sorted(f["num_records"] for f in _files(lake_dir)) == [1, 3, 3]


@pytest.mark.parametrize("flag_stats", ["none", "mixed"])
def test_files_whose_flags_are_not_known_to_be_one_value_are_left(tmp_path, monkeypatch, flag_stats):
    monkeypatch.setattr(compaction, "FILES_TO_MERGE", 2)
    lake_dir = str(tmp_path)
    path = os.path.join(lake_dir, "deliveries")
    for s in range(3):
        if flag_stats == "mixed":  # delta-rs's own writer keeps statistics but not the flags apart
            write_deltalake(path, pa.Table.from_pylist([_row(s), _row(s + 100, provisional=True)], schema=SCHEMA),
                            mode="append", partition_by=PARTITION_BY)
        else:  # a writer that kept no statistics of the flags
            writer = TableWriter(lake_dir, "deliveries", SCHEMA)
            writer.write(pa.Table.from_pylist([_row(s)], schema=SCHEMA))
            commit(path, SCHEMA, writer.actions, PARTITION_BY)
    files = _files(lake_dir)
    assert len(files) == 3
    if flag_stats == "none":
        assert all(f.get("min.provisional") is None for f in files)
    else:
        assert all((f["min.provisional"], f["max.provisional"]) == (False, True) for f in files)
    assert compaction.small_final_files(lake_dir, "deliveries").groups == []


def test_a_table_without_flags_is_merged_by_partition(tmp_path, monkeypatch):
    """findings and analysis_runs keep no flag: every file of theirs is final, grouped by day."""
    monkeypatch.setattr(compaction, "FILES_TO_MERGE", 3)
    lake_dir = str(tmp_path)
    plain = pa.schema([("date", pa.string()), ("seq", pa.int64())])
    for seq, date in [(0, "2026-11-24"), (1, "2026-11-24"), (2, "2026-11-24"), (3, "2026-11-25")]:
        writer = TableWriter(lake_dir, "findings", plain)
        writer.write(pa.Table.from_pylist([{"date": date, "seq": seq}], schema=plain))
        commit(os.path.join(lake_dir, "findings"), plain, writer.actions, PARTITION_BY, tag="run-1")
    found = compaction.small_final_files(lake_dir, "findings")
    assert [len(paths) for _, paths in found.groups] == [3]
    assert compaction.compact(lake_dir, "findings", found, "run-2") == 3
    table = DeltaTable(os.path.join(lake_dir, "findings"))
    assert sorted(f["num_records"] for f in pa.table(table.get_add_actions(flatten=True)).to_pylist()) == [1, 3]
    assert sorted(table.to_pyarrow_table()["seq"].to_pylist()) == [0, 1, 2, 3]


def _agent_lake(lake_dir: str, flushes: range) -> None:
    """An agent's small files: a frames file and a connections file per flush, a commit each."""
    from analyzer.agent.sink import LakeSink
    from analyzer.ingest import connections_table
    from tests.test_agent_compaction import _frames
    sink = LakeSink(lake_dir, "agent")
    for n in flushes:
        sink.add("frames", _frames(100, n * 100, "2026-12-06"))
        sink.add("connections", connections_table([{"connection_id": f"c-{n}", "first_ts_ns": n, "last_ts_ns": n + 1,
                                                    "protocol": "amqp-0-9-1", "connection_name": f"app-{n}"}]))
        assert sink.flush(), sink.last_error


def test_after_a_run_the_frames_it_analysed_are_merged_and_the_next_run_stays_scoped(tmp_path):
    """merge_analysed_input with the agent's compaction: the frames files of the analysed snapshot
    become one file, those committed since are left (so the next run's changes are just them:
    no file counts as removed, which would make it a full run), and connections' small files merge."""
    from analyzer import lake, schema
    from spark_jobs.table_files import changes_between
    lake_dir = str(tmp_path / "lake")
    _agent_lake(lake_dir, range(5))
    analysed_version = lake.open_table(lake_dir, "frames").version()
    analysed = set(lake.table_files(lake.open_table(lake_dir, "frames")))
    _agent_lake(lake_dir, range(5, 8))                   # committed while the run went on: not analysed
    later = set(lake.table_files(lake.open_table(lake_dir, "frames"))) - analysed
    rows = {name: lake.read_table(lake_dir, name, table_schema).sort_by("connection_id" if name == "connections"
                                                                         else "seq")
            for name, table_schema in (("frames", schema.FRAMES), ("connections", schema.CONNECTIONS))}
    merged = compaction.merge_analysed_input(lake_dir, analysed_version, "run-1")
    assert merged == {"frames": 5, "connections": 8}
    files = set(lake.table_files(lake.open_table(lake_dir, "frames")))
    assert later < files and len(files - later) == 1 and not files & analysed
    assert len(lake.table_files(lake.open_table(lake_dir, "connections"))) == 1
    for name, table_schema in (("frames", schema.FRAMES), ("connections", schema.CONNECTIONS)):
        assert lake.read_table(lake_dir, name, table_schema).sort_by(
            "connection_id" if name == "connections" else "seq") == rows[name]
    changes = changes_between(lake_dir, "frames", analysed_version, lake.open_table(lake_dir, "frames").version())
    assert changes.removed == () and {path.rsplit("/frames/", 1)[1] for path in changes.added} == later
    assert any(commit.get("ackscope.run_id") == "run-1" and commit.get("ackscope.operation") == "compaction"
               for commit in lake.open_table(lake_dir, "frames").history())
    # Nothing left that the run analysed: a second call merges nothing.
    assert compaction.merge_analysed_input(lake_dir, analysed_version, "run-1") == {}
