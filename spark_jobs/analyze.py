"""The analysis job, run the same by `ackscope analyze` and `spark-submit spark_jobs/job.py`: plan,
choose the executor, the pass, the per-connection tables, the findings, the run logged last (a run cut
short is simply done again by the next). docs/architecture.md, "The analysis pipeline", walks
through it; every step after the pass is this one code for both executors.
"""

from __future__ import annotations

import os
import time
import uuid
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from datetime import date, datetime, timezone
from typing import TextIO

import pyarrow as pa
from pyspark.sql import SparkSession

from analyzer import schema
from analyzer.connection_analysis import Settings
from analyzer.detectors.thresholds import Thresholds
from analyzer.lake import TableWriter, open_table, read_table
from analyzer.published import RUNS_TABLE, finished_runs
from analyzer.timeline.records import DEFAULT_OVERDUE_NS

from spark_jobs import carried_pass
from spark_jobs.compaction import compact, merge_analysed_input, small_final_files
from spark_jobs.connection_pass import RAW_FINDINGS, STATE_TABLE, WRITTEN_TABLES, PassSummary
from spark_jobs.delta_io import Replacement, Rewrite, connections_match, replace_all, rewrite_all
from spark_jobs.findings import Changed, refresh_findings
from spark_jobs.local_executor import DRIVER_FRAMES, LocalExecutor
from spark_jobs.provisional import PROVISIONAL, last_written_by_finished_run
from spark_jobs.run_scope import COMPLETE_SCOPES, FULL, NEW_DATA, RunScope, plan_run, set_aside_damaged, thresholds_json
from spark_jobs.session import commit_tag, commits_tagged
from spark_jobs.spark_executor import SparkExecutor
from spark_jobs.steps import Steps
from spark_jobs.table_files import commit, distinct_strings, files_to_read
from spark_jobs.timeline.tables import CHANNEL_METRICS, TIMELINE_TABLES
from spark_jobs.wide_writes import FILE_FLAGS

NO_SPARK = LocalExecutor.delta_mode  # the delta_mode of a run that did not start Spark
OUTPUT_TABLES = {**TIMELINE_TABLES, "channel_metrics": CHANNEL_METRICS, "findings": schema.FINDINGS}
# Kept per connection: a run replaces the rows of the connections it analysed.
PER_CONNECTION_TABLES = [*TIMELINE_TABLES, "channel_metrics"]
# The columns of theirs a scoped run relies on (provisional.py, requeue_related.py): run_scope.plan_run.
FLAGGED_TABLES = {name: tuple(flag for flag in FILE_FLAGS if flag in OUTPUT_TABLES[name].names)
                  for name in PER_CONNECTION_TABLES}


@dataclass
class AnalysisReport:
    lake: str
    delta_mode: str                     # how Spark reached the tables: native or bridge (NO_SPARK: it did not)
    scope: str = FULL
    reason: str = ""
    frames_version: int | None = None
    frames: int = 0                     # frame rows this run read from `frames` for its connections
    connections: int = 0                # connections analysed by this run
    carried_connections: int = 0        # of those, carried on from their checkpoints (only their new frames read)
    carried_records: int = 0            # records their checkpoints held (open items, the boundary bucket's)
    rows: dict = field(default_factory=dict)   # rows written per table (per-connection tables: for those connections)
    findings_by_kind: dict = field(default_factory=dict)   # the whole findings table after the run
    findings_by_severity: dict = field(default_factory=dict)
    seconds: float = 0.0
    seconds_by_step: dict = field(default_factory=dict)
    spark_jobs: int = 0                 # Spark jobs the run started
    files_compacted: dict = field(default_factory=dict)   # small files merged, per table (compaction.py)
    input_files_merged: dict = field(default_factory=dict)  # frames and connections files merged after the run

    def as_json(self) -> dict:
        return dict(self.__dict__)


