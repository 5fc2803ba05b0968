"""Pieces of the Spark plans: the rows of some connections, Spark settings held meanwhile, UTC days."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager

from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql import functions as F

from analyzer.detectors.common import day

# Up to this many connections, "the rows of these connections" is a literal IN filter: no join and
# so no broadcast, which without adaptive execution is a Spark job of its own each time a query
# runs it; and Parquet skips row groups by it. Above it, a broadcast semi-join.
IN_LIST_CONNECTIONS = 10_000


def of_connections(df: DataFrame, keys: list[str]) -> DataFrame:
    """The rows of `df` whose `connection_id` is one of `keys`."""
    if len(keys) <= IN_LIST_CONNECTIONS:
        return df.where(F.col("connection_id").isin(keys))
    ids = df.sparkSession.createDataFrame([(k,) for k in keys], "connection_id string")
    return df.join(F.broadcast(ids), on="connection_id", how="left_semi").select(*df.columns)


@contextmanager
def conf_meanwhile(spark: SparkSession, key: str, value: str) -> Iterator[None]:
    """The session's SQL setting `key` is `value` meanwhile, given back after, even after a failure
    (Spark reads them when a plan runs)."""
    before = spark.conf.get(key)
    spark.conf.set(key, value)
    try:
        yield
    finally:
        spark.conf.set(key, before)


def arrow_batches_by_rows(spark: SparkSession) -> AbstractContextManager[None]:
    """Meanwhile the Arrow batches Spark hands to Python are bounded by rows only, not also by bytes
    (why: docs/analysis.md, "One implementation of the rules", 1). For a plan whose rows are small:
    frame rows and connection rows, not checkpoints (10,000 large rows would be held at once)."""
    # Int.MaxValue: Spark then never sizes a batch.
    return conf_meanwhile(spark, "spark.sql.execution.arrow.maxBytesPerBatch", str(2**31 - 1))


def first_day(seen: Row | dict, keys: list[str]) -> str | None:
    """The UTC day the first of these connections was seen (`seen`: how many the connections table
    knows, `known`, and the first instant of any, `first_ns`), from which on their frames are; None
    where the connections table does not know them all."""
    if seen["known"] != len(keys) or seen["first_ns"] is None:
        return None
    return day(seen["first_ns"])
