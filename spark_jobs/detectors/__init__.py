"""The detectors: per-channel timeline tables in, `findings` (schema.FINDINGS) out.

`detect` runs one small function per finding kind (schema.FINDING_KINDS), each a pure DataFrame
transform of the tables, and `common.finish` gives every raw finding its id, connection facts,
capture packet numbers and timestamps. The detectors rely on the table schemas only (DELIVERIES,
PUBLISHES, CHANNELS, VIOLATIONS, FRAMES, CONNECTIONS), whichever job built the tables: the
reference timeline (analyzer.timeline) or the Spark timeline job.

Modules: publisher.py (confirm-side kinds), consumer.py (ack-side kinds), messages.py (kinds that
follow one message), flow.py (flow control), common.py (the raw-finding contract and `finish`),
scoped.py (what a run that analysed some connections computes again).
"""

from __future__ import annotations

from functools import reduce

from pyspark.sql import DataFrame

from analyzer import schema
from analyzer.timeline import CHANNELS, VIOLATIONS
from spark_jobs.thresholds import Thresholds

from .common import SEVERITY, finish
from .consumer import unacked_buildup, unbounded_prefetch, unknown_delivery_tag
from .flow import flow_blocked
from .messages import redelivery_after_close, requeue_loop
from .publisher import (confirm_nack, lost_confirm, out_of_order_confirm, synchronous_confirms,
                        unconfirmed_persistent_publish, unroutable_returned)

# kind -> detector, in schema.FINDING_KINDS order.
DETECTORS = {
    "lost_confirm": lost_confirm,
    "confirm_nack": confirm_nack,
    "out_of_order_confirm": out_of_order_confirm,
    "unacked_buildup": unacked_buildup,
    "requeue_loop": requeue_loop,
    "unknown_delivery_tag": unknown_delivery_tag,
    "redelivery_after_close": redelivery_after_close,
    "unroutable_returned": unroutable_returned,
    "unconfirmed_persistent_publish": unconfirmed_persistent_publish,
    "synchronous_confirms": synchronous_confirms,
    "unbounded_prefetch": unbounded_prefetch,
    "flow_blocked": flow_blocked,
}

# The tables `detect` reads, with the schema each must carry (extra columns are ignored).
INPUTS = {
    "deliveries": schema.DELIVERIES,
    "publishes": schema.PUBLISHES,
    "channels": CHANNELS,
    "violations": VIOLATIONS,
    "frames": schema.FRAMES,
    "connections": schema.CONNECTIONS,
}


def detect(tables: dict[str, DataFrame], thresholds: Thresholds | None = None, kinds=tuple(DETECTORS)) -> DataFrame:
    """Every finding of these kinds in `tables` (keys as in INPUTS), as a DataFrame of
    spark_schema(schema.FINDINGS)."""
    check_inputs(tables)
    thresholds = thresholds if thresholds is not None else Thresholds()
    raw = reduce(DataFrame.unionByName, [DETECTORS[kind](tables, thresholds) for kind in kinds])
    return finish(raw, tables["frames"], tables["connections"])


def check_inputs(tables: dict[str, DataFrame]) -> None:
    """A clear error for a missing table or column, before Spark's analysis error deep in a plan."""
    missing_tables = sorted(set(INPUTS) - set(tables))
    if missing_tables:
        raise ValueError(f"detect needs the tables {', '.join(INPUTS)}; missing: {', '.join(missing_tables)}")
    for name, table_schema in INPUTS.items():
        missing = [column for column in table_schema.names if column not in tables[name].columns]
        if missing:
            raise ValueError(f"table {name!r} lacks the columns {', '.join(missing)}")


__all__ = ["detect", "DETECTORS", "INPUTS", "SEVERITY", "Thresholds"]
