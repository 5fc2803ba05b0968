"""The analysis job: frames and connections in; deliveries, publishes, channels, violations,
channel_metrics and findings out, as Delta tables of the same lake. Runs the same from `ackscope
analyze` and from `spark-submit spark_jobs/job.py --lake ...` on a cluster.

One run, top to bottom (`analyze`): plan (run_scope.py: which connections, and why) and choose the
executor (`local_takes`: the local one, local_executor.py, in this process without a JVM; or
Spark's, spark_executor.py); the pass, every connection through the reference state machine
(connection_pass.py), carried on from its checkpoint over its new frames (carried_pass.py) or
analysed whole; their rows replaced in the per-connection tables, each table in one commit; the
findings those rows can change, across connections (findings.py), or all of them on a full run;
the run logged in `analysis_runs`, last: a run cut short is simply done again by the next one.
The executors only read and move rows: every step after the pass is the same code for both.
"""

from __future__ import annotations

import os
import time
import uuid
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
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

from spark_jobs import local_executor
from spark_jobs.compaction import compact, merge_analysed_input, small_final_files
from spark_jobs.connection_pass import RAW_FINDINGS, STATE_TABLE, PassSummary
from spark_jobs.delta_io import Listed, Match, Replacement, Rewrite, connections_match, replace_all, rewrite_all
from spark_jobs.findings import Changed, refresh_findings
from spark_jobs.carried_pass import CarriedPass
from spark_jobs.local_executor import LocalExecutor
from spark_jobs.provisional import PROVISIONAL, last_written_by_finished_run
from spark_jobs.run_scope import (COMPLETE_SCOPES, DAYS, FULL, NEW_DATA, RunScope, plan_run, set_aside_damaged,
                                  thresholds_json)
from spark_jobs.session import commit_tag, commits_tagged
from spark_jobs.spark_executor import SparkExecutor
from spark_jobs.steps import Steps
from spark_jobs.table_files import commit, distinct_strings, files_to_read
from spark_jobs.timeline.tables import CHANNEL_METRICS, TIMELINE_TABLES
from spark_jobs.wide_writes import FILE_FLAGS

OUTPUT_TABLES = {**TIMELINE_TABLES, "channel_metrics": CHANNEL_METRICS, "findings": schema.FINDINGS}
# Kept per connection: a run replaces the rows of the connections it analysed.
PER_CONNECTION_TABLES = [*TIMELINE_TABLES, "channel_metrics"]
# Merged beside the findings step, which only reads them (and never writes analysis_runs).
COMPACTED_BESIDE_FINDINGS = [*PER_CONNECTION_TABLES, RUNS_TABLE]
# The columns of theirs a scoped run relies on (provisional.py, requeue_related.py): run_scope.plan_run.
FLAGGED_TABLES = {name: tuple(flag for flag in FILE_FLAGS if flag in OUTPUT_TABLES[name].names)
                  for name in PER_CONNECTION_TABLES}


NO_SPARK = LocalExecutor.delta_mode  # the delta_mode of a run that did not start Spark

Executor = LocalExecutor | SparkExecutor


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
    """What every step of one run reads: where, which snapshot and connections, with what settings,
    and the executor making its passes."""
    lake: str
    run_id: str
    plan: RunScope
    keys: list[str] | None              # the connections in scope; None: all of them (a full run)
    settings: Settings
    executor: Executor
    steps: Steps
    delta_mode: str                     # as asked for (auto, native, bridge)


def planned_run(lake: str, since: str | None, until: str | None, full: bool, bucket_seconds: int, overdue_ns: int,
                thresholds: Thresholds) -> RunScope:
    """What a run with these options would analyse now (run_scope.py), without Spark: its first
    step, which also chooses its executor (`local_takes`)."""
    return plan_run(lake, since, until, full, bucket_seconds, overdue_ns, thresholds, [*OUTPUT_TABLES, STATE_TABLE],
                    flagged_tables=FLAGGED_TABLES)


def local_takes(plan: RunScope, up_to: int | None = None) -> bool:
    """Is the run the local executor's, where the machine the run was given is this one: nothing
    new, or at most `up_to` frame rows to read (the Delta log's count; None: DRIVER_FRAMES)?"""
    up_to = local_executor.DRIVER_FRAMES if up_to is None else up_to
    return plan.nothing_new or (plan.rows_to_read is not None and plan.rows_to_read <= up_to)


