"""The reference state machine (analyzer/timeline) on Spark, one connection per group.

For the connections the vectorised transforms do not cover (see regular.py): capture gaps,
mid-stream starts, transactions, protocol violations. A grouped Arrow function, not a row UDF:
each connection's rows arrive as one Arrow table, go through `analyzer.timeline.replay` in
(seq) order, and leave as Arrow tables. Its four output tables travel as one wide table (Spark
takes one schema per call): a `record` column names the table and each table's columns carry
its name as a prefix.
"""

from __future__ import annotations

import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from analyzer.timeline import INPUT_COLUMNS, replay_frames

from ..types import spark_schema
from .tables import TIMELINE_TABLES

RECORD = "record"


def _prefixed(table: str, column: str) -> str:
    return f"{table}__{column}"


WIDE = pa.schema([(RECORD, pa.string())] + [
    pa.field(_prefixed(table, field.name), field.type)
    for table, table_schema in TIMELINE_TABLES.items() for field in table_schema])


def reference_timelines(frames: DataFrame, overdue_ns: int) -> dict[str, DataFrame]:
    """Timelines of every connection in `frames`, through the reference model."""

    def one_connection(rows: pa.Table) -> pa.Table:
        tables = replay_frames(rows, overdue_ns)
        parts = []
        for name, table in tables.items():
            columns = {RECORD: pa.array([name] * table.num_rows, pa.string())}
            for field in WIDE:
                if field.name == RECORD:
                    continue
                table_name, _, column = field.name.partition("__")
                columns[field.name] = table.column(column) if table_name == name else pa.nulls(table.num_rows, field.type)
            parts.append(pa.Table.from_pydict(columns, schema=WIDE))
        return pa.concat_tables(parts)

    wide = (frames.select(*INPUT_COLUMNS)
            .groupBy("connection_id")
            .applyInArrow(one_connection, spark_schema(WIDE))
            .persist())  # four tables are read from it: replay each connection once
    return {name: wide.where(F.col(RECORD) == name)
            .select(*[F.col(_prefixed(name, field.name)).alias(field.name) for field in table_schema])
            for name, table_schema in TIMELINE_TABLES.items()}