@dataclass(frozen=True)
class _Run:
    lake: str
    run_id: str
    plan: RunScope
    keys: list[str] | None              # the connections in scope; None: all of them (a full run)
    settings: Settings
    executor: LocalExecutor | SparkExecutor
    steps: Steps
    delta_mode: str                     # as asked for (auto, native, bridge)


def planned_run(lake: str, since: str | None, until: str | None, full: bool, bucket_seconds: int, overdue_ns: int,
                thresholds: Thresholds) -> RunScope:
    """What a run with these options would analyse now (run_scope.py), without Spark."""
    return plan_run(lake, since, until, full, bucket_seconds, overdue_ns, thresholds, [*OUTPUT_TABLES, STATE_TABLE],
                    flagged_tables=FLAGGED_TABLES)


def local_takes(plan: RunScope, up_to: int | None = None) -> bool:
    """Is the run the local executor's, where the machine the run was given is this one: nothing
    new, or at most `up_to` frame rows to read (the Delta log's count; None: DRIVER_FRAMES)?"""
    up_to = DRIVER_FRAMES if up_to is None else up_to
    return plan.nothing_new or (plan.rows_to_read is not None and plan.rows_to_read <= up_to)


def analyze(spark: SparkSession | Callable[[], SparkSession] | None, lake: str, since: str | None = None,
            until: str | None = None, delta_mode: str = "auto", thresholds: Thresholds | None = None,
            bucket_seconds: int = 10, overdue_ns: int = DEFAULT_OVERDUE_NS, full: bool = False,
            progress: TextIO | None = None, plan: RunScope | None = None, local: bool = False,
            local_up_to: int | None = None) -> AnalysisReport:
    """One run. `spark`: a session, a function that starts one (called only when a run needs it), or
    None: the local executor makes the run. `local`: the machine is this one (a local master), so the
    local executor makes the runs `local_takes` says. `plan`: planned_run's with these same options,
    when the caller planned already (frames appended since wait for the next run)."""
    started = time.monotonic()
    settings = Settings(bucket_seconds, overdue_ns, thresholds if thresholds is not None else Thresholds())
    set_aside: list[str] = []
    while True:
        attempt = time.monotonic()
        try:
            if plan is None:
                plan = planned_run(lake, since, until, full, bucket_seconds, overdue_ns, settings.thresholds)
            keys = None if plan.scope == FULL else _connections_in_scope(lake, plan)
            if spark is None or (local and local_takes(plan, local_up_to)):
                executor = LocalExecutor(lake, plan, settings)
            else:
                session = spark if isinstance(spark, SparkSession) else spark()
                executor = SparkExecutor(session, lake, plan, settings, delta_mode)
            run_id = uuid.uuid4().hex
            with commits_tagged(run_id):  # every commit of the run names it (provisional.py)
                return _run(_Run(lake, run_id, plan, keys, settings, executor, Steps(executor.spark, progress),
                                 delta_mode), attempt, started)
        except Exception as error:
            plan = _whole_after_damage(lake, error, set_aside, settings, progress)
            if plan is None:
                raise


def _whole_after_damage(lake: str, error: Exception, set_aside: list[str], settings: Settings,
                        progress: TextIO | None) -> RunScope | None:
    """After a run failed on a damaged data file of a table the analysis writes (docs/analysis.md,
    "Incremental": Damaged tables): that table set aside and the plan of a whole analysis; None
    where the failure was another. After as many tables as the analysis writes, the next failure is
    raised (a disk that damages every file written is not written to forever)."""
    written = [*OUTPUT_TABLES, STATE_TABLE, RUNS_TABLE]
    note = set_aside_damaged(lake, error, written) if len(set_aside) < len(written) else None
    if note is None:
        return None
    set_aside.append(note)
    if progress is not None:
        print(f"ackscope analyze: {note}: the run is made again, as a whole analysis", file=progress, flush=True)
    plan = planned_run(lake, None, None, True, settings.bucket_seconds, settings.overdue_ns, settings.thresholds)
    also = "" if plan.reason == "asked for (--full)" else f"; {plan.reason}"
    return replace(plan, reason="; ".join(set_aside) + ": rebuilt by a whole analysis" + also)


