"""The rule both sides share: an item numbered n (delivery tag, confirm number) is settled by the
first frame after it naming n, or with multiple=true reaching n, whichever came first.

A multiple frame reaches min(its tag, or everything for tag 0; the highest number there was when
it came). The running maximum of that reach never falls, so "the first multiple frame reaching n"
is a search in reach order (one window), not a join of every frame with every item.
"""

from __future__ import annotations

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from .incarnations import INCARNATION, running


def first_settling_frame(items: DataFrame, frames: DataFrame, number: str, fields: tuple[str, ...]) -> DataFrame:
    """(incarnation, `number`) -> struct `frame` of `fields`: the frame that settled the item.

    `items`: INCARNATION, `number`, `item_seq`. `frames`: INCARNATION, seq, delivery_tag, multiple,
    `reach` (for multiple ones) and `fields`."""
    frame = F.struct(*fields)
    frame_type = frames.select(frame).schema[0].dataType
    exact = (items.join(frames.select(*INCARNATION, F.col("delivery_tag").alias(number), frame.alias("frame")),
                        on=[*INCARNATION, number], how="inner")
             .where(F.col("frame.seq") > F.col("item_seq"))
             .groupBy(*INCARNATION, number).agg(F.min_by("frame", "frame.seq").alias("exact")))
    multiples = frames.where(F.col("multiple")).withColumn("reach", F.max("reach").over(running(*INCARNATION)))
    search = Window.partitionBy(*INCARNATION).orderBy(
        F.col("key").desc(), F.col("is_item"), F.col("seq").desc()).rowsBetween(
        Window.unboundedPreceding, Window.currentRow)
    by_multiple = (items.select(*INCARNATION, F.col(number).alias("key"), F.col("item_seq").alias("seq"),
                                F.lit(True).alias("is_item"), F.lit(None).cast(frame_type).alias("frame"))
                   .unionByName(multiples.select(*INCARNATION, F.col("reach").alias("key"), "seq",
                                                 F.lit(False).alias("is_item"), frame.alias("frame")))
                   .withColumn("multiple_frame", F.last("frame", ignorenulls=True).over(search))
                   .where(F.col("is_item"))
                   .select(*INCARNATION, F.col("key").alias(number), "multiple_frame"))
    return (items.join(exact, on=[*INCARNATION, number], how="left")
            .join(by_multiple, on=[*INCARNATION, number], how="left")
            .select(*INCARNATION, number, F.when(
                F.col("exact").isNull() | (F.col("multiple_frame").isNotNull()
                                           & (F.col("multiple_frame.seq") < F.col("exact.seq"))),
                F.col("multiple_frame")).otherwise(F.col("exact")).alias("frame")))
