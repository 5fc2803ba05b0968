"""Spark on the lake's Delta tables without the Delta JARs: real Spark, real tables written by the real agent.

The bridge (delta-rs resolves the snapshot, Spark reads its Parquet files) must give the tables
delta-spark would, with `analyzer.schema`'s types exactly; the driver's rewrites (delta_io.replace_all)
and the pass's file writers (wide_writes.py) leave the rows they should, one commit per table.
"""

import glob
import json
import os
import time

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake
from hypothesis import given, settings
from hypothesis import strategies as st
from pyspark.sql import functions as F
from pyspark.sql import types as T

from analyzer import lake, schema
from analyzer.ingest import ingest_file
from analyzer.lake import TableWriter
from spark_jobs.delta_io import read_delta
from spark_jobs.session import NativeDeltaUnavailable, delta_mode
from spark_jobs.table_files import commit
from spark_jobs.types import spark_schema

from .conftest import ROOT

TABLES = {"frames": schema.FRAMES, "connections": schema.CONNECTIONS}
EXAMPLES = sorted(glob.glob(os.path.join(ROOT, "examples", "*.pcapng")))
ERROR_DAY, EXAMPLES_DAY = "2025-12-23", "2026-11-21"   # amqp-error.pcap's day, and every example's


@pytest.fixture(scope="module")
def error_capture(corpus_dir) -> str:
    return os.path.join(corpus_dir, "deepflow", "amqp-error.pcap")


@pytest.fixture(scope="module")
def agent_lake(tmp_path_factory, error_capture) -> str:
    """The agent's tables for the deepflow error capture and every example; read only by these tests."""
    lake_dir = str(tmp_path_factory.mktemp("agent-lake"))
    assert len(EXAMPLES) >= 10
    for capture in [error_capture, *EXAMPLES]:
        assert not ingest_file(capture, lake_dir).unreadable
    return lake_dir


def agent_read(lake_dir: str, name: str) -> pa.Table:
    return lake.read_table(lake_dir, name, TABLES[name])


def in_order(table: pa.Table) -> pa.Table:
    return table.sort_by([(column, "ascending") for column in table.column_names])


def assert_same_rows(actual: pa.Table, expected: pa.Table) -> None:
    assert actual.schema.equals(expected.schema)
    assert actual.num_rows == expected.num_rows
    assert in_order(actual).equals(in_order(expected))


def table_version(lake_dir: str, name: str) -> int:
    return DeltaTable(os.path.join(lake_dir, name)).version()


def write_table(rows: pa.Table, lake_dir: str, name: str, table_schema: pa.Schema, split_by: tuple[str, ...] = (),
                tag: str | None = None) -> None:
    """A table written as the analysis writes its own: analyzer.lake.TableWriter's files, one commit."""
    writer = TableWriter(lake_dir, name, table_schema, split_by=split_by)
    writer.write(rows.select(table_schema.names).cast(table_schema))
    commit(os.path.join(lake_dir, name), table_schema, writer.actions, schema.PARTITION_BY, tag=tag)


def test_spark_types_are_the_agents_types_exactly():
    frames = spark_schema(schema.FRAMES)
    assert frames.names == schema.FRAMES.names
    assert all(field.nullable for field in frames)
    assert frames["ts"].dataType == T.TimestampType()
    assert frames["seq"].dataType == T.LongType() and frames["channel"].dataType == T.IntegerType()
    assert frames["multiple"].dataType == T.BooleanType() and frames["date"].dataType == T.StringType()
    assert spark_schema(pa.schema([("flag", pa.int8())]))["flag"].dataType == T.ByteType()
    with pytest.raises(TypeError, match="column 'ts_ns'.*timestamp\\[ns\\]"):
        spark_schema(pa.schema([("ts_ns", pa.timestamp("ns"))]))
    # A struct (a table's rows in the passes' wide output) maps field for field, and as strictly.
    nested = spark_schema(pa.schema([("frames", pa.struct(list(schema.FRAMES)))]))["frames"].dataType
    assert nested == frames
    with pytest.raises(TypeError, match="column 'ts_ns'"):
        spark_schema(pa.schema([("row", pa.struct([("ts_ns", pa.timestamp("ns"))]))]))