def analyze(spark: SparkSession | Callable[[], SparkSession] | None, lake: str, since: str | None = None,
            until: str | None = None, delta_mode: str = "auto", thresholds: Thresholds | None = None,
            bucket_seconds: int = 10, overdue_ns: int = DEFAULT_OVERDUE_NS, full: bool = False,
            progress: TextIO | None = None, plan: RunScope | None = None, local: bool = False,
            local_up_to: int | None = None) -> AnalysisReport:
    """One run: plan its scope (run_scope.py) and choose its executor; carry the connections with
    new frames on from their checkpoints, or analyse them whole where that cannot be done exactly;
    replace their rows; then the findings they can change (all of them on a full run or new
    thresholds); log the run.

    `spark`: the session for the runs Spark's executor makes, or a function that starts one (called
    only when a run needs it), or None where the local executor is to make the run. `local`: the
    machine the run was given is this one (a local master): the local executor makes the runs
    `local_takes` says, of at most `local_up_to` frame rows (None: local_executor.DRIVER_FRAMES). `progress`: where one line per step goes (the command line: stderr). `plan`:
    planned_run's with these same options, when the caller planned the run already: the run
    analyses that snapshot; frames appended since wait for the next run. None: the run plans itself.
    A table the run reads found damaged inside its pages is set aside and the run made again as a
    whole analysis (`_whole_after_damage`)."""
    started = time.monotonic()
    settings = Settings(bucket_seconds, overdue_ns, thresholds if thresholds is not None else Thresholds())
    set_aside: list[str] = []
    while True:
        attempt = time.monotonic()
        try:
            if plan is None:
                plan = planned_run(lake, since, until, full, bucket_seconds, overdue_ns, settings.thresholds)
            keys = None if plan.scope == FULL else _connections_in_scope(lake, plan)
            executor = _executor(spark, lake, plan, settings, delta_mode, local and local_takes(plan, local_up_to))
            run_id = uuid.uuid4().hex
            with commits_tagged(run_id):  # every commit of the run names it (provisional.py)
                return _run(_Run(lake, run_id, plan, keys, settings, executor, Steps(executor.spark, progress),
                                 delta_mode), attempt, started)
        except Exception as error:
            plan = _whole_after_damage(lake, error, set_aside, settings, progress)
            if plan is None:
                raise


def _executor(spark: SparkSession | Callable[[], SparkSession] | None, lake: str, plan: RunScope,
              settings: Settings, delta_mode: str, local: bool) -> Executor:
    if spark is None or local:
        return LocalExecutor(lake, plan, settings)
    return SparkExecutor(spark if isinstance(spark, SparkSession) else spark(), lake, plan, settings, delta_mode)


def _whole_after_damage(lake: str, error: Exception, set_aside: list[str], settings: Settings,
                        progress: TextIO | None) -> RunScope | None:
    """After a run failed: where it failed reading a data file of a table the analysis writes,
    damaged inside its pages (which planning, reading footers only, let pass), that table set
    aside (run_scope.set_aside_damaged) and the plan of a whole analysis to make instead, its
    reason naming the table and file; None where the failure was another (raised again). A damaged
    file of the analysis' input raises run_scope.DamagedInput naming it. `set_aside`: the reasons
    of the tables set aside so far in this run; as many as the analysis writes tables, and the
    next failure is raised (a disk that damages every file written is not written to forever)."""
    written = [*OUTPUT_TABLES, STATE_TABLE, RUNS_TABLE]
    if len(set_aside) >= len(written):
        return None
    note = set_aside_damaged(lake, error, written)
    if note is None:
        return None
    set_aside.append(note)
    if progress is not None:
        print(f"ackscope analyze: {note}: the run is made again, as a whole analysis", file=progress, flush=True)
    plan = planned_run(lake, None, None, True, settings.bucket_seconds, settings.overdue_ns, settings.thresholds)
    also = "" if plan.reason == "asked for (--full)" else f"; {plan.reason}"
    return replace(plan, reason="; ".join(set_aside) + ": rebuilt by a whole analysis" + also)


