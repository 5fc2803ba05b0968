"""The reference state machine (analyzer/timeline) on Spark, one connection per group.

For the connections the vectorised transforms do not cover (see regular.py): capture gaps,
mid-stream starts, transactions, protocol violations. A grouped Arrow function, not a row UDF:
each connection's rows arrive as one Arrow table, go through `analyzer.timeline.replay` in
(seq) order, and leave as Arrow tables; its four output tables travel as one wide table (wide.py).
"""

from __future__ import annotations

import pyarrow as pa
from pyspark.sql import DataFrame

from analyzer.timeline import INPUT_COLUMNS, replay_frames

from ..types import spark_schema
from .tables import TIMELINE_TABLES
from .wide import from_wide, to_wide, wide_schema

WIDE = wide_schema(TIMELINE_TABLES)


def reference_timelines(frames: DataFrame, overdue_ns: int) -> dict[str, DataFrame]:
    """Timelines of every connection in `frames`, through the reference model."""

    def one_connection(rows: pa.Table) -> pa.Table:
        return to_wide(WIDE, [(name, None, table) for name, table in replay_frames(rows, overdue_ns).items()])

    wide = (frames.select(*INPUT_COLUMNS)
            .groupBy("connection_id")
            .applyInArrow(one_connection, spark_schema(WIDE))
            .persist())  # four tables are read from it: replay each connection once
    return {name: from_wide(wide, name, table_schema) for name, table_schema in TIMELINE_TABLES.items()}