def _run(run: _Run, attempt_started: float, run_started: float) -> AnalysisReport:
    started_ts = datetime.now(timezone.utc)
    plan = run.plan
    # What the run is about to do, said before it does it (a watcher knows a run is under way).
    detail = f"{plan.scope}, " + ("every connection" if run.keys is None else f"{len(run.keys)} connection(s)")
    if run.executor.spark is None:
        detail += ": no Spark" if run.keys == [] else ": analysed by the driver"
    run.steps.took("plan", time.monotonic() - attempt_started, detail=detail)
    report = AnalysisReport(lake=run.lake, delta_mode=run.executor.delta_mode, scope=plan.scope, reason=plan.reason,
                            frames_version=plan.frames_version)
    if run.keys == []:
        report.reason += "; nothing to analyse"
        _count_findings(run.lake, report)
        if not plan.nothing_new:  # new files without a connection's frames, or days: logged
            _log_run(run, report, started_ts)
    else:
        own, changed, carried = _per_connection_tables(run, report)
        with ThreadPoolExecutor(1) as beside:
            # A scoped run's small files are merged while the findings step, which only reads these tables
            # (and never writes analysis_runs), runs (delta-spark's tables are left to its OPTIMIZE).
            merged = (beside.submit(_compacted, run.lake, [*PER_CONNECTION_TABLES, RUNS_TABLE], commit_tag())
                      if run.keys is not None and "native" not in (run.delta_mode, run.executor.delta_mode) else None)
            with run.steps.step("findings"):
                if carried is not None:
                    changed = Changed((carried_pass.changed(carried, run.lake),), changed.whole)
                refresh_findings(run.lake, own, run.keys, changed, run.settings.thresholds, plan.new_files,
                                 plan.frames_version)
                report.rows["findings"] = _count_findings(run.lake, report)
            if merged is not None:  # in a step only a run with something to merge has: what it waited for
                compacting = time.monotonic()
                report.files_compacted = {**merged.result(), **_compacted(run.lake, ["findings"], commit_tag())}
                if report.files_compacted:
                    run.steps.took("compact tables", time.monotonic() - compacting)
        _log_run(run, report, started_ts)
    report.seconds = round(time.monotonic() - run_started, 2)
    report.seconds_by_step, report.spark_jobs = run.steps.seconds, run.steps.spark_jobs()
    return report