def _run(run: _Run, started: float, report_started: float) -> AnalysisReport:
    """`started`: when this attempt's planning started; `report_started`: the run's (its seconds)."""
    started_ts = datetime.now(timezone.utc)
    plan = run.plan
    # What the run is about to do, said before it does it (a watcher knows a run is under way).
    detail = f"{plan.scope}, " + ("every connection" if run.keys is None else f"{len(run.keys)} connection(s)")
    if run.executor.spark is None:
        detail += ": no Spark" if run.keys == [] else ": analysed by the driver"
    run.steps.took("plan", time.monotonic() - started, detail=detail)
    report = AnalysisReport(lake=run.lake, delta_mode=run.executor.delta_mode, scope=plan.scope, reason=plan.reason,
                            frames_version=plan.frames_version)
    if run.keys == []:
        _nothing_to_analyse(run.lake, report)
        if not plan.nothing_new:  # new files without a connection's frames, or days: logged
            _log_run(run, report, started_ts)
        return _finished(report, report_started, run.steps)
    analysed = _per_connection_tables(run, report)
    with ThreadPoolExecutor(1) as beside:
        # A scoped run's per-connection tables are written: their small files are merged while the
        # findings, which only read them, are computed (delta-spark's tables are left to its OPTIMIZE).
        merged = (beside.submit(_compacted, run.lake, COMPACTED_BESIDE_FINDINGS, commit_tag())
                  if run.keys is not None and "native" not in (run.delta_mode, run.executor.delta_mode) else None)
        with run.steps.step("findings"):
            _refresh_findings(run, analysed)
            report.rows["findings"] = _count_findings(run.lake, report)
        if merged is not None:
            _compact_tables(run.lake, run.steps, report, merged)
    _log_run(run, report, started_ts)
    return _finished(report, report_started, run.steps)


@dataclass
class _Analysed:
    """What the per-connection step leaves for the findings step."""
    own: pa.Table | None = None         # raw findings of the connections analysed whole (None: none was)
    whole_keys: list[str] = field(default_factory=list)
    whole_deliveries: int = 0           # delivery rows written for the connections analysed whole
    came_back: int = 0                  # a full run: deliveries the message kinds can start from
    carried: CarriedPass | None = None  # the carried pass, where it carried connections on


def _per_connection_tables(run: _Run, report: AnalysisReport) -> _Analysed:
    """The per-connection tables of the run's connections, written (a full run: replacing each
    table; otherwise: replacing those connections' rows). Connections carried on from their
    checkpoints read only their new frames; the rest are analysed whole, their findings too."""
    if run.keys is None:
        with run.steps.step("timelines"):
            summary = _analysed_whole(run, None, report)
        with run.steps.step("write tables"):
            _write_whole_lake(run.lake, summary, report)
        return _Analysed(summary.raw_findings, came_back=summary.came_back)
    carried, ahead = None, {}
    to_carry = sorted(set(run.keys) - set(run.plan.whole))   # the rest: planned whole (run_scope.RunScope.whole)
    if run.plan.scope == NEW_DATA and to_carry:
        with run.steps.step("carry on from checkpoints"):
            carried, ahead = _carried_with_rewrites(run, to_carry)
            _report_carried(carried, report)
    whole_keys = run.keys if carried is None else sorted({*run.plan.whole, *carried.whole_keys})
    if whole_keys:
        for rewrite in ahead.values():  # made for carried connections only
            rewrite.discard()
        ahead = {}
    written = {name: [] for name in [*PER_CONNECTION_TABLES, STATE_TABLE]}     # the files the passes wrote
    summary = None
    if whole_keys:
        with run.steps.step("timelines"):
            summary = _analysed_whole(run, whole_keys, report)
        for name, files in summary.written.items():
            written[name] += files
    if carried is not None:
        for name, files in carried.written.items():
            written[name] += files
    analysed_whole = [connections_match(whole_keys)] if whole_keys else []
    with run.steps.step("write tables"):
        _write_tables(run, written, analysed_whole, carried, ahead, report, summary.rows if summary else {})
    carried_keys = set(run.keys) - set(whole_keys) if carried is not None else set()
    if summary is None:
        return _Analysed(carried=carried if carried_keys else None)
    return _Analysed(summary.raw_findings, whole_keys, summary.rows["deliveries"],
                     carried=carried if carried_keys else None)


def _carried_with_rewrites(run: _Run, keys: list[str]) -> tuple[CarriedPass, dict[str, Rewrite]]:
    """The carried pass of these connections, and beside it (`_replaced_ahead`) the files holding
    the stored rows it replaces rewritten without them (delta_io.rewrite_all): the rows it replaces
    are known before it when every connection is carried on (none falls back; none planned whole,
    else no rewrite). Then writing its tables is committing them."""
    if run.plan.whole:
        return run.executor.carried_pass(keys), {}
    with ThreadPoolExecutor(1) as beside:
        rewriting = beside.submit(lambda: rewrite_all(run.lake, _replaced_ahead(run.lake, run.keys)))
        try:
            carried = run.executor.carried_pass(keys)
        except BaseException:
            if rewriting.exception() is None:   # waits for it
                for rewrite in rewriting.result().values():
                    rewrite.discard()
            raise
    return carried, rewriting.result()