def test_spark_reads_the_agents_tables_as_the_agent_does(spark, agent_lake):
    for name, arrow_schema in TABLES.items():
        df = read_delta(spark, agent_lake, name, arrow_schema)
        assert df.schema == spark_schema(arrow_schema)
        expected = agent_read(agent_lake, name)
        assert expected.num_rows > 0
        assert_same_rows(df.toArrow(), expected)
    assert set(agent_read(agent_lake, "frames")["date"].to_pylist()) == {ERROR_DAY, EXAMPLES_DAY}


def test_since_picks_date_partitions_before_spark_opens_a_file(spark, agent_lake):
    frames = agent_read(agent_lake, "frames")
    since_examples = read_delta(spark, agent_lake, "frames", schema.FRAMES, since="2026-01-01")
    assert {row["date"]: row["count"] for row in since_examples.groupBy("date").count().collect()} == \
        {EXAMPLES_DAY: pc.sum(pc.equal(frames["date"], EXAMPLES_DAY)).as_py()}
    assert all(f"/date={EXAMPLES_DAY}/" in uri for uri in since_examples.inputFiles())
    assert read_delta(spark, agent_lake, "frames", schema.FRAMES, since=ERROR_DAY).count() == frames.num_rows
    nothing = read_delta(spark, agent_lake, "frames", schema.FRAMES, since="2030-01-01")
    assert nothing.count() == 0 and nothing.schema == spark_schema(schema.FRAMES)


def test_empty_and_missing_tables(spark, tmp_path):
    out = str(tmp_path)
    missing = read_delta(spark, out, "frames", schema.FRAMES)
    assert missing.count() == 0 and missing.schema == spark_schema(schema.FRAMES)
    DeltaTable.create(os.path.join(out, "frames"), schema.FRAMES, partition_by=["date"])
    empty = read_delta(spark, out, "frames", schema.FRAMES)
    assert empty.count() == 0 and empty.schema == spark_schema(schema.FRAMES)


def test_partition_values_that_need_escaping_round_trip(spark, tmp_path):
    """Spark takes partition values from folder names, unescaping each %XX as one character: ASCII
    values delta-rs escapes read back as the log has them; a non-ASCII one (escaped as UTF-8 bytes)
    stops the read rather than read as other text (table_files.files_to_read)."""
    odd = pa.schema([("date", pa.string()), ("n", pa.int64())])
    values = ["a:b c%d+e/f=g", None, "2026-11-21"]
    for name, written in (("odd", values), ("utf8", ["ü"])):
        write_deltalake(str(tmp_path / name), pa.table({"date": written, "n": range(len(written))}, odd),
                        partition_by=["date"])
    table = DeltaTable(str(tmp_path / "odd"))
    logged = pa.table(table.get_add_actions(flatten=True))
    assert sorted(logged["partition.date"].to_pylist(), key=str) == sorted(values, key=str)
    back = read_delta(spark, str(tmp_path), "odd", odd).toArrow()
    assert sorted(zip(back["n"].to_pylist(), back["date"].to_pylist())) == list(enumerate(values))
    with pytest.raises(RuntimeError, match="the bridge cannot read this table"):
        read_delta(spark, str(tmp_path), "utf8", odd)


def test_native_mode_without_the_delta_jars_fails_clearly(spark, agent_lake):
    assert delta_mode(spark) == "bridge" and delta_mode(spark, "bridge") == "bridge"
    with pytest.raises(NativeDeltaUnavailable) as failure:
        delta_mode(spark, "native")
    message = str(failure.value)
    assert "Delta Lake JARs are not on Spark's classpath" in message
    assert "io.delta:delta-spark_2.13:" in message and "--delta-mode bridge" in message
    with pytest.raises(NativeDeltaUnavailable):
        read_delta(spark, agent_lake, "frames", schema.FRAMES, mode="native")
    with pytest.raises(ValueError, match="--delta-mode must be one of"):
        delta_mode(spark, "fast")


def test_the_bridge_refuses_tables_whose_files_need_delta_spark(spark, tmp_path):
    # Deletion vectors hide rows that are still in the Parquet files: reading the files would resurrect them.
    DeltaTable.create(str(tmp_path / "frames"), schema.FRAMES, partition_by=["date"],
                      configuration={"delta.enableDeletionVectors": "true"})
    with pytest.raises(RuntimeError, match="deletionVectors.*--delta-mode native"):
        read_delta(spark, str(tmp_path), "frames", schema.FRAMES)


