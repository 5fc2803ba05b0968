"""The analysis job: frames and connections in; deliveries, publishes, channels, violations,
channel_metrics and findings out, as Delta tables of the same lake.

The thin I/O shell around pure transforms (timeline/, detectors/, channel_metrics.py). Runs the
same from `ackscope analyze` and from `spark-submit spark_jobs/analyze.py --lake ...` on a cluster.

Each run recomputes its range of days and replaces the output tables in one commit each.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field

from pyspark.sql import SparkSession

from analyzer import schema
from analyzer.timeline.records import DEFAULT_OVERDUE_NS

from .channel_metrics import channel_metrics
from .delta_io import read_delta, write_delta
from .detectors import detect
from .session import delta_mode as resolve_delta_mode
from .thresholds import Thresholds
from .timeline import materialised, routed_timelines
from .timeline.tables import TIMELINE_TABLES

OUTPUT_TABLES = {**TIMELINE_TABLES, "channel_metrics": schema.CHANNEL_METRICS, "findings": schema.FINDINGS}


@dataclass
class AnalysisReport:
    lake: str
    delta_mode: str
    frames: int = 0
    connections: int = 0
    reference_connections: int = 0      # replayed by the reference model (gaps, mid-stream, tx, ...)
    rows: dict = field(default_factory=dict)
    findings_by_kind: dict = field(default_factory=dict)
    findings_by_severity: dict = field(default_factory=dict)
    seconds: float = 0.0

    def as_json(self) -> dict:
        return dict(self.__dict__)


def analyze(spark: SparkSession, lake: str, since: str | None = None, until: str | None = None,
            delta_mode: str = "auto", thresholds: Thresholds | None = None, bucket_seconds: int = 10,
            overdue_ns: int = DEFAULT_OVERDUE_NS) -> AnalysisReport:
    started = time.monotonic()
    mode = resolve_delta_mode(spark, delta_mode)
    report = AnalysisReport(lake=lake, delta_mode=mode)
    frames = read_delta(spark, lake, "frames", schema.FRAMES, mode, since, until)
    connections = read_delta(spark, lake, "connections", schema.CONNECTIONS, mode)
    timelines, irregular = routed_timelines(frames, overdue_ns)
    # Every output reads the timelines again: compute them once.
    tables = {name: materialised(df) for name, df in timelines.items()}
    tables["channel_metrics"] = materialised(channel_metrics(tables["deliveries"], tables["publishes"],
                                                          tables["channels"], bucket_seconds))
    tables["findings"] = materialised(detect({**tables, "frames": frames, "connections": connections}, thresholds))
    for name, df in tables.items():
        write_delta(df, lake, name, OUTPUT_TABLES[name], mode="overwrite", delta_mode=mode)
        report.rows[name] = df.count()
    report.frames = frames.count()
    report.connections = frames.select("connection_id").distinct().count()
    report.reference_connections = irregular.count()
    findings = tables["findings"]
    report.findings_by_kind = {r["kind"]: r["count"] for r in findings.groupBy("kind").count().collect()}
    report.findings_by_severity = {r["severity"]: r["count"] for r in findings.groupBy("severity").count().collect()}
    report.seconds = round(time.monotonic() - started, 2)
    return report


def render_report(report: AnalysisReport) -> str:
    lines = [f"analysed {report.frames:,} frame rows of {report.connections} connection(s) in {report.lake} "
             f"({report.delta_mode} Delta access, {report.seconds:.1f}s; "
             f"{report.reference_connections} connection(s) through the reference model)"]
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