def _replaced_ahead(lake: str, keys: list[str]) -> dict[str, Replacement]:
    """What a run that carries every one of `keys` on replaces: every analysis_state row of its
    connections, and in the tables where it can only replace provisional rows (`_provisional_only`),
    those of its connections."""
    def replacing(name: str, match: Match | Listed, provisional_only: bool = False) -> Replacement:
        # No rows: the pass writes them all as files, committed with the rewrite (_write_tables).
        return Replacement(None, OUTPUT_TABLES.get(name, schema.ANALYSIS_STATE), [match], provisional_only)

    replacements = {name: replacing(name, connections_match(keys, **{PROVISIONAL: (True,)}), True)
                    for name in _provisional_only(lake)}
    replacements[STATE_TABLE] = replacing(STATE_TABLE, connections_match(keys))
    return replacements


def _write_tables(run: _Run, written: dict, analysed_whole: list, carried: CarriedPass | None,
                  ahead: dict[str, Rewrite], report: AnalysisReport, whole_rows: dict[str, int]) -> None:
    """Each table's rows of these connections replaced by the files the passes wrote (`written`),
    in its own commit: the tables rewritten `ahead` (`_carried_with_rewrites`) by their commit
    alone; for the rest, the files holding the stored rows the whole pass's and the carried pass's
    rows replace (`CarriedPass.replaced`) found and rewritten without them (delta_io.replace_all)."""
    replacements = {name: Replacement(None, OUTPUT_TABLES.get(name, schema.ANALYSIS_STATE), analysed_whole
                                      + (carried.replaced(run.lake, name) if carried is not None else []))
                    for name in written if name not in ahead}
    replace_all(run.lake, replacements, written=written)
    for name, rewrite in ahead.items():
        rewrite.commit(written[name])
    report.rows = {name: whole_rows.get(name, 0) + (carried.rows[name] if carried is not None else 0)
                   for name in written if name != STATE_TABLE}


def _provisional_only(lake: str) -> set[str]:
    """The tables where the rows a run that carries every connection on replaces can only be
    provisional ones (provisional.py): no commit since a finished run's."""
    finished = finished_runs(lake)
    return {name for name in PER_CONNECTION_TABLES
            if last_written_by_finished_run(open_table(lake, name), finished)}


def _report_carried(carried: CarriedPass, report: AnalysisReport) -> None:
    report.frames, report.connections = carried.frames, carried.connections
    report.carried_connections, report.carried_records = carried.connections, carried.records
    if carried.fallbacks:
        report.reason += f"; {len(carried.fallbacks)} connection(s) analysed whole: " + "; ".join(
            f"{k}: {why}" for k, why in sorted(carried.fallbacks.items())[:5])


def _analysed_whole(run: _Run, keys: list[str] | None, report: AnalysisReport) -> PassSummary:
    """These connections (None: all) analysed from all their frames, in one pass of the reference
    state machine (connection_pass.py): the per-connection tables and checkpoints as files it wrote
    into the lake (uncommitted), and its findings about one connection."""
    summary = run.executor.whole_pass(keys)
    report.frames += summary.frames
    report.connections += summary.connections
    return summary


def _write_whole_lake(lake: str, summary: PassSummary, report: AnalysisReport) -> None:
    """A full run's per-connection tables and checkpoints: the files the pass wrote, each table's
    replacing it in one commit."""
    for name in [*PER_CONNECTION_TABLES, STATE_TABLE]:
        commit(os.path.join(lake, name), OUTPUT_TABLES.get(name, schema.ANALYSIS_STATE),
               summary.written.get(name, []), schema.PARTITION_BY, mode="overwrite", tag=commit_tag())
    report.rows = {name: summary.rows[name] for name in PER_CONNECTION_TABLES}


def _refresh_findings(run: _Run, analysed: _Analysed) -> None:
    """The findings step (findings.py): a scoped run hands it the raw findings about one connection
    of the connections it analysed (the pass's for those analysed whole, the carried pass's for
    those carried on) and the delivery rows it changed; a full run the pass's raw findings of every
    connection, the message kinds reading the stored deliveries only where one came back (none
    did: they have nothing to start from)."""
    if run.keys is None:
        refresh_findings(run.lake, analysed.own, None, None if analysed.came_back else Changed(),
                         run.settings.thresholds, (), run.plan.frames_version)
        return
    own, rows, whole = [], [], ()
    if analysed.own is not None:
        own.append(analysed.own)
        if analysed.whole_deliveries:   # every delivery row of theirs, read by the step from the table
            whole = tuple(analysed.whole_keys)
    if analysed.carried is not None:
        own.append(analysed.carried.raw)
        rows.append(analysed.carried.changed(run.lake))
    refresh_findings(run.lake, pa.concat_tables(own) if own else RAW_FINDINGS.empty_table(), run.keys,
                     Changed(tuple(rows), whole), run.settings.thresholds, run.plan.new_files, run.plan.frames_version)


