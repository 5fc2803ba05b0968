"""The analysis job: frames and connections in; deliveries, publishes, channels, violations,
channel_metrics and findings out, as Delta tables of the same lake.

The thin I/O shell around pure transforms (timeline/, detectors/, channel_metrics.py). Runs the
same from `ackscope analyze` and from `spark-submit spark_jobs/analyze.py --lake ...` on a cluster.

A run analyses the connections with frames it has not seen (run_scope.py says which and why) and
replaces their rows in the per-connection tables, each table in one commit; then it computes again
the findings those rows can change (detectors/scoped.py), or all of them on a full run. The run is
logged in `analysis_runs` last: a run cut short is simply done again by the next one.
"""

from __future__ import annotations

import sys
import time
from collections import Counter
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from analyzer import schema
from analyzer.lake import TableWriter, read_table
from analyzer.timeline.records import DEFAULT_OVERDUE_NS

from .channel_metrics import NS_PER_SECOND, channel_metrics
from .delta_io import Match, read_delta, read_files, replace_matching, write_delta
from .incremental import carry_on_connections
from .detectors import detect
from .detectors.scoped import rescoped_findings
from .run_scope import DAYS, FULL, NEW_DATA, RUNS_TABLE, RunScope, plan_run, thresholds_json
from .session import delta_mode as resolve_delta_mode
from .thresholds import Thresholds
from .timeline import materialised, routed_timelines
from .timeline.carried import STATE_TABLE, checkpoints
from .timeline.tables import TIMELINE_TABLES

OUTPUT_TABLES = {**TIMELINE_TABLES, "channel_metrics": schema.CHANNEL_METRICS, "findings": schema.FINDINGS}
# Kept per connection: a run replaces the rows of the connections it analysed.
PER_CONNECTION_TABLES = [*TIMELINE_TABLES, "channel_metrics"]


@dataclass
class AnalysisReport:
    lake: str
    delta_mode: str
    scope: str = FULL
    reason: str = ""
    frames_version: int | None = None
    frames: int = 0                     # frame rows this run read from `frames` for its connections
    connections: int = 0                # connections analysed by this run
    carried_connections: int = 0        # of those, carried on from their checkpoint (only their new frames read)
    carried_records: int = 0            # records their checkpoints held (open items, the boundary bucket's)
    reference_connections: int = 0      # analysed whole and replayed by the reference model (gaps, mid-stream, tx, ...)
    rows: dict = field(default_factory=dict)   # rows written per table (per-connection tables: for those connections)
    findings_by_kind: dict = field(default_factory=dict)   # the whole findings table after the run
    findings_by_severity: dict = field(default_factory=dict)
    seconds: float = 0.0

    def as_json(self) -> dict:
        return dict(self.__dict__)