def test_listed_connections_filter_and_replace_as_the_join_does(spark, agent_lake, tmp_path, monkeypatch):
    """Rows of a few connections are picked by a literal IN filter (no broadcast job); past
    plans.IN_LIST_CONNECTIONS by a broadcast semi-join. Both must pick the same rows. A replace
    names them by listed values (connections_match) or by keys (Match): the one rule
    (delta_io.doomed) must take out the same rows either way."""
    from itertools import product

    from spark_jobs.delta_io import Listed, Match, Replacement, connections_match, replace_all
    from spark_jobs.timeline import plans

    frames = read_delta(spark, agent_lake, "frames", schema.FRAMES)
    ids = sorted(r["connection_id"] for r in frames.select("connection_id").distinct().collect())
    assert len(ids) >= 4
    picked = ids[::2] + ["no-such-connection"]

    def rows_of(keys):
        return in_order(pa.Table.from_pylist([r.asDict() for r in plans.of_connections(frames, keys).collect()]))

    listed = rows_of(picked)
    monkeypatch.setattr(plans, "IN_LIST_CONNECTIONS", 0)
    joined = rows_of(picked)
    assert listed.num_rows > 0 and listed.equals(joined)
    assert set(listed["connection_id"].to_pylist()) == set(picked[:-1])
    monkeypatch.undo()

    kinds = ("basic.deliver", "basic.ack")
    as_list = connections_match(picked, method=kinds)
    assert isinstance(as_list, Listed)
    keys = pa.Table.from_pylist([{"connection_id": c, "method": m} for c, m in product(picked, kinds)])
    as_keys = Match(keys, ("connection_id", "method"))
    results = []
    for i, match in enumerate([as_list, as_keys]):
        lake_dir = str(tmp_path / f"lake{i}")
        write_table(agent_read(agent_lake, "frames"), lake_dir, "frames", schema.FRAMES)
        replace_all(lake_dir, {"frames": Replacement(None, schema.FRAMES, [match])})
        results.append(in_order(agent_read(lake_dir, "frames")))
    everything = agent_read(agent_lake, "frames")
    doomed = pc.and_(pc.is_in(everything["connection_id"], pa.array(picked)),
                     pc.is_in(everything["method"], pa.array(kinds)))
    assert 0 < pc.sum(doomed).as_py() < everything.num_rows
    assert results[0].equals(results[1])
    assert results[0].equals(in_order(everything.filter(pc.invert(doomed))))


@pytest.mark.parametrize("searched", [True, False], ids=["searched", "rewritten-whole"])
def test_provisional_rows_are_written_apart_and_only_their_files_searched(spark, tmp_path, monkeypatch, searched):
    """provisional.py: the writers put provisional rows in files of their own, whose Delta statistics
    say so; a replace told that only provisional rows can match searches just those files (a final
    row that matches is left alone: the caller's promise decides), and otherwise every file; so
    when those files are rewritten whole, too (delta_io.REWRITTEN_WHOLE_BYTES)."""
    from spark_jobs import delta_io
    from spark_jobs.delta_io import Match, Replacement, replace_all
    from spark_jobs.provisional import PROVISIONAL, stored_schema
    from spark_jobs.table_files import files_that_may_hold
    from spark_jobs.session import commits_tagged

    table_schema = stored_schema(pa.schema([("date", pa.string()), ("connection_id", pa.string()), ("seq", pa.int64())]))
    if searched:
        monkeypatch.setattr(delta_io, "REWRITTEN_WHOLE_BYTES", 0)
    rows = [{"date": day, "connection_id": "c", "seq": seq, PROVISIONAL: seq % 3 == 0}
            for day in ("2026-11-24", "2026-11-25") for seq in range(1, 31)]
    data = pa.Table.from_pylist(rows, schema=table_schema)
    results = {}
    for provisional_only in (True, False):
        lake_dir = str(tmp_path / f"lake-{provisional_only}")
        write_table(data, lake_dir, "t", table_schema, split_by=(PROVISIONAL,), tag="run-1")
        table = DeltaTable(os.path.join(lake_dir, "t"))
        assert table.history(1)[0]["userMetadata"] == "run-1"
        stats = pa.table(table.get_add_actions(flatten=True)).to_pylist()
        assert {(s["min.provisional"], s["max.provisional"]) for s in stats} == {(False, False), (True, True)}
        for file in stats:  # the statistics are the file's own
            flags = pq.read_table(os.path.join(lake_dir, "t", file["path"]), columns=[PROVISIONAL])[PROVISIONAL]
            assert set(flags.to_pylist()) == {file["max.provisional"]}
        assert files_that_may_hold(table, PROVISIONAL) == {s["path"] for s in stats if s["max.provisional"]}
        # Replace seq 3 (provisional) and seq 4 (final) of the first day with one new row.
        keys = pa.table({"connection_id": ["c", "c"], "seq": [3, 4]})
        new = pa.Table.from_pylist([{"date": "2026-11-24", "connection_id": "c", "seq": 3, PROVISIONAL: False}],
                                   schema=table_schema)
        with commits_tagged("run-2"):
            replace_all(lake_dir, {"t": Replacement(new, table_schema, [Match(keys, ("connection_id", "seq"))],
                                                    provisional_only)})
        table = DeltaTable(os.path.join(lake_dir, "t"))
        assert table.history(1)[0]["userMetadata"] == "run-2"
        got = table.to_pyarrow_table()
        results[provisional_only] = sorted((r["date"], r["seq"], r[PROVISIONAL]) for r in got.to_pylist()
                                           if r["date"] == "2026-11-24" and r["seq"] in (3, 4))
    assert results[True] == [("2026-11-24", 3, False), ("2026-11-24", 4, False)]
    assert results[False] == [("2026-11-24", 3, False)]


