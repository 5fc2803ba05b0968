"""The carried pass (connection_pass.py with `states`; carried_pass.py) on a real local Spark:
connections resumed from their checkpoints stream through the state machine, their records leaving
in batches (the rows to write as files the tasks write); a connection that falls back after some
of its rows have left takes them back out of what its task gathered and wrote
(`_Partition._take_back`): what remains is what the pass gives when nothing left early, and the
same partition run in this process (as the local executor runs it) shows the take-back happened.
That the carried tables equal one run over everything is tests/test_incremental.py's."""

import glob
import json
import os

import pyarrow as pa
import pyarrow.parquet as pq

from analyzer import lake, schema
from analyzer.connection_analysis import ANALYSIS_COLUMNS, ConnectionAnalysis, Settings
from analyzer.ingest import ingest_file
from spark_jobs import wide_writes
from spark_jobs.connection_pass import (ADVANCE_EVERY_ROWS, PASS_TABLES, WIDE, WRITTEN_TABLES, _Partition,
                                        connection_facts, connection_pass, state_row, states_table)
from spark_jobs.local_executor import laid_out
from spark_jobs.timeline.plans import conf_meanwhile
from spark_jobs.timeline.wide import rows_from_wide
from spark_jobs.wide_writes import add_actions

from .conftest import ROOT
from .findings_check import LAB_THRESHOLDS

SETTINGS = Settings(1, 60 * 10**9, LAB_THRESHOLDS)


def _checkpointed(rows: list[dict]) -> dict:
    """The analysis_state row a whole run over `rows` leaves (connection_pass.py's, without Spark)."""
    analysis = ConnectionAnalysis(rows[0]["connection_id"], rows[0]["agent_id"], SETTINGS,
                                  lambda record: None, lambda metrics: None)
    for row in rows:
        analysis.feed(row)
    done = analysis.finish({"connection_id": rows[0]["connection_id"]})
    return state_row(done.checkpoint, analysis.whole.timeline, 1)


def _rows_by_table(wide: pa.Table, lake_dir: str) -> dict[str, list[dict]]:
    """Each table's rows but the fallbacks', in a canonical order: those in the wide table's rows
    (of the timeline tables, `stale`) and those in the files the pass wrote into `lake_dir`."""
    adds = add_actions(rows_from_wide(wide, "files").to_pylist())
    rows = {name: rows_from_wide(wide, name, table_schema).to_pylist() for name, table_schema in PASS_TABLES.items()
            if name not in ("fallback", "files", "counts")}
    for name, table_schema in WRITTEN_TABLES.items():
        writer = lake.TableWriter(lake_dir, name, table_schema)
        written = [writer.read_file(add.path, add.partition_values["date"]) for add in adds.get(name, [])]
        rows[name] = rows.get(name, []) + [row for table in written for row in table.to_pylist()]
    return {name: sorted(table, key=lambda row: json.dumps(row, default=str)) for name, table in rows.items()}


def test_a_fallback_after_rows_left_is_dropped_and_the_rest_is_as_if_none_left(spark, tmp_path, monkeypatch):
    for capture in sorted(glob.glob(os.path.join(ROOT, "examples", "*.pcapng"))):
        ingest_file(capture, str(tmp_path))
    frames = lake.read_table(str(tmp_path), "frames", schema.FRAMES).select(list(ANALYSIS_COLUMNS))
    by_connection: dict[str, list] = {}
    for row in frames.sort_by([("connection_id", "ascending"), ("seq", "ascending")]).to_pylist():
        by_connection.setdefault(row["connection_id"], []).append(row)
    states, new = [], []
    for rows in by_connection.values():
        cut = len(rows) * 2 // 3
        states.append(_checkpointed(rows[:cut]))
        new += rows[cut:]
    carried = [state for state in states if state["checkpoint"] is not None]
    assert len(carried) >= 3, "the examples should leave open connections to carry"
    # The longest carried connection: a frame late in its new ones is stamped before the carried
    # bucket, so it falls back only after records of the frames before had come out.
    damaged = max(carried, key=lambda state: sum(row["connection_id"] == state["connection_id"] for row in new))
    mine = [i for i, row in enumerate(new) if row["connection_id"] == damaged["connection_id"]]
    assert len(mine) >= 20
    late = mine[len(mine) * 3 // 4]
    new[late] = dict(new[late], ts_ns=damaged["boundary_ns"] - 1)

    frames_df = spark.createDataFrame(pa.Table.from_pylist(new, schema=frames.schema))
    states_df = spark.createDataFrame(states_table(states))
    connections = lake.read_table(str(tmp_path), "connections", schema.CONNECTIONS)

    def carried_pass(flush_records: int, file_rows: int | None = None):
        lake_dir = str(tmp_path / f"written-{flush_records}")
        wide = connection_pass(frames_df, spark.createDataFrame(connections), SETTINGS, 2, lake_dir, states=states_df,
                               partitions=2, flush_records=flush_records, file_rows=file_rows).toArrow()
        fallbacks = {row["connection_id"]: row["reason"] for row in rows_from_wide(wide, "fallback").to_pylist()}
        return wide, fallbacks, lake_dir

    whole_batches, fallbacks, whole_dir = carried_pass(50_000)
    # Other connections of the examples may fall back on their own (tests/test_incremental.py has why).
    assert damaged["connection_id"] in fallbacks, fallbacks
    assert "older than the carried bucket" in fallbacks[damaged["connection_id"]]
    kept = _rows_by_table(whole_batches, whole_dir)
    assert not any(row["connection_id"] in fallbacks for rows in kept.values() for row in rows)
    assert len(kept["tally"]) == len(by_connection) - len(fallbacks)

    # Arrow batches of 7 rows, records out after every one of them, each table's in a file of its own.
    with conf_meanwhile(spark, "spark.sql.execution.arrow.maxRecordsPerBatch", "7"):
        one_by_one, again, one_by_one_dir = carried_pass(1, file_rows=1)
    assert again == fallbacks
    # Its records had left (with a file per table and batch, into files) and were taken back out:
    # none is in the pass's output, nor in any file in the lake.
    taken_back = [path for path in glob.glob(os.path.join(one_by_one_dir, "*", "date=*", "*.parquet"))
                  if damaged["connection_id"] in pq.read_table(path, columns=["connection_id"])["connection_id"]]
    assert not taken_back
    assert _rows_by_table(one_by_one, one_by_one_dir) == kept
    assert rows_from_wide(one_by_one, "fallback").num_rows == len(fallbacks)

    # The same partition code in this process (the local executor's way), watched: the damaged
    # connection's rows had been sent to the writers, and were taken back.
    dropped = []
    drop = wide_writes.FilesWriter.drop

    def watched(writer, connection_id):
        dropped.append((writer.name, connection_id))
        return drop(writer, connection_id)

    monkeypatch.setattr(wide_writes.FilesWriter, "drop", watched)
    state_of = {state["connection_id"]: state for state in states}
    facts = connection_facts(connections)
    rows = laid_out(pa.Table.from_pylist(new, schema=frames.schema),
                    {key: json.dumps(facts[key]) for key in by_connection}, state_of)
    in_process_dir = str(tmp_path / "in-process")
    partition = _Partition(SETTINGS, 2, 1, ADVANCE_EVERY_ROWS, in_process_dir, file_rows=1, carried=True)
    wide = pa.Table.from_batches(list(partition.run(iter(rows.to_batches(max_chunksize=7)))), schema=WIDE)
    assert {name for name, key in dropped if key == damaged["connection_id"]} == set(WRITTEN_TABLES)
    assert _rows_by_table(wide, in_process_dir) == kept