def analyze(spark: SparkSession, lake: str, since: str | None = None, until: str | None = None,
            delta_mode: str = "auto", thresholds: Thresholds | None = None, bucket_seconds: int = 10,
            overdue_ns: int = DEFAULT_OVERDUE_NS, full: bool = False) -> AnalysisReport:
    """One run: plan its scope (run_scope.py); carry the connections with new frames on from their
    checkpoints, or analyse them whole where that cannot be done exactly; patch or replace their
    rows; then the findings they can change (all of them on a full run or new thresholds)."""
    started, started_ts = time.monotonic(), datetime.now(timezone.utc)
    thresholds = thresholds if thresholds is not None else Thresholds()
    mode = resolve_delta_mode(spark, delta_mode)
    plan = plan_run(lake, since, until, full, bucket_seconds, overdue_ns, thresholds, [*OUTPUT_TABLES, STATE_TABLE])
    report = AnalysisReport(lake=lake, delta_mode=mode, scope=plan.scope, reason=plan.reason,
                            frames_version=plan.frames_version)
    all_frames = read_delta(spark, lake, "frames", schema.FRAMES, mode, version=plan.frames_version)
    connections = read_delta(spark, lake, "connections", schema.CONNECTIONS, mode)
    keys = None if plan.scope == FULL else _connections_in_scope(spark, lake, plan, mode)
    if keys == [] and not plan.findings_stale:
        report.reason += "; nothing to analyse"
        _count_findings(lake, report)
        if plan.new_files or plan.scope != NEW_DATA:
            _log_run(lake, plan, report, started_ts, bucket_seconds, overdue_ns, thresholds)
        return _finished(report, started)

    tables = {}
    if keys is None or keys:
        bucket_ns = bucket_seconds * NS_PER_SECOND
        carried = carry_on_connections(spark, lake, plan.new_files, keys, mode, bucket_ns, bucket_seconds,
                                       overdue_ns, plan.frames_version) if plan.scope == NEW_DATA else None
        if carried is not None:
            report.frames, report.connections = carried.frames, carried.connections
            report.carried_connections, report.carried_records = carried.connections, carried.records
            if carried.fallbacks:
                report.reason += f"; {len(carried.fallbacks)} connection(s) analysed whole: " + "; ".join(
                    f"{k}: {why}" for k, why in sorted(carried.fallbacks.items())[:5])
        whole_keys = keys if carried is None else carried.whole_keys
        outputs = {name: [] for name in [*PER_CONNECTION_TABLES, STATE_TABLE]}
        if whole_keys is None or whole_keys:
            frames = all_frames if whole_keys is None else _frames_of(spark, lake, whole_keys, connections, plan, mode)
            tables, irregular = _whole(frames, overdue_ns, bucket_seconds)
            report.reference_connections = irregular.count()
            tables[STATE_TABLE] = materialised(checkpoints(frames, bucket_ns, overdue_ns, plan.frames_version))
            for name in outputs:
                outputs[name].append(tables[name])
            counted = frames.agg(F.count(F.lit(1)).alias("frames"),
                                 F.countDistinct("connection_id").alias("ids")).first()
            report.frames += counted["frames"]
            report.connections += counted["ids"]
        if carried is not None:
            for name in outputs:
                outputs[name].append(carried.tables[name])
        wanted = None if whole_keys is None else spark.createDataFrame([(k,) for k in whole_keys], "connection_id string")
        for name, parts in outputs.items():
            rows = parts[0]
            for part in parts[1:]:
                rows = rows.unionByName(part)
            table_schema = OUTPUT_TABLES.get(name, schema.ANALYSIS_STATE)
            if keys is None:
                write_delta(rows, lake, name, table_schema, mode="overwrite", delta_mode=mode)
            else:
                matches = [Match(wanted, ("connection_id",))] if whole_keys else []
                matches += carried.matches[name] if carried is not None else []
                replace_matching(rows, lake, name, table_schema, matches, delta_mode=mode)
            if name != STATE_TABLE:
                report.rows[name] = rows.count()
    stored = tables if keys is None else {name: read_delta(spark, lake, name, OUTPUT_TABLES[name], mode)
                                         for name in TIMELINE_TABLES}
    inputs = {**stored, "frames": all_frames, "connections": connections}
    if keys and not plan.findings_stale:
        analysed = spark.createDataFrame([(k,) for k in keys], "connection_id string")
        rescoped = rescoped_findings(inputs, analysed, _frames_of(spark, lake, keys, connections, plan, mode),
                                     thresholds)
        replace_matching(materialised(rescoped.findings), lake, "findings", schema.FINDINGS, rescoped.replaces,
                         delta_mode=mode)
    else:
        findings = materialised(detect(inputs, thresholds))
        write_delta(findings, lake, "findings", schema.FINDINGS, mode="overwrite", delta_mode=mode)
    report.rows["findings"] = _count_findings(lake, report)
    _log_run(lake, plan, report, started_ts, bucket_seconds, overdue_ns, thresholds)
    return _finished(report, started)


def _whole(frames: DataFrame, overdue_ns: int, bucket_seconds: int) -> tuple[dict[str, DataFrame], DataFrame]:
    """The per-connection tables of these connections from all their frames, and the connections
    the reference model replayed."""
    timelines, irregular = routed_timelines(frames, overdue_ns)
    # Every output reads the timelines again: compute them once.
    tables = {name: materialised(df) for name, df in timelines.items()}
    tables["channel_metrics"] = materialised(channel_metrics(tables["deliveries"], tables["publishes"],
                                                          tables["channels"], bucket_seconds))
    return tables, irregular