def test_a_bridge_read_of_a_table_of_many_files_in_a_folder_starts_no_listing_job(spark, tmp_path):
    """Past 32 paths Spark lists the files a read names in a job of its own; an analysis table gains
    files with every scheduled run. For a lake in a folder the driver lists them (use_lake)."""
    from spark_jobs.session import LISTING_JOB_THRESHOLD, use_lake
    from spark_jobs.steps import Steps

    from analyzer.lake import TableWriter
    from spark_jobs.table_files import commit

    lake_dir = str(tmp_path / "lake")
    table_schema = pa.schema([("date", pa.string()), ("seq", pa.int64())])
    writer = TableWriter(lake_dir, "t", table_schema)
    for seq in range(40):  # a file each
        writer.write(pa.Table.from_pylist([{"date": "2026-11-24", "seq": seq}], schema=table_schema))
    commit(os.path.join(lake_dir, "t"), table_schema, writer.actions, schema.PARTITION_BY)
    assert len(DeltaTable(os.path.join(lake_dir, "t")).file_uris()) == 40
    steps = Steps(spark)
    spark.conf.unset(LISTING_JOB_THRESHOLD)
    read_delta(spark, lake_dir, "t", table_schema, "bridge")
    assert steps.spark_jobs() == 1  # Spark's default: the listing job
    use_lake(spark, lake_dir)
    read = read_delta(spark, lake_dir, "t", table_schema, "bridge")
    assert steps.spark_jobs() == 1
    assert sorted(r["seq"] for r in read.collect()) == list(range(40))


def test_rows_split_by_two_flags_and_the_files_that_may_hold_one(tmp_path):
    """analyzer.lake.TableWriter splits a write by each flag column (a file per combination, each
    with its statistics: provisional.py, requeue_related.py), and the statistics name the files that
    may hold a flag's true rows, committed or not."""
    from analyzer.lake import TableWriter
    from spark_jobs.table_files import adds_that_may_hold, commit, files_that_may_hold, rows_in

    flags = ("provisional", "flagged")
    table_schema = pa.schema([("date", pa.string()), ("provisional", pa.bool_()), ("flagged", pa.bool_()),
                              ("seq", pa.int64())])
    rows = [{"date": "2026-11-24", "provisional": seq % 5 == 0, "flagged": None if seq == 7 else seq % 3 == 0,
             "seq": seq} for seq in range(1, 31)]
    lake_dir = str(tmp_path / "lake")
    writer = TableWriter(lake_dir, "t", table_schema, split_by=flags)
    writer.write(pa.Table.from_pylist(rows, schema=table_schema))
    commit(os.path.join(lake_dir, "t"), table_schema, writer.actions, schema.PARTITION_BY)
    table = DeltaTable(os.path.join(lake_dir, "t"))
    stats = pa.table(table.get_add_actions(flatten=True)).to_pylist()
    # false/true of provisional, each by false/true/null of flagged (seq 7 is neither provisional nor flagged)
    assert sorted((s["min.provisional"], s["max.flagged"], s["null_count.flagged"], s["num_records"]) for s in stats
                  if s["max.flagged"] is not None) == [(False, False, 0, 15), (False, True, 0, 8),
                                                       (True, False, 0, 4), (True, True, 0, 2)]
    assert [(s["max.provisional"], s["null_count.flagged"]) for s in stats if s["max.flagged"] is None] == [(False, 1)]
    for file in stats:  # the statistics are the file's own
        got = pq.read_table(os.path.join(lake_dir, "t", file["path"]), columns=list(flags))
        assert set(got["provisional"].to_pylist()) == {file["max.provisional"]}
        assert set(got["flagged"].to_pylist()) == {file["max.flagged"]}
    may_hold = files_that_may_hold(table, "flagged")
    assert len(may_hold) == 3 and may_hold == {s["path"] for s in stats if s["max.flagged"] is not False}
    # Files not committed yet, by their add actions (a carried run's written deliveries): the same files.
    assert {add.path for add in adds_that_may_hold(writer.actions, "flagged")} == may_hold
    assert rows_in(adds_that_may_hold(writer.actions, "flagged")) == 8 + 2 + 1 and rows_in(writer.actions) == 30