def _per_connection_tables(run: _Run, report: AnalysisReport) -> tuple[pa.Table, Changed | None,
                                                                       PassSummary | None]:
    """The per-connection tables of the run's connections written, and what the findings step is
    handed: their raw findings about one connection, the delivery rows changed (None: every stored
    candidate), and the carried pass whose changed rows it reads, where it carried some on."""
    if run.keys is None:
        with run.steps.step("timelines"):
            summary = run.executor.connection_pass(None)
            report.frames, report.connections = summary.frames, summary.connections
        with run.steps.step("write tables"):
            for name, table_schema in WRITTEN_TABLES.items():
                commit(os.path.join(run.lake, name), table_schema, summary.written.get(name, []), schema.PARTITION_BY,
                       mode="overwrite", tag=commit_tag())
            report.rows = {name: summary.rows[name] for name in PER_CONNECTION_TABLES}
        # No delivery came back: the message kinds have nothing to start from.
        return summary.raw_findings, None if summary.came_back else Changed(), None
    carried, ahead = None, {}
    to_carry = sorted(set(run.keys) - set(run.plan.whole))   # the rest: planned whole (run_scope.RunScope.whole)
    if run.plan.scope == NEW_DATA and to_carry:
        with run.steps.step("carry on from checkpoints"):
            carried, ahead = _carried_with_rewrites(run, to_carry)
            report.carried_connections, report.carried_records = carried.connections, carried.carried_records
            if carried.fallbacks:
                report.reason += f"; {len(carried.fallbacks)} connection(s) analysed whole: " + "; ".join(
                    f"{k}: {why}" for k, why in sorted(carried.fallbacks.items())[:5])
    whole_keys = run.keys if carried is None else sorted({*run.plan.whole, *carried.fallbacks})
    summary = None
    if whole_keys:
        for rewrite in ahead.values():  # made for carried connections only
            rewrite.discard()
        ahead = {}
        with run.steps.step("timelines"):
            summary = run.executor.connection_pass(whole_keys)
    passes = [part for part in (summary, carried) if part is not None]
    report.frames, report.connections = sum(part.frames for part in passes), sum(part.connections for part in passes)
    written = {name: [add for part in passes for add in part.written.get(name, [])] for name in WRITTEN_TABLES}
    replaced = [connections_match(whole_keys)] if whole_keys else []
    with run.steps.step("write tables"):
        # The tables rewritten `ahead` are written by their commit alone.
        replace_all(run.lake, {
            name: Replacement(None, WRITTEN_TABLES[name],
                              replaced + (carried_pass.replaced(carried, run.lake, name) if carried else []))
            for name in written if name not in ahead}, written=written)
        for name, rewrite in ahead.items():
            rewrite.commit(written[name])
        report.rows = {name: sum(part.rows[name] for part in passes) for name in PER_CONNECTION_TABLES}
    own = pa.concat_tables([RAW_FINDINGS.empty_table(), *[part.raw_findings for part in passes]])
    # Of the connections analysed whole, every delivery row: the findings step reads them from the table.
    whole = tuple(whole_keys) if summary is not None and summary.rows["deliveries"] else ()
    return own, Changed((), whole), carried if carried is not None and carried.connections else None


def _carried_with_rewrites(run: _Run, keys: list[str]) -> tuple[PassSummary, dict[str, Rewrite]]:
    """The carried pass, and beside it, where none of the run's connections is planned whole, the files
    holding the rows it replaces rewritten (docs/analysis.md, "Incremental": A carried run's writes are commits)."""
    if run.plan.whole:
        return run.executor.connection_pass(keys, carried=True), {}
    with ThreadPoolExecutor(1) as beside:
        rewriting = beside.submit(lambda: rewrite_all(run.lake, _replaced_ahead(run.lake, run.keys)))
        try:
            carried = run.executor.connection_pass(keys, carried=True)
        except BaseException:
            if rewriting.exception() is None:   # waits for it
                for rewrite in rewriting.result().values():
                    rewrite.discard()
            raise
    return carried, rewriting.result()


def _replaced_ahead(lake: str, keys: list[str]) -> dict[str, Replacement]:
    """What a run that carries every one of `keys` on replaces: their analysis_state rows, and
    their provisional rows in the tables with no commit since a finished run's (provisional.py)."""
    finished = finished_runs(lake)
    # No rows: the pass writes them all as files, committed with the rewrite.
    replacements = {name: Replacement(None, WRITTEN_TABLES[name], [connections_match(keys, **{PROVISIONAL: (True,)})],
                                      provisional_only=True)
                    for name in PER_CONNECTION_TABLES if last_written_by_finished_run(open_table(lake, name), finished)}
    replacements[STATE_TABLE] = Replacement(None, schema.ANALYSIS_STATE, [connections_match(keys)])
    return replacements


def _compacted(lake: str, names: list[str], tag: str | None) -> dict[str, int]:
    """Small files merged where enough have gathered in one of these tables (compaction.py), per
    table merged. No Spark job: it may run beside other steps (each table's files and commit are its own)."""
    groups = {name: found for name in names if (found := small_final_files(lake, name)).groups}
    return {name: compact(lake, name, found, tag) for name, found in groups.items()}


