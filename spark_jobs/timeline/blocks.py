"""Running values over partitions too big for one task, computed in blocks of seq.

Spark's window operator buffers a whole partition (one channel: millions of rows for a hot
consumer) in one task: one core does it, and two tasks sharing a 2 GB driver spill it in hundreds
of pieces and run out of memory reading them back. A running value is the same computed per block
of rows (a window partition of at most BLOCK_SEQS rows) and corrected by what the blocks before it
carry: the last value they saw, the sum they add up to, their highest value; a row's successor
comes from the next block when it is the last of its own. The carries are one row per block, small
enough to be broadcast back to the rows.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from .plans import lookup

# Rows of one partition in a block: bounds a window task's buffer (a few tens of MB of wide rows).
BLOCK_SEQS = 1 << 16


def seq_block(seq: str = "seq") -> Column:
    return F.expr(f"`{seq}` div {BLOCK_SEQS}")


def running_in_blocks(df: DataFrame, partition: list[str], order: list[str], block: Column,
                      lasts: dict[str, tuple[Column, bool]] | None = None,
                      sums: dict[str, Column] | None = None,
                      maxes: dict[str, tuple[Column, bool]] | None = None,
                      nexts: dict[str, Column] | None = None) -> DataFrame:
    """`df` plus, per row, in `order` within `partition` (a row's block must not fall with the order):

    - `lasts` name -> (value, with_current): the value (null where a row has none) of the latest row
      that has one, up to and including the row (with_current) or strictly before it;
    - `sums` name -> value: the running sum up to the row, rows tied in `order` counted together
      (Spark's default RANGE frame);
    - `maxes` name -> (value, with_current): the running maximum up to and including the row
      (with_current) or strictly before it;
    - `nexts` name -> value (never null): the value of the row after it (null for the last row).
    """
    lasts, sums, maxes, nexts = lasts or {}, sums or {}, maxes or {}, nexts or {}
    blocked = df.withColumn("_block", block)
    within = Window.partitionBy(*partition, "_block").orderBy(*order)
    upto = within.rowsBetween(Window.unboundedPreceding, Window.currentRow)
    before = within.rowsBetween(Window.unboundedPreceding, -1)
    local = blocked.select(
        "*",
        *[F.last(value, ignorenulls=True).over(upto if with_current else before).alias(f"_local_{name}")
          for name, (value, with_current) in lasts.items()],
        *[F.sum(value).over(within).alias(f"_local_{name}") for name, value in sums.items()],
        *[F.max(value).over(upto if with_current else before).alias(f"_local_{name}")
          for name, (value, with_current) in maxes.items()],
        *[F.lead(value).over(within).alias(f"_local_{name}") for name, value in nexts.items()])
    position = F.struct(*order)
    summary = blocked.groupBy(*partition, "_block").agg(
        *[F.max_by(value, F.when(value.isNotNull(), position)).alias(f"_block_{name}")
          for name, (value, _) in lasts.items()],
        *[F.sum(value).alias(f"_block_{name}") for name, value in sums.items()],
        *[F.max(value).alias(f"_block_{name}") for name, (value, _) in maxes.items()],
        *[F.min_by(value, position).alias(f"_block_{name}") for name, value in nexts.items()])
    blocks = Window.partitionBy(*partition).orderBy("_block")
    earlier = blocks.rowsBetween(Window.unboundedPreceding, -1)
    carried = lookup(summary.select(
        *[F.col(key).alias(f"_carried_{key}") for key in (*partition, "_block")],
        *[F.last(f"_block_{name}", ignorenulls=True).over(earlier).alias(f"_carried_{name}") for name in lasts],
        *[F.sum(f"_block_{name}").over(earlier).alias(f"_carried_{name}") for name in sums],
        *[F.max(f"_block_{name}").over(earlier).alias(f"_carried_{name}") for name in maxes],
        *[F.lead(f"_block_{name}").over(blocks).alias(f"_carried_{name}") for name in nexts]))
    return local.join(carried, on=same_keys([*partition, "_block"], "_carried_"), how="left").select(
        *df.columns,
        *[F.coalesce(f"_local_{name}", f"_carried_{name}").alias(name) for name in lasts],
        *[(F.col(f"_local_{name}") + F.coalesce(f"_carried_{name}", F.lit(0))).alias(name) for name in sums],
        *[F.greatest(f"_local_{name}", f"_carried_{name}").alias(name) for name in maxes],
        *[F.coalesce(f"_local_{name}", f"_carried_{name}").alias(name) for name in nexts])


def same_keys(keys: list[str], prefix: str) -> list[Column]:
    """Join conditions `key` = `prefix + key` where null matches null, as in a window partition
    (agent_id, consumer_tag may be null)."""
    return [F.col(key).eqNullSafe(F.col(prefix + key)) for key in keys]