def _compacted(lake: str, names: list[str], tag: str | None) -> dict[str, int]:
    """A scoped run's patches leave small files behind; where enough have gathered in one of these
    tables, they are merged (compaction.py): how many files were merged, per table merged. No Spark
    job: it may run beside other steps (each table's files and commit are its own)."""
    groups = {name: found for name in names if (found := small_final_files(lake, name)).groups}
    return {name: compact(lake, name, found, tag) for name, found in groups.items()}


def _compact_tables(lake: str, steps: Steps, report: AnalysisReport, beside: Future) -> None:
    """The findings table's small files merged too, now that it is written, and with what was
    merged `beside` the findings step (`_compacted`), reported; in a step of its own that only a
    run with something to merge has, which counts what the run waited for. A full run rewrites
    every table whole; delta-spark's tables (native mode) are left to its OPTIMIZE."""
    started = time.monotonic()
    merged = beside.result()
    findings = small_final_files(lake, "findings")
    if findings.groups:
        merged["findings"] = compact(lake, "findings", findings, commit_tag())
    if merged:
        steps.took("compact tables", time.monotonic() - started)
    report.files_compacted = merged


def _merge_input_files(lake: str, run_id: str, plan: RunScope, steps: Steps, report: AnalysisReport) -> None:
    """After a complete run is logged: the small files of `frames` it analysed, and those of
    `connections`, merged (compaction.merge_analysed_input), so that the agent, which merges only
    files older than its --compact-min-age, finds none and its sidecar never pays a merge's memory.
    A failure is said and left to the next run: the run itself is done."""
    if plan.scope not in COMPLETE_SCOPES:
        return
    started = time.monotonic()
    try:
        merged = merge_analysed_input(lake, plan.frames_version, run_id)
    except Exception as error:
        steps.took("merge input files", time.monotonic() - started,
                   detail=f"not done, left to the next run: {type(error).__name__}: {error}")
        return
    if merged:
        steps.took("merge input files", time.monotonic() - started,
                   detail=", ".join(f"{name} {n} small files" for name, n in merged.items()))
        report.input_files_merged = merged


def _connections_in_scope(lake: str, plan: RunScope) -> list[str]:
    """Listed by the driver from one column of the frames files that hold them, no Spark job: a
    scheduled run's new files; a days run's files of those days in its snapshot of `frames`."""
    if plan.scope == NEW_DATA:
        return sorted({*distinct_strings(plan.new_files, "connection_id"), *plan.whole})
    if plan.scope != DAYS:
        raise ValueError(f"scope {plan.scope!r} has no list of connections")
    frames = open_table(lake, "frames")
    frames.load_as_version(plan.frames_version)
    since, until = (None if day is None else date.fromisoformat(day).isoformat() for day in (plan.since, plan.until))
    return distinct_strings(files_to_read(frames, os.path.join(lake, "frames"), since, until).files, "connection_id")


def _log_run(run: _Run, report: AnalysisReport, started_ts: datetime) -> None:
    """The run's entry in the log of runs, then the input files it analysed merged: only once the
    entry is there (a run cut short before it merged nothing, so its rerun stays scoped)."""
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
    _merge_input_files(run.lake, run.run_id, plan, run.steps, report)


def _nothing_to_analyse(lake: str, report: AnalysisReport) -> None:
    report.reason += "; nothing to analyse"
    _count_findings(lake, report)


def _count_findings(lake: str, report: AnalysisReport) -> int:
    """The findings table as stored, by kind and severity (small: read without Spark); its rows."""
    stored = read_table(lake, "findings", schema.FINDINGS, columns=["kind", "severity"])
    if stored is None:
        return 0
    report.findings_by_kind = dict(Counter(stored["kind"].to_pylist()))
    report.findings_by_severity = dict(Counter(stored["severity"].to_pylist()))
    return stored.num_rows


def _finished(report: AnalysisReport, started: float, steps: Steps) -> AnalysisReport:
    report.seconds = round(time.monotonic() - started, 2)
    report.seconds_by_step, report.spark_jobs = steps.seconds, steps.spark_jobs()
    return report


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

