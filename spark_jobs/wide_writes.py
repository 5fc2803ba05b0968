"""Several tables written into a lake in one Spark job (those of a wide DataFrame, timeline/wide.py,
or a DataFrame each).

Spark's writer takes one schema per job: a full run writing its per-connection tables that way
starts a job per table. Here one job runs a `mapInArrow` per table, and each task writes its rows
of the table as Parquet files straight into the table's folder with the agent's writer
(analyzer.lake.TableWriter: files by day, provisional rows in files of their own with the
column's statistics, as provisional.py wants), handing back only the files; the caller commits
each table's files in one Delta commit with delta-rs, on either Delta path (a full run's
overwrite, delta_io.replace_all's copy-on-write). Until then no log names a file: the files of a
failed or repeated task are never committed, and VACUUM removes them.

A full run's pass (connection_pass.py) writes its record tables the same way from its own tasks
(`FilesWriter`), and its files join these in the one job's answer (`written`).
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import reduce

import pyarrow as pa
from deltalake.transaction import AddAction
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from analyzer.lake import TableWriter

from .provisional import PROVISIONAL
from .timeline.wide import RECORD
from .types import spark_schema

# One row per file a task wrote.
FILES = pa.schema([("table", pa.string()), ("path", pa.string()), ("size", pa.int64()), ("date", pa.string()),
                   ("modified_ms", pa.int64()), ("stats", pa.string())])
# A table's rows a task gathers before writing them as files: large enough for Parquet's
# compression and few files, few enough that a task's memory stays bounded on a hot connection.
FILE_ROWS = 250_000


def write_wide(wide: DataFrame, lake: str, tables: dict[str, pa.Schema],
               written: DataFrame | None = None) -> dict[str, list[AddAction]]:
    """The rows of `wide` of each of `tables` (name -> schema as stored) written as Parquet files
    into that table's folder of `lake`, uncommitted (write_tables)."""
    return write_tables(lake, {name: (wide.where(F.col(RECORD) == name).selectExpr(f"`{name}`.*"), table_schema)
                               for name, table_schema in tables.items()}, written)


def write_tables(lake: str, tables: dict[str, tuple[DataFrame, pa.Schema]],
                 written: DataFrame | None = None) -> dict[str, list[AddAction]]:
    """Each table's rows (name -> (rows in the table's columns and order, schema as stored)) written
    as Parquet files into that table's folder of `lake`, uncommitted; the add actions of each
    table's files (none for a table without rows). `written`: FILES rows of files written already
    (by a pass, `FilesWriter`), read in the same job.

    A task per table and partition of its rows, all in one job: a partition holding a hot
    connection has its tables written side by side."""
    def writer(name: str, table_schema: pa.Schema):
        def write_partition(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
            files = FilesWriter(lake, name, table_schema)
            for batch in batches:
                files.add(pa.Table.from_batches([batch]))
            yield files.files()
        return write_partition

    parts = [rows.mapInArrow(writer(name, table_schema), spark_schema(FILES))
             for name, (rows, table_schema) in tables.items()]
    files = reduce(DataFrame.union, parts + ([written] if written is not None else [])).collect()
    adds: dict[str, list[AddAction]] = {}
    for file in files:
        adds.setdefault(file["table"], []).append(AddAction(file["path"], file["size"], {"date": file["date"]},
                                                            file["modified_ms"], True, file["stats"]))
    return {name: adds.get(name, []) for name in [*tables, *adds]}


class FilesWriter:
    """One task's rows of table `name` written as Parquet files FILE_ROWS at a time (the agent's
    TableWriter: files by day, provisional rows apart); `files()` writes what is left and gives
    the files as FILES rows."""

    def __init__(self, lake: str, name: str, table_schema: pa.Schema):
        self.name, self.schema = name, table_schema
        self.writer = TableWriter(lake, name, table_schema,
                                  split_by=PROVISIONAL if PROVISIONAL in table_schema.names else None)
        self.pending: list[pa.Table] = []
        self.pending_rows = 0

    def add(self, rows: pa.Table) -> None:
        # Cast by position, names checked: Spark's types to the stored ones (e.g. its timestamps' zone).
        self.pending.append(rows.cast(self.schema))
        self.pending_rows += rows.num_rows
        if self.pending_rows >= FILE_ROWS:
            self._write()

    def _write(self) -> None:
        if self.pending:
            self.writer.write(pa.concat_tables(self.pending))
            self.pending, self.pending_rows = [], 0

    def files(self) -> pa.RecordBatch:
        self._write()
        return pa.RecordBatch.from_pylist([{"table": self.name, "path": path, "size": size, "date": values["date"],
                                            "modified_ms": modified, "stats": stats}
                                           for path, size, values, modified, stats in self.writer.files()],
                                          schema=FILES)