def test_a_tasks_flagged_rows_gather_in_files_of_their_own(tmp_path):
    """wide_writes.FilesWriter: the rows of each combination of the flags gather apart, so the
    few flagged rows of many batches make one file, not one beside every file of the others; a
    connection dropped leaves no row in either."""
    from analyzer.lake import read_table
    from spark_jobs.table_files import commit
    from spark_jobs.wide_writes import FilesWriter

    table_schema = pa.schema([("date", pa.string()), ("provisional", pa.bool_()), ("requeue_related", pa.bool_()),
                              ("connection_id", pa.string()), ("seq", pa.int64())])
    files = FilesWriter(str(tmp_path), "t", table_schema, file_rows=10)
    for batch in range(3):  # ten rows a batch, one of them flagged
        files.add(pa.Table.from_pylist([{"date": "2026-11-24", "provisional": False, "requeue_related": i == 4,
                                         "connection_id": f"c{i % 2}", "seq": batch * 10 + i} for i in range(10)],
                                       schema=table_schema))
    # Nine unflagged rows a batch: the first two batches made a file of 18, the flagged three wait.
    files.beside.wait()   # the writer's thread has done so
    assert [json.loads(f[4])["numRecords"] for f in files.writer.files()] == [18]
    files.drop("c1")   # that file is taken back: its 8 rows of c0 join the last batch's 4
    by_flag = sorted((json.loads(f["stats"])["maxValues"]["requeue_related"], json.loads(f["stats"])["numRecords"])
                     for f in files.files().to_pylist())
    assert by_flag == [(False, 12), (True, 3)], by_flag
    commit(str(tmp_path / "t"), table_schema, files.writer.actions, schema.PARTITION_BY)
    rows = read_table(str(tmp_path), "t", table_schema).to_pylist()
    assert sorted(r["seq"] for r in rows) == [s for s in range(30) if s % 2 == 0]
    assert sorted(r["seq"] for r in rows if r["requeue_related"]) == [4, 14, 24]


def test_a_tasks_files_are_each_sorted_whole_by_the_order_it_is_given(tmp_path):
    """wide_writes.FilesWriter's `order`: the passes hand it each flush's rows as the machine made
    them (timeline.tables_of(ordered=False)) and it sorts each file's rows, gathered from several
    flushes, in its own thread; without an order they stay as they came."""
    from spark_jobs.wide_writes import FilesWriter

    table_schema = pa.schema([("date", pa.string()), ("provisional", pa.bool_()), ("connection_id", pa.string()),
                              ("seq", pa.int64())])
    flushes = [[("c1", 5), ("c0", 9), ("c1", 2)], [("c0", 1), ("c2", 3)], [("c1", 1), ("c0", 4)]]

    def written(order):
        files = FilesWriter(str(tmp_path / "-".join(order or ("none",))), "t", table_schema, 100, order)
        for flush in flushes:
            files.add(pa.Table.from_pylist([{"date": "2026-11-24", "provisional": False, "connection_id": c, "seq": n}
                                            for c, n in flush], schema=table_schema))
        (file,) = files.files().to_pylist()
        return [(r["connection_id"], r["seq"]) for r in pq.read_table(
            os.path.join(files.writer.root, file["path"]), partitioning=None).to_pylist()]

    as_made = [row for flush in flushes for row in flush]
    assert written(("connection_id", "seq")) == sorted(as_made)
    assert written(()) == as_made