def _connections_in_scope(lake: str, plan: RunScope) -> list[str]:
    """Listed by the driver from one column of the frames files that hold them, no Spark job: a
    scheduled run's new files; a days run's files of those days in its snapshot of `frames`."""
    if plan.scope == NEW_DATA:
        return sorted({*distinct_strings(plan.new_files, "connection_id"), *plan.whole})
    frames = open_table(lake, "frames")
    frames.load_as_version(plan.frames_version)
    since, until = (None if day is None else date.fromisoformat(day).isoformat() for day in (plan.since, plan.until))
    return distinct_strings(files_to_read(frames, os.path.join(lake, "frames"), since, until).files, "connection_id")


def _log_run(run: _Run, report: AnalysisReport, started_ts: datetime) -> None:
    plan, settings = run.plan, run.settings
    row = {"date": started_ts.date().isoformat(), "run_id": run.run_id, "started_ts": started_ts,
           "finished_ts": datetime.now(timezone.utc), "scope": plan.scope, "reason": report.reason,
           "since": plan.since, "until": plan.until, "frames_version": plan.frames_version,
           "baseline_version": plan.baseline_version, "connections": report.connections, "frames": report.frames,
           "bucket_seconds": settings.bucket_seconds, "overdue_ns": settings.overdue_ns,
           "thresholds": thresholds_json(settings.thresholds)}
    writer = TableWriter(run.lake, RUNS_TABLE, schema.ANALYSIS_RUNS)
    writer.write(pa.Table.from_pylist([row], schema=schema.ANALYSIS_RUNS))
    writer.commit(run.run_id)
    if plan.scope not in COMPLETE_SCOPES:
        return
    # Only now that the run is logged (one cut short merged nothing, so its rerun stays scoped): the small
    # files of the input it analysed merged, so that the agent, which merges only files older than its
    # --compact-min-age, finds none and its sidecar never pays a merge's memory. A failure waits for the next run.
    started = time.monotonic()
    try:
        report.input_files_merged = merge_analysed_input(run.lake, plan.frames_version, run.run_id)
        said = ", ".join(f"{name} {n} small files" for name, n in report.input_files_merged.items())
    except Exception as error:
        said = f"not done, left to the next run: {type(error).__name__}: {error}"
    if said:
        run.steps.took("merge input files", time.monotonic() - started, detail=said)


def _count_findings(lake: str, report: AnalysisReport) -> int:
    """The findings table as stored, by kind and severity (small: read without Spark); its rows."""
    stored = read_table(lake, "findings", schema.FINDINGS, columns=["kind", "severity"])
    if stored is None:
        return 0
    report.findings_by_kind = dict(Counter(stored["kind"].to_pylist()))
    report.findings_by_severity = dict(Counter(stored["severity"].to_pylist()))
    return stored.num_rows


def render_report(report: AnalysisReport) -> str:
    access = "Spark not started" if report.delta_mode == NO_SPARK else f"{report.delta_mode} Delta access"
    lines = [f"analysed {report.frames:,} frame rows of {report.connections} connection(s) in {report.lake} "
             f"({access}, {report.seconds:.1f}s, {report.spark_jobs} Spark jobs)",
             f"  carried on from checkpoints: {report.carried_connections} connection(s), only their new frames read "
             f"({report.carried_records:,} open or boundary records carried)",
             f"  scope: {report.scope} ({report.reason}); frames version {report.frames_version}"]
    if report.rows:
        lines.append("  wrote " + ", ".join(f"{name} {n:,}" for name, n in report.rows.items()))
    if report.files_compacted:
        lines.append("  compacted: " + ", ".join(f"{name} {n} small files merged"
                                                 for name, n in report.files_compacted.items()))
    if report.input_files_merged:
        lines.append("  merged after the run: " + ", ".join(f"{name} {n} small files"
                                                            for name, n in report.input_files_merged.items()))
    if report.findings_by_kind:
        lines.append("  findings: " + ", ".join(f"{k} {n}" for k, n in sorted(report.findings_by_kind.items())))
    else:
        lines.append("  findings: none")
    return "\n".join(lines)