def _connections_in_scope(spark: SparkSession, lake: str, plan: RunScope, mode: str) -> list[str]:
    if plan.scope == NEW_DATA:
        ids = read_files(spark, lake, "frames", plan.new_files, ["connection_id"])
    elif plan.scope == DAYS:
        ids = read_delta(spark, lake, "frames", schema.FRAMES, mode, plan.since, plan.until,
                         version=plan.frames_version).select("connection_id")
    else:
        raise ValueError(f"scope {plan.scope!r} has no list of connections")
    return sorted(r["connection_id"] for r in ids.where(F.col("connection_id").isNotNull()).distinct().collect())


def _frames_of(spark: SparkSession, lake: str, keys: list[str], connections: DataFrame, plan: RunScope,
               mode: str) -> DataFrame:
    """Every frame of these connections: from the first day any of them was seen (the connections
    table says), else from the start."""
    wanted = spark.createDataFrame([(k,) for k in keys], "connection_id string")
    seen = (connections.join(F.broadcast(wanted), on="connection_id", how="inner")
            .agg(F.countDistinct("connection_id").alias("known"), F.min("first_ts_ns").alias("first_ns")).first())
    first_day = None
    if seen["known"] == len(keys) and seen["first_ns"] is not None:
        first_day = datetime.fromtimestamp(seen["first_ns"] // 10**9, timezone.utc).date().isoformat()
    frames = read_delta(spark, lake, "frames", schema.FRAMES, mode, since=first_day, version=plan.frames_version)
    return frames.join(F.broadcast(wanted), on="connection_id", how="left_semi")


def _log_run(lake: str, plan: RunScope, report: AnalysisReport, started_ts: datetime, bucket_seconds: int,
             overdue_ns: int, thresholds: Thresholds) -> None:
    finished_ts = datetime.now(timezone.utc)
    row = {"date": started_ts.date().isoformat(), "run_id": uuid.uuid4().hex, "started_ts": started_ts,
           "finished_ts": finished_ts, "scope": plan.scope, "reason": report.reason, "since": plan.since,
           "until": plan.until, "frames_version": plan.frames_version, "baseline_version": plan.baseline_version,
           "connections": report.connections, "frames": report.frames, "bucket_seconds": bucket_seconds,
           "overdue_ns": overdue_ns, "thresholds": thresholds_json(thresholds)}
    writer = TableWriter(lake, RUNS_TABLE, schema.ANALYSIS_RUNS)
    writer.write(pa.Table.from_pylist([row], schema=schema.ANALYSIS_RUNS))
    writer.commit(row["run_id"])


def _count_findings(lake: str, report: AnalysisReport) -> int:
    """The findings table as stored, by kind and severity (small: read without Spark); its rows."""
    stored = read_table(lake, "findings", schema.FINDINGS, columns=["kind", "severity"])
    if stored is None:
        return 0
    report.findings_by_kind = dict(Counter(stored["kind"].to_pylist()))
    report.findings_by_severity = dict(Counter(stored["severity"].to_pylist()))
    return stored.num_rows


def _finished(report: AnalysisReport, started: float) -> AnalysisReport:
    report.seconds = round(time.monotonic() - started, 2)
    return report


def render_report(report: AnalysisReport) -> str:
    lines = [f"analysed {report.frames:,} frame rows of {report.connections} connection(s) in {report.lake} "
             f"({report.delta_mode} Delta access, {report.seconds:.1f}s; "
             f"{report.reference_connections} connection(s) through the reference model)",
             f"  carried on from checkpoints: {report.carried_connections} connection(s), only their new frames read "
             f"({report.carried_records:,} open or boundary records carried)",
             f"  scope: {report.scope} ({report.reason}); frames version {report.frames_version}"]
    if report.rows:
        lines.append("  wrote " + ", ".join(f"{name} {n:,}" for name, n in report.rows.items()))
    if report.findings_by_kind:
        lines.append("  findings: " + ", ".join(f"{k} {n}" for k, n in sorted(report.findings_by_kind.items())))
    else:
        lines.append("  findings: none")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """spark-submit entry point: the same options as `ackscope analyze`."""
    from analyzer.cli import main as cli_main
    return cli_main(["analyze", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
