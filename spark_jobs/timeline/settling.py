"""The rule both sides share: an item numbered n (delivery tag, confirm number) is settled by the
first frame after it naming n, or with multiple=true reaching n, whichever came first.

A multiple frame reaches min(its tag, or everything for tag 0; the highest number there was when
it came). The running maximum of that reach never falls, so the multiple frames that raise it cut
the numbers into runs: such a frame is the first to reach every number above the maximum before
it, up to its own. Those runs, spelled out number by number, meet the items in an equi-join: no
window over the items, which would hold a hot channel's millions of rows in one task (the
running maximum itself is counted in blocks of seq: blocks.py).
Spelling the runs out costs one row per number reached; channel_rows sends an incarnation whose
delivery tags jump (MAX_TAG_STEP) to the reference model, and a confirm never reaches past the
publishes counted before it, so the numbers reached are about as many as the items.
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from .blocks import running_in_blocks, seq_block
from .incarnations import INCARNATION


def first_settling_frame(items: DataFrame, frames: DataFrame, number: str, fields: tuple[str, ...]) -> DataFrame:
    """(incarnation, `number`) -> struct `frame` of `fields`: the frame that settled the item.

    `items`: INCARNATION, `number`, `item_seq`. `frames`: INCARNATION, seq, delivery_tag, multiple,
    `reach` (for multiple ones) and `fields`."""
    frame = F.struct(*fields)
    exact = (items.join(frames.select(*INCARNATION, F.col("delivery_tag").alias(number), frame.alias("frame")),
                        on=[*INCARNATION, number], how="inner")
             .where(F.col("frame.seq") > F.col("item_seq"))
             .groupBy(*INCARNATION, number).agg(F.min_by("frame", "frame.seq").alias("exact")))
    multiples = frames.where(F.col("multiple")).select(*INCARNATION, "seq", "reach", frame.alias("frame"))
    reached = running_in_blocks(multiples, INCARNATION, ["seq"], seq_block(),
                                maxes={"_reach": (F.col("reach"), True), "_reached_before": (F.col("reach"), False)})
    raising = (reached.select(*INCARNATION, "frame", F.col("_reach").alias("reach"),
                              F.coalesce(F.col("_reached_before"), F.lit(0)).alias("reached_before"))
               .where(F.col("reach") > F.col("reached_before")))
    by_multiple = raising.select(
        *INCARNATION, F.explode(F.sequence(F.col("reached_before") + 1, F.col("reach"))).alias(number),
        F.col("frame").alias("multiple_frame"))
    return (items.join(exact, on=[*INCARNATION, number], how="left")
            .join(by_multiple, on=[*INCARNATION, number], how="left")
            .select(*INCARNATION, number, F.when(
                F.col("exact").isNull() | (F.col("multiple_frame").isNotNull()
                                           & (F.col("multiple_frame.seq") < F.col("exact.seq"))),
                F.col("multiple_frame")).otherwise(F.col("exact")).alias("frame")))