def test_a_tasks_rows_of_two_days_make_a_file_a_day_each_sorted_whole(tmp_path):
    """FilesWriter sorts a pile by day before its order, so that TableWriter cuts the days apart
    as slices: a file per day, each in the order asked."""
    from spark_jobs.wide_writes import FilesWriter

    table_schema = pa.schema([("date", pa.string()), ("connection_id", pa.string()), ("seq", pa.int64())])
    made = [("2026-11-25", "c1", 5), ("2026-11-24", "c0", 9), ("2026-11-25", "c0", 2), ("2026-11-24", "c1", 1),
            ("2026-11-24", "c0", 3), (None, "c2", 7), ("2026-11-25", "c0", 1)]
    files = FilesWriter(str(tmp_path / "lake"), "t", table_schema, 100, ("connection_id", "seq"))
    files.add(pa.Table.from_pylist([{"date": d, "connection_id": c, "seq": n} for d, c, n in made], schema=table_schema))
    written = {}
    for file in files.files().to_pylist():
        rows = pq.read_table(os.path.join(files.writer.root, file["path"]), partitioning=None).to_pylist()
        written[file["date"]] = [(r["connection_id"], r["seq"]) for r in rows]
    assert written == {day: sorted((c, n) for d, c, n in made if d == day) for day in ("2026-11-24", "2026-11-25", None)}


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(["2026-11-23", "2026-11-24", "2026-11-25", None]), max_size=40),
       st.booleans(), st.integers(0, 40))
def test_rows_by_day_are_each_days_rows_and_slices_of_a_table_sorted_by_day(days, sort, cut):
    """lake.by_day, which TableWriter writes a file per day by: each day's rows in their order;
    of a table sorted by day (and in one chunk), slices sharing its buffers, not copies."""
    table = pa.table({"date": pa.array(days, pa.string()), "seq": pa.array(range(len(days)), pa.int64())})
    if sort:
        table = table.sort_by([("date", "ascending")])
    chunked = pa.concat_tables([table.slice(0, cut), table.slice(cut)])  # as a pile of several batches
    expected: dict = {}
    for row in table.to_pylist():
        expected.setdefault(row["date"], []).append(row["seq"])
    for rows in (table, chunked):
        parts = lake.by_day(rows)
        assert len(parts) == len(expected)
        assert {day: part["seq"].to_pylist() for day, part in parts} == expected
    if sort and len(expected) > 1:
        (data,) = table["seq"].chunks
        for _day, part in lake.by_day(table):
            (piece,) = part["seq"].chunks
            assert piece.buffers()[1].address == data.buffers()[1].address


