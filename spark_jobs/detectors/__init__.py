"""The findings that follow a message across connections: timeline tables in, `findings`
(schema.FINDINGS) out.

The kinds about one connection are decided beside the state machine (analyzer/detectors: the pass
runs them per connection, stored_findings.py from stored rows). The two kinds here, requeue_loop
and redelivery_after_close, need every delivery of a message wherever it went: Spark gathers them
by message identity and hands them to the same Python detectors' rules (messages.py), whose raw
findings are finished as the pass's are (evidence_packets.py: id, connection facts, capture packet
numbers, timestamps). They rely on the table schemas only (DELIVERIES, FRAMES, CONNECTIONS).

Modules: messages.py (the two kinds), scoped.py (what a run that analysed some connections
computes again), in_driver.py (the same for a run that carried every connection on, by the driver
when it is small).
"""

from __future__ import annotations

from functools import reduce

from pyspark.sql import DataFrame

from analyzer import schema
from spark_jobs.connection_pass import RAW_FINDINGS
from spark_jobs.evidence_packets import finished_findings
from spark_jobs.thresholds import Thresholds

from .messages import redelivery_after_close, requeue_loop

SEVERITY = schema.FINDING_SEVERITY

# kind -> detector, in schema.FINDING_KINDS order.
DETECTORS = {
    "requeue_loop": requeue_loop,
    "redelivery_after_close": redelivery_after_close,
}

# The tables `detect` reads, with the schema each must carry (extra columns are ignored).
INPUTS = {
    "deliveries": schema.DELIVERIES,
    "frames": schema.FRAMES,
    "connections": schema.CONNECTIONS,
}


def detect(tables: dict[str, DataFrame], thresholds: Thresholds | None = None, kinds=tuple(DETECTORS)) -> DataFrame:
    """Every finding of these kinds in `tables` (keys as in INPUTS; others are ignored), as a
    DataFrame of spark_schema(schema.FINDINGS)."""
    return finished_findings(raw_findings(tables, thresholds, kinds).select(*RAW_FINDINGS.names), tables["frames"])


def raw_findings(tables: dict[str, DataFrame], thresholds: Thresholds | None = None,
                 kinds=tuple(DETECTORS)) -> DataFrame:
    """`detect`'s findings before their packets: the raw findings (messages.ACROSS_RAW, with each
    one's `connection`) of these kinds."""
    check_inputs(tables)
    thresholds = thresholds if thresholds is not None else Thresholds()
    return reduce(DataFrame.unionByName, [DETECTORS[kind](tables, thresholds) for kind in kinds])


def check_inputs(tables: dict[str, DataFrame]) -> None:
    """A clear error for a missing table or column, before Spark's analysis error deep in a plan."""
    missing_tables = sorted(set(INPUTS) - set(tables))
    if missing_tables:
        raise ValueError(f"detect needs the tables {', '.join(INPUTS)}; missing: {', '.join(missing_tables)}")
    for name, table_schema in INPUTS.items():
        missing = [column for column in table_schema.names if column not in tables[name].columns]
        if missing:
            raise ValueError(f"table {name!r} lacks the columns {', '.join(missing)}")


__all__ = ["detect", "raw_findings", "DETECTORS", "INPUTS", "SEVERITY", "Thresholds"]
