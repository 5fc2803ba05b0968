"""The findings that follow a message across connections, on Spark: timeline tables in, `findings`
(schema.FINDINGS) out.

The kinds about one connection are decided beside the state machine (analyzer/detectors: the pass
runs them per connection, stored_findings.py from stored rows). The two kinds here, requeue_loop
and redelivery_after_close, need every delivery of a message wherever it went: Spark's tasks pick
the few deliveries they read with the one rule (analyzer.detectors.messages.candidates, through
Arrow), the driver gathers them and runs the pipeline's one step over them
(cross_connection_findings.py: the local executor runs the same), and its raw findings are finished
as the pass's are (evidence_packets.py: id, connection facts, capture packet numbers, timestamps).
They rely on the table schemas only (DELIVERIES, FRAMES, CONNECTIONS).

A run's findings step is spark_jobs/findings.py; `detect` is the same rules over Spark tables
(the tests' way to hold them to the plain-Python rules).
"""

from __future__ import annotations

import json

import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from analyzer import schema
from analyzer.detectors.messages import COLUMNS, candidates
from analyzer.detectors.thresholds import Thresholds
from spark_jobs.connection_pass import RAW_FINDINGS
from spark_jobs.connection_pass import CONNECTION_COLUMNS, connection_facts
from spark_jobs.cross_connection_findings import FoundAcross, findings_across
from spark_jobs.evidence_packets import finished_findings
from spark_jobs.types import spark_schema

SEVERITY = schema.FINDING_SEVERITY

# The kinds, in schema.FINDING_KINDS order.
DETECTORS = ("requeue_loop", "redelivery_after_close")

# The tables `detect` reads, with the schema each must carry (extra columns are ignored).
INPUTS = {
    "deliveries": schema.DELIVERIES,
    "frames": schema.FRAMES,
    "connections": schema.CONNECTIONS,
}


def detect(tables: dict[str, DataFrame], thresholds: Thresholds | None = None, kinds=DETECTORS) -> DataFrame:
    """Every finding of these kinds in `tables` (keys as in INPUTS; others are ignored), as a
    DataFrame of spark_schema(schema.FINDINGS)."""
    return finished_findings(raw_findings(tables, thresholds, kinds), tables["frames"])


def raw_findings(tables: dict[str, DataFrame], thresholds: Thresholds | None = None, kinds=DETECTORS) -> DataFrame:
    """`detect`'s findings before their packets (connection_pass.RAW_FINDINGS)."""
    check_inputs(tables)
    found = found_in(tables["deliveries"], tables["connections"], thresholds if thresholds is not None else Thresholds())
    return as_rows(tables["deliveries"].sparkSession, found, kinds)


def found_in(deliveries: DataFrame, connections: DataFrame, thresholds: Thresholds) -> FoundAcross:
    """cross_connection_findings.findings_across of these Spark tables, every candidate counted as
    changed: the candidates picked by the one rule in Spark's tasks, gathered in the driver."""
    def facts(ids: set[str]) -> dict[str, dict]:
        return connection_facts(connections.where(F.col("connection_id").isin(sorted(ids)))
                                .select(*CONNECTION_COLUMNS).toArrow())

    return findings_across(picked_candidates(deliveries), None, facts, thresholds)


def picked_candidates(deliveries: DataFrame) -> pa.Table:
    """The candidate deliveries (the one rule, analyzer.detectors.messages.candidates, in Spark's
    tasks), in the driver: their COLUMNS. One Spark job."""
    rows = deliveries.select(*COLUMNS)

    def picked(batches):
        for batch in batches:
            yield batch.filter(candidates(batch))

    return rows.mapInArrow(picked, rows.schema).toArrow()


def as_rows(spark, found: FoundAcross, kinds=DETECTORS) -> DataFrame:
    """The raw findings of these kinds as a Spark table (connection_pass.RAW_FINDINGS)."""
    raw = found.raw
    if set(kinds) != set(DETECTORS):
        raw = raw.filter(pa.array([json.loads(f)["kind"] in kinds for f in raw["finding"].to_pylist()], pa.bool_()))
    return spark.createDataFrame(raw.combine_chunks(), spark_schema(RAW_FINDINGS))


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