def test_rows_written_beside_the_task_fail_the_task_when_it_waits(tmp_path):
    """wide_writes.Beside: FilesWriter's pieces run one at a time, in order, in a thread of their
    own, and what one raises is raised where the task waits for it (the next `add`, `drop` or
    `files`), never lost."""
    from spark_jobs.wide_writes import Beside, FilesWriter

    beside, done = Beside(), []
    for n in range(5):
        beside.run(lambda n=n: (time.sleep(0.01 * (5 - n)), done.append(n)))
    beside.wait()
    assert done == [0, 1, 2, 3, 4]
    beside.run(lambda: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        beside.wait()
    beside.wait()   # raised once

    table_schema = pa.schema([("date", pa.string()), ("connection_id", pa.string()), ("seq", pa.int64())])
    files = FilesWriter(str(tmp_path), "t", table_schema, file_rows=10)
    files.add(pa.table({"date": ["2026-11-24"], "seq": [1]}))   # a column short: its cast raises
    with pytest.raises(ValueError):
        files.files()


@pytest.mark.parametrize("searched", [True, False], ids=["searched", "rewritten-whole"])
def test_tables_replaced_together_each_in_its_commit_by_the_driver(spark, agent_lake, tmp_path, monkeypatch,
                                                                   searched):
    """delta_io.replace_all: several tables' rows deleted and appended by the driver (no Spark job),
    each table in its own commit: the stored rows but those matched, and the new rows. Tables as
    small as these are rewritten whole (REWRITTEN_WHOLE_BYTES); `searched` lowers that bound, so
    the files are searched. A file written beside the rewrite goes into the same commit."""
    from analyzer.lake import TableWriter
    from spark_jobs import delta_io
    from spark_jobs.delta_io import Listed, Replacement, replace_all

    if searched:
        monkeypatch.setattr(delta_io, "REWRITTEN_WHOLE_BYTES", 0)
    tables = {"frames": schema.FRAMES, "connections": schema.CONNECTIONS}
    stored = {name: agent_read(agent_lake, name) for name in tables}
    ids = sorted(stored["connections"]["connection_id"].to_pylist())
    picked = ids[::2]
    # Each picked connection's rows replaced by themselves with the agent id changed; the control
    # frames (channel 0) of the others deleted.
    mine = {name: pc.is_in(rows["connection_id"], pa.array(picked)) for name, rows in stored.items()}
    new = {name: rows.filter(mine[name]).set_column(rows.schema.get_field_index("agent_id"), "agent_id",
                                                    pa.repeat(pa.scalar("again"), pc.sum(mine[name]).as_py()))
           for name, rows in stored.items()}
    matches = {"frames": [Listed({"connection_id": tuple(picked)}),
                          Listed({"connection_id": tuple(ids), "channel": (0,)})],
               "connections": [Listed({"connection_id": tuple(picked)})]}
    lake_dir = str(tmp_path / "lake")
    for name, table_schema in tables.items():
        write_table(stored[name], lake_dir, name, table_schema)
    versions = {name: table_version(lake_dir, name) for name in tables}
    extra = TableWriter(lake_dir, "connections", schema.CONNECTIONS)
    extra.write(stored["connections"].slice(0, 1))
    group = f"replace-all-test-{searched}"
    spark.sparkContext.setJobGroup(group, group)
    replace_all(lake_dir, {name: Replacement(new[name], table_schema, matches[name])
                           for name, table_schema in tables.items()}, written={"connections": extra.actions})
    assert len(spark.sparkContext.statusTracker().getJobIdsForGroup(group)) == 0
    assert {name: table_version(lake_dir, name) for name in tables} == {n: v + 1 for n, v in versions.items()}
    control = pc.fill_null(pc.equal(stored["frames"]["channel"], 0), False)
    expected = {"frames": pa.concat_tables([stored["frames"].filter(pc.invert(pc.or_(mine["frames"], control))),
                                            new["frames"]]),
                "connections": pa.concat_tables([stored["connections"].filter(pc.invert(mine["connections"])),
                                                 new["connections"], stored["connections"].slice(0, 1)])}
    for name in tables:
        got = in_order(agent_read(lake_dir, name))
        assert got.equals(in_order(expected[name].cast(got.schema)))
        assert 0 < pc.sum(pc.equal(got["agent_id"], "again")).as_py() < got.num_rows


@pytest.mark.parametrize("searched", [True, False], ids=["searched", "rewritten-whole"])
def test_a_rewrite_with_rows_and_keys_takes_out_the_keyed_rows(spark, agent_lake, tmp_path, monkeypatch, searched):
    """delta_io: new rows and matches by keys (`Match`) replace the rows of those keys, whether the
    files are searched or rewritten whole; a null matches no key."""
    from spark_jobs import delta_io
    from spark_jobs.delta_io import Match, Replacement, replace_all

    if searched:
        monkeypatch.setattr(delta_io, "REWRITTEN_WHOLE_BYTES", 0)
    stored = agent_read(agent_lake, "connections")
    rows = stored.to_pylist()
    keys = [(row["connection_id"], row["agent_id"]) for row in rows[:2]] + [(rows[2]["connection_id"], None)]
    new = pa.Table.from_pylist([{**row, "connection_name": "again"} for row in rows[:1]], schema=schema.CONNECTIONS)
    match = Match(pa.table({"connection_id": [k[0] for k in keys],
                            "agent_id": pa.array([k[1] for k in keys], pa.string())}), ("connection_id", "agent_id"))
    lake_dir = str(tmp_path / "lake")
    write_table(stored, lake_dir, "connections", schema.CONNECTIONS)
    replace_all(lake_dir, {"connections": Replacement(new, schema.CONNECTIONS, [match])})
    kept = agent_read(lake_dir, "connections").to_pylist()
    assert len(kept) == len(rows) - 2 + 1 and {"again"} == {row["connection_name"] for row in kept
                                                             if row["connection_id"] == rows[0]["connection_id"]}


def test_a_discarded_rewrite_leaves_the_table_and_its_folder_as_they_were(spark, agent_lake, tmp_path):
    from spark_jobs.delta_io import Listed, Replacement, rewrite_all

    lake_dir = str(tmp_path / "lake")
    write_table(agent_read(agent_lake, "connections"), lake_dir, "connections", schema.CONNECTIONS)
    before = sorted(glob.glob(os.path.join(lake_dir, "connections", "**", "*.parquet"), recursive=True))
    version = table_version(lake_dir, "connections")
    rewrite = rewrite_all(lake_dir, {"connections": Replacement(None, schema.CONNECTIONS,
                                                               [Listed({"connection_id": ("nobody",)})])})["connections"]
    assert rewrite.adds and rewrite.removed
    rewrite.discard()
    assert sorted(glob.glob(os.path.join(lake_dir, "connections", "**", "*.parquet"), recursive=True)) == before
    assert table_version(lake_dir, "connections") == version


def test_the_drivers_distinct_values_of_files_are_sparks(spark, tmp_path):
    """table_files.distinct_strings (a scheduled run's connections in scope, read by the driver):
    Spark's distinct non-null values of the same files, whether the writer kept a dictionary (one
    file of several row groups) or wrote the values plain, with nulls and a file of nulls only."""
    from spark_jobs.table_files import distinct_strings

    ids = [f"conn-{i % 7}" if i % 5 else None for i in range(3000)]
    files = {"dictionary.parquet": dict(use_dictionary=True, row_group_size=1000),
             "plain.parquet": dict(use_dictionary=False), "nulls.parquet": {}}
    for name, options in files.items():
        values = [None] * 10 if name == "nulls.parquet" else ids[:2000] if name == "plain.parquet" else ids
        pq.write_table(pa.table({"connection_id": pa.array(values, pa.string()), "seq": pa.array(range(len(values)))}),
                       tmp_path / name, **options)
    paths = tuple(str(tmp_path / name) for name in files)
    assert pq.ParquetFile(paths[0]).metadata.num_row_groups == 3
    expected = sorted(r[0] for r in spark.read.parquet(*paths).select("connection_id")
                      .where(F.col("connection_id").isNotNull()).distinct().collect())
    assert distinct_strings(paths, "connection_id") == expected == [f"conn-{i}" for i in range(7)]
    assert distinct_strings(paths[2:], "connection_id") == [] and distinct_strings((), "connection_id") == []


def test_a_searched_file_whose_statistics_left_a_row_group_unread_is_rewritten_whole(tmp_path, monkeypatch):
    """delta_io's search (lake.scan) skips the row groups whose statistics hold no matched value; a file that
    holds a matched row is then rewritten with every row it keeps, those of the skipped row groups
    too."""
    from deltalake.transaction import AddAction

    from spark_jobs import delta_io
    from spark_jobs.delta_io import Listed, Replacement, replace_all

    monkeypatch.setattr(delta_io, "REWRITTEN_WHOLE_BYTES", 0)
    table_schema = pa.schema([("date", pa.string()), ("connection_id", pa.string()), ("seq", pa.int64())])
    location = tmp_path / "lake" / "t"
    (location / "date=2026-11-24").mkdir(parents=True)
    rows = pa.table({"connection_id": ["c1"] * 3 + ["c2"] * 3, "seq": range(6)}, table_schema.remove(0))
    path = "date=2026-11-24/two-groups.parquet"
    pq.write_table(rows, location / path, row_group_size=3)
    assert pq.ParquetFile(location / path).metadata.num_row_groups == 2
    add = AddAction(path, os.path.getsize(location / path), {"date": "2026-11-24"}, int(time.time() * 1000), True,
                    json.dumps({"numRecords": 6}))
    commit(str(location), table_schema, [add], schema.PARTITION_BY)
    searches = []
    original = delta_io.scan
    monkeypatch.setattr(delta_io, "scan", lambda *args, **kw: searches.append(args) or original(*args, **kw))
    replace_all(str(tmp_path / "lake"), {"t": Replacement(None, table_schema, [Listed({"connection_id": ("c2",)})])})
    assert len(searches) == 1
    kept = lake.read_table(str(tmp_path / "lake"), "t", table_schema)
    assert sorted(kept["seq"].to_pylist()) == [0, 1, 2] and set(kept["connection_id"].to_pylist()) == {"c1"}
