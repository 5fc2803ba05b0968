"""Incremental analysis runs: a lake filled in several appends (connections and channels living
across them, over two UTC days) and analysed after each append must end with exactly the tables of
one run over everything; a run with nothing new writes nothing; re-analysing days changes nothing;
and the scope planner picks a full run whenever the stored rows cannot be trusted.
Real Spark, real Delta tables (the bridge), generated and recorded traffic."""

import glob
import importlib.util
import json
import os
import shutil
import sys
from datetime import datetime, timezone
from urllib.parse import unquote

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable

from analyzer import lake, schema
from analyzer.ingest import ingest_file, ingest_files
from analyzer.timeline.records import DEFAULT_OVERDUE_NS
from spark_jobs import analyze as analyze_module, compaction, delta_io
from spark_jobs.analyze import FLAGGED_TABLES, OUTPUT_TABLES, PER_CONNECTION_TABLES, analyze, planned_run
from spark_jobs.provisional import PROVISIONAL, last_written_by_finished_run
from spark_jobs.requeue_related import REQUEUE_RELATED
from analyzer.published import RUNS_TABLE, finished_runs
from spark_jobs.run_scope import DAYS, FULL, NEW_DATA, plan_run
from analyzer.detectors.thresholds import Thresholds
from spark_jobs.timeline.plans import conf_meanwhile

from .conftest import ROOT
from .findings_check import LAB_THRESHOLDS, analysed_as_the_command_does
from .pieces_support import cut

_spec = importlib.util.spec_from_file_location("bench_frames_generator",
                                               os.path.join(ROOT, "bench", "frames_generator.py"))
gen = sys.modules.setdefault("bench_frames_generator", importlib.util.module_from_spec(_spec))
_spec.loader.exec_module(gen)

PARAMS = gen.Params(frames=12_000, hot_deliveries=2_000, seed=11, connections=8, duration_s=900)
# Recorded captures with what the vectorised path does not take (mid-stream starts, tx, violations)
# and findings that follow messages across connections: in pieces too.
IRREGULAR_EXAMPLES = ["mid_stream", "transactions", "unknown_delivery_tag", "requeue_loop", "redelivery_after_close"]
APPENDS = 3
NOW = datetime.now(timezone.utc)
SORT_KEYS = ("finding_id", "connection_id", "channel", "incarnation", "seq", "bucket_start_ns", "kind")


@pytest.fixture(scope="module")
def traffic(tmp_path_factory):
    """Frames and connections rows: generated traffic plus recorded captures."""
    frames, connections = gen.lake_tables(PARAMS)
    recorded = str(tmp_path_factory.mktemp("recorded"))
    for name in IRREGULAR_EXAMPLES:
        capture, = glob.glob(os.path.join(ROOT, "examples", name + ".pcapng"))
        assert not ingest_file(capture, recorded).errors
    frames = pa.concat_tables([frames, lake.read_table(recorded, "frames", schema.FRAMES)])
    connections = pa.concat_tables([connections, lake.read_table(recorded, "connections", schema.CONNECTIONS)])
    return frames.sort_by([("connection_id", "ascending"), ("seq", "ascending")]), connections


def _pieces(frames: pa.Table) -> list[pa.Table]:
    """`frames` in APPENDS pieces by time, as an agent appends them."""
    return gen.as_appended(frames, list(np.linspace(0, 1, APPENDS + 1)[1:-1]))


def _append(lake_dir: str, name: str, table: pa.Table, schema_: pa.Schema, app_id: str) -> None:
    writer = lake.TableWriter(lake_dir, name, schema_)
    writer.write(table)
    writer.commit(app_id)


def _tables(lake_dir: str) -> dict[str, list]:
    out = {}
    for name, table_schema in OUTPUT_TABLES.items():
        table = lake.read_table(lake_dir, name, table_schema)
        key = [(k, "ascending") for k in SORT_KEYS if k in table.column_names]
        out[name] = table.sort_by(key).to_pylist()
    return out


def _versions(lake_dir: str) -> dict[str, int]:
    return {name: DeltaTable(os.path.join(lake_dir, name)).version() for name in OUTPUT_TABLES}


@pytest.fixture(scope="module")
def whole(spark, traffic, tmp_path_factory):
    """One run over everything: what the incremental runs must end with."""
    frames, connections = traffic
    lake_dir = str(tmp_path_factory.mktemp("whole"))
    _append(lake_dir, "frames", frames, schema.FRAMES, "all")
    _append(lake_dir, "connections", connections, schema.CONNECTIONS, "all")
    report = analyze(spark, lake_dir, thresholds=LAB_THRESHOLDS)
    assert report.scope == FULL and report.reason == "first run"
    return _tables(lake_dir)


@pytest.fixture(scope="module")
def appended(spark, traffic, tmp_path_factory):
    """The same traffic appended in pieces, analysed after each append; the files a replace may
    change searched for those it must, as in a lake of any size (tables this small are otherwise
    rewritten whole: delta_io.REWRITTEN_WHOLE_BYTES, as appended_many's are)."""
    frames, connections = traffic
    lake_dir = str(tmp_path_factory.mktemp("appended"))
    reports, seen = [], set()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(delta_io, "REWRITTEN_WHOLE_BYTES", 0)
        for number, piece in enumerate(_pieces(frames)):
            _append(lake_dir, "frames", piece, schema.FRAMES, f"piece-{number}")
            ids = set(piece["connection_id"].to_pylist())
            new = connections.filter(pc.is_in(connections["connection_id"], pa.array(sorted(ids - seen))))
            _append(lake_dir, "connections", new, schema.CONNECTIONS, f"piece-{number}")
            seen |= ids
            reports.append((analyze(spark, lake_dir, thresholds=LAB_THRESHOLDS), ids, piece.num_rows))
    return lake_dir, reports


def test_pieces_split_connections_across_appends_and_days(traffic):
    frames, _ = traffic
    pieces = _pieces(frames)
    assert sum(p.num_rows for p in pieces) == frames.num_rows
    in_several = set(pieces[0]["connection_id"].to_pylist()) & set(pieces[-1]["connection_id"].to_pylist())
    assert len(in_several) >= 3  # connections (and their channels) live through every append
    assert len(set(frames["date"].to_pylist())) >= 2


def test_runs_after_each_append_end_with_the_tables_of_one_run(whole, appended):
    lake_dir, reports = appended
    first, *later = reports
    assert first[0].scope == FULL and first[0].reason == "first run"
    for report, ids, rows in later:
        # Only the connections with new frames, each analysed over all its frames so far.
        assert report.scope == NEW_DATA and report.connections == len(ids)
        assert report.frames >= rows
    got = _tables(lake_dir)
    for name in OUTPUT_TABLES:
        assert len(got[name]) == len(whole[name]), name
        assert got[name] == whole[name], name
    assert whole["findings"] and whole["deliveries"]
    runs = lake.read_table(lake_dir, RUNS_TABLE, schema.ANALYSIS_RUNS).sort_by("frames_version").to_pylist()
    assert [r["scope"] for r in runs] == [FULL] + [NEW_DATA] * (APPENDS - 1)
    assert [r["baseline_version"] for r in runs[1:]] == [r["frames_version"] for r in runs[:-1]]


def test_a_run_with_nothing_new_writes_nothing(spark, whole, appended):
    lake_dir, _ = appended
    versions = _versions(lake_dir)
    runs = DeltaTable(os.path.join(lake_dir, RUNS_TABLE)).version()
    report = analyze(spark, lake_dir, thresholds=LAB_THRESHOLDS)
    assert report.scope == NEW_DATA and report.reason.endswith("nothing to analyse")
    assert report.connections == 0 and report.findings_by_kind
    assert _versions(lake_dir) == versions
    assert DeltaTable(os.path.join(lake_dir, RUNS_TABLE)).version() == runs
    assert _tables(lake_dir) == whole


def test_a_run_analyses_the_snapshot_it_was_planned_on(spark, traffic, tmp_path):
    """The command line plans its run before it starts Spark (to size the driver) and hands the plan
    on: frames appended meanwhile are left to the next run, which finds them as new."""
    frames, connections = traffic
    first, second, *_ = _pieces(frames)
    lake_dir = str(tmp_path / "lake")
    _append(lake_dir, "frames", first, schema.FRAMES, "first")
    _append(lake_dir, "connections", connections, schema.CONNECTIONS, "all")
    assert analyze(spark, lake_dir, thresholds=LAB_THRESHOLDS).scope == FULL
    plan = planned_run(lake_dir, None, None, False, 10, DEFAULT_OVERDUE_NS, LAB_THRESHOLDS)
    _append(lake_dir, "frames", second, schema.FRAMES, "second")
    runs = DeltaTable(os.path.join(lake_dir, RUNS_TABLE)).version()
    held = analyze(spark, lake_dir, thresholds=LAB_THRESHOLDS, plan=plan)
    assert held.frames_version == plan.frames_version and held.reason.endswith("nothing to analyse")
    assert DeltaTable(os.path.join(lake_dir, RUNS_TABLE)).version() == runs
    later = analyze(spark, lake_dir, thresholds=LAB_THRESHOLDS)
    assert later.scope == NEW_DATA and later.frames_version == plan.frames_version + 1
    assert later.connections == len(set(second["connection_id"].to_pylist())) > 0


def test_analysing_days_again_changes_nothing(spark, whole, appended, traffic):
    lake_dir, _ = appended
    last_day = max(traffic[0]["date"].to_pylist())
    report = analyze(spark, lake_dir, since=last_day, thresholds=LAB_THRESHOLDS)
    on_that_day = traffic[0].filter(pc.equal(traffic[0]["date"], last_day))
    assert report.scope == DAYS
    assert report.connections == len(set(on_that_day["connection_id"].to_pylist())) > 0
    assert _tables(lake_dir) == whole


# --- the scope planner alone (delta-rs only, no Spark) ----------------------------------------------

def _plan(lake_dir, **overrides):
    settings = dict(since=None, until=None, full=False, bucket_seconds=10, overdue_ns=60 * 10**9,
                    thresholds=Thresholds(), output_tables=["deliveries"])
    return plan_run(lake_dir, **{**settings, **overrides})


def _log(lake_dir, frames_version, scope=FULL, bucket_seconds=10, overdue_ns=60 * 10**9, thresholds=Thresholds()):
    from spark_jobs.run_scope import thresholds_json
    row = {"date": "2026-11-22", "run_id": f"run-{frames_version}-{scope}", "started_ts": NOW, "finished_ts": NOW,
           "scope": scope, "reason": "", "since": None, "until": None, "frames_version": frames_version,
           "baseline_version": None, "connections": 0, "frames": 0, "bucket_seconds": bucket_seconds,
           "overdue_ns": overdue_ns, "thresholds": thresholds_json(thresholds)}
    _append(lake_dir, RUNS_TABLE, pa.Table.from_pylist([row], schema=schema.ANALYSIS_RUNS), schema.ANALYSIS_RUNS,
            row["run_id"])


def test_scope_planner(tmp_path, traffic):
    frames = traffic[0].slice(0, 200)
    lake_dir = str(tmp_path)
    _append(lake_dir, "frames", frames, schema.FRAMES, "one")
    _append(lake_dir, "deliveries", schema.DELIVERIES.empty_table(), schema.DELIVERIES, "out")
    assert _plan(lake_dir).reason == "first run"
    _log(lake_dir, 1)
    plan = _plan(lake_dir)
    assert (plan.scope, plan.new_files) == (NEW_DATA, ())
    assert plan.nothing_new
    # New thresholds: the checkpoints' detector state and the stored findings were made under the old ones.
    rethresholded = _plan(lake_dir, thresholds=Thresholds(requeue_loop_deliveries=3))
    assert (rethresholded.scope, rethresholded.reason) == (FULL, "--threshold settings differ from the last run's")
    assert _plan(lake_dir, full=True).scope == FULL
    assert _plan(lake_dir, since="2026-03-15").scope == DAYS
    assert _plan(lake_dir, bucket_seconds=60).scope == FULL
    assert _plan(lake_dir, output_tables=["deliveries", "findings"]).reason == "output table(s) findings missing"
    # Stored by an ackscope before the provisional column (provisional.py) or the deliveries'
    # requeue_related (requeue_related.py): replaced whole, once.
    plan = _plan(lake_dir, flagged_tables={"deliveries": (PROVISIONAL, REQUEUE_RELATED)})
    assert plan.scope == FULL and plan.reason == ("output table(s) deliveries written by an older ackscope "
                                                  "(no provisional or requeue_related column)"), plan.reason
    _append(lake_dir, "frames", traffic[0].slice(200, 100), schema.FRAMES, "two")
    plan = _plan(lake_dir)
    assert plan.scope == NEW_DATA and plan.baseline_version == 1 and plan.frames_version == 2
    assert len(plan.new_files) >= 1 and all(os.path.isfile(f) for f in plan.new_files)
    # What the run reads, from the log alone (the command line starts its driver JVM by it).
    assert (plan.new_rows, plan.rows_to_read, plan.frames_rows) == (100, 100, 300)
    assert _plan(lake_dir, full=True).rows_to_read == _plan(lake_dir, since="2026-03-15").rows_to_read == 300
    # A days run does not move the baseline; a complete one does.
    _log(lake_dir, 2, scope=DAYS)
    assert _plan(lake_dir).baseline_version == 1
    _log(lake_dir, 2)
    assert _plan(lake_dir).new_files == ()
    # A compaction (the agent runs them) rewrites files, not rows: nothing new to analyse.
    frames_table = os.path.join(lake_dir, "frames")
    assert DeltaTable(frames_table).optimize.compact()["numFilesRemoved"] >= 2
    plan = _plan(lake_dir)
    assert (plan.scope, plan.new_files, plan.frames_version, plan.frames_rows, plan.rows_to_read) == (
        NEW_DATA, (), 3, 300, 0)
    # New rows compacted with older ones before a run read them cannot be read alone.
    _append(lake_dir, "frames", traffic[0].slice(300, 50), schema.FRAMES, "three")
    _append(lake_dir, "frames", traffic[0].slice(350, 50), schema.FRAMES, "four")
    plan = _plan(lake_dir)
    assert len(plan.new_files) >= 2 and plan.rows_to_read == 100
    DeltaTable(frames_table).optimize.compact()
    plan = _plan(lake_dir)
    assert plan.scope == FULL and "rewritten" in plan.reason, plan.reason
    # A delete changes rows.
    _log(lake_dir, DeltaTable(frames_table).version())
    assert _plan(lake_dir).scope == NEW_DATA
    DeltaTable(frames_table).delete("seq < 5")
    plan = _plan(lake_dir)
    assert plan.scope == FULL and "deleted" in plan.reason, plan.reason
    assert plan.frames_rows == 400 - pc.sum(pc.less(traffic[0].slice(0, 400)["seq"], 5)).as_py()


def test_scope_planner_provisional_files_taken_out(tmp_path, traffic):
    """An ingest continuing a capture's open flows takes out the provisional files it had written
    to end them (lake.PROVISIONAL_PREFIX): what changed is those files' connections, analysed
    whole by a new_data run. Any other file taken out, or one no longer on disk: a full run."""
    frames = traffic[0]
    lake_dir = str(tmp_path)
    _append(lake_dir, "frames", frames.slice(0, 200), schema.FRAMES, "one")
    _append(lake_dir, "deliveries", schema.DELIVERIES.empty_table(), schema.DELIVERIES, "out")
    ended = frames.slice(200, 50)
    provisional = lake.TableWriter(lake_dir, "frames", schema.FRAMES, prefix=f"{lake.PROVISIONAL_PREFIX}-0123abcd")
    provisional.write(ended)
    provisional.commit("provisional")
    taken_out = lake.files_named(lake_dir, "frames", f"{lake.PROVISIONAL_PREFIX}-0123abcd")
    _log(lake_dir, DeltaTable(os.path.join(lake_dir, "frames")).version())
    more = lake.TableWriter(lake_dir, "frames", schema.FRAMES)
    more.write(frames.slice(250, 50))
    more.commit("continued", remove=taken_out)
    plan = _plan(lake_dir)
    whole = tuple(sorted(set(ended["connection_id"].to_pylist())))
    assert (plan.scope, plan.whole, len(plan.new_files)) == (NEW_DATA, whole, 1), plan.reason
    assert plan.reason.endswith(f"1 provisional frames file(s) taken out by an ingest continuing their flows: "
                                f"{len(whole)} connection(s) analysed whole"), plan.reason
    assert not plan.nothing_new and (plan.new_rows, plan.rows_to_read) == (50, plan.frames_rows)
    # Vacuumed away: what it held cannot be told.
    os.remove(os.path.join(lake_dir, "frames", taken_out[0]))
    plan = _plan(lake_dir)
    assert plan.scope == FULL and "deleted or rewritten" in plan.reason, plan.reason
    # A file of the ingest's own rows taken out: a full run, as before.
    _log(lake_dir, DeltaTable(os.path.join(lake_dir, "frames")).version())
    kept = [p for p in lake.table_files(DeltaTable(os.path.join(lake_dir, "frames")))][:1]
    lake.TableWriter(lake_dir, "frames", schema.FRAMES).commit("deleted", remove=kept)
    plan = _plan(lake_dir)
    assert plan.scope == FULL and "deleted or rewritten" in plan.reason, plan.reason


def test_a_days_run_lists_the_connections_of_those_days_in_its_snapshot(tmp_path, traffic):
    """analyze._connections_in_scope of a --since/--until run, by the driver (no Spark): from the
    connection_id column of the frames files of those UTC days in the run's snapshot, exactly the
    connections with frames on those days, whatever the window; frames appended after the plan
    wait for the next run."""
    frames = traffic[0]
    lake_dir = str(tmp_path)
    for start in range(0, frames.num_rows, frames.num_rows // 3 + 1):   # a few files a day
        _append(lake_dir, "frames", frames.slice(start, frames.num_rows // 3 + 1), schema.FRAMES, f"at-{start}")
    rows = frames.select(["date", "connection_id"]).to_pylist()
    days = sorted({row["date"] for row in rows})
    assert len(days) >= 2

    def on_days(since, until):
        return sorted({row["connection_id"] for row in rows if (since is None or row["date"] >= since)
                       and (until is None or row["date"] <= until)})

    windows = [(days[0], None), (days[-1], None), (None, days[0]), (days[0], days[0]), (days[1], days[-1]),
               ("2000-01-01", "2000-01-02")]
    for since, until in windows:
        plan = _plan(lake_dir, since=since, until=until)
        assert plan.scope == DAYS
        assert analyze_module._connections_in_scope(lake_dir, plan) == on_days(since, until), (since, until)
    assert 0 < len(on_days(days[-1], None)) < len(on_days(None, None))
    # A day as the command line takes it (ISO 8601 without dashes) selects the same partitions.
    compact = _plan(lake_dir, since=days[-1].replace("-", ""))
    assert analyze_module._connections_in_scope(lake_dir, compact) == on_days(days[-1], None)
    plan = _plan(lake_dir, since=days[0])
    later = frames.slice(0, 10).set_column(frames.schema.get_field_index("connection_id"), "connection_id",
                                           pa.array(["appended-later"] * 10, pa.string()))
    _append(lake_dir, "frames", later.cast(frames.schema), schema.FRAMES, "later")
    assert analyze_module._connections_in_scope(lake_dir, plan) == on_days(days[0], None)
    assert "appended-later" in analyze_module._connections_in_scope(lake_dir, _plan(lake_dir, since=days[0]))


def test_a_capture_ingested_in_pieces_stays_scoped_and_ends_with_a_full_runs_tables(spark, tmp_path):
    """Captures ingested piece by piece (rotated files, `ingest --watch`), analysed after each
    ingest: an ingest that continues open flows takes out the provisional rows that ended them, and
    the run after it is still a new_data run on Spark, analysing those connections whole beside the
    others carried on from their checkpoints; its tables are a full run's over the same lake. The
    local executor (the command's route on a lake this small) makes the same runs: the same tables."""
    # Cut where ending the open flows makes rows (each piece but the last leaves a provisional
    # file), and a capture whose open connection ends with none: carried on.
    captures = {"redelivery_after_close": [20, 47], "lost_confirms": [34, 68]}
    cuts = {name: cut(os.path.join(ROOT, "examples", f"{name}.pcapng"), at, str(tmp_path / name))[0]
            for name, at in captures.items()}
    lake_dir, local_dir = str(tmp_path / "lake"), str(tmp_path / "local")
    reports, local = [], []
    for number in range(3):
        for name, pieces in cuts.items():
            for into in (lake_dir, local_dir):
                assert not ingest_files([pieces[number]], into, source=name)[0].errors
        reports.append(analyze(spark, lake_dir, thresholds=LAB_THRESHOLDS))
        local.append(analysed_as_the_command_does(spark, local_dir, LAB_THRESHOLDS))
        assert local[-1].delta_mode == "none" and _tables(local_dir) == _tables(lake_dir), number
        full_dir = str(tmp_path / f"full-{number}")
        shutil.copytree(lake_dir, full_dir)
        assert analyze(spark, full_dir, thresholds=LAB_THRESHOLDS, full=True).scope == FULL
        assert _tables(lake_dir) == _tables(full_dir), number
    assert [r.scope for r in reports] == [FULL, NEW_DATA, NEW_DATA], [r.reason for r in reports]
    assert all("provisional frames file(s) taken out by an ingest continuing their flows: 1 connection(s) "
               "analysed whole" in r.reason for r in reports[1:]), [r.reason for r in reports]
    assert all(r.carried_connections >= 1 and r.connections > r.carried_connections for r in reports[1:])
    assert [(r.scope, r.reason, r.connections, r.carried_connections) for r in local] == [
        (r.scope, r.reason, r.connections, r.carried_connections) for r in reports]


# --- carried runs: only the new frames are read -------------------------------------------------------

MANY_APPENDS = 10


@pytest.fixture(scope="module")
def appended_many(spark, traffic, tmp_path_factory):
    """The same traffic in MANY_APPENDS pieces cut at random times (channels, open deliveries and
    publishes, and channel_metrics buckets cut by every run), analysed after each append; the
    frames table compacted after every third run, as the agent compacts it; and the analysis
    tables' final files merged by the runs as soon as three have gathered (compaction.py; its
    default waits for 16, which ten runs of this traffic do not reach)."""
    frames, connections = traffic
    lake_dir = str(tmp_path_factory.mktemp("appended_many"))
    cuts = sorted(np.random.default_rng(7).uniform(0, 1, MANY_APPENDS - 1))
    reports = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(compaction, "FILES_TO_MERGE", 3)
        for number, piece in enumerate(gen.as_appended(frames, cuts)):
            _append(lake_dir, "frames", piece, schema.FRAMES, f"piece-{number}")
            if number == 0:
                _append(lake_dir, "connections", connections, schema.CONNECTIONS, "all")
            if piece.num_rows:
                reports.append((analyze(spark, lake_dir, thresholds=LAB_THRESHOLDS), piece))
                if len(reports) % 3 == 0:
                    DeltaTable(os.path.join(lake_dir, "frames")).optimize.compact()
    return lake_dir, reports


def test_runs_carry_open_channels_and_read_only_new_frames(whole, appended_many, traffic):
    lake_dir, reports = appended_many
    (first, _), *later = reports
    assert first.scope == FULL and len(later) >= MANY_APPENDS - 2
    hot = _hot_connection(traffic[0])
    for report, piece in later:
        assert report.scope == NEW_DATA
        ids = set(piece["connection_id"].to_pylist())
        assert report.connections == len(ids)
        whole_ids = {k for k in ids if k in report.reason}  # the fallbacks are named in the reason
        assert hot not in whole_ids, report.reason
        if not whole_ids:
            # Only the new frames: what each run reads does not grow with the connections' history.
            assert report.carried_connections == report.connections
            assert report.frames == piece.num_rows, (report.frames, piece.num_rows)
    carried = [report for report, _ in later if report.carried_connections == report.connections]
    assert len(carried) >= len(later) - 2, [report.reason for report, _ in later]
    # The per-connection tables' merges, made beside the findings step, are reported with the
    # findings' own; a step of its own only where something was merged.
    assert any(set(report.files_compacted) & set(PER_CONNECTION_TABLES) for report in carried)
    assert all(("compact tables" in report.seconds_by_step) == bool(report.files_compacted) for report, _ in later)
    # The frames files each run analysed are merged after it (merge_analysed_input), and every run
    # after stayed new_data (above): a merge of analysed rows does not make the next run full.
    assert sum(bool(report.input_files_merged.get("frames")) for report, _ in later) >= len(later) // 2
    assert all(("merge input files" in report.seconds_by_step) == bool(report.input_files_merged)
               for report, _ in later)
    assert max(report.carried_records for report in carried) > 0
    got = _tables(lake_dir)
    for name in OUTPUT_TABLES:
        assert len(got[name]) == len(whole[name]), name
        assert got[name] == whole[name], name
    runs = lake.read_table(lake_dir, RUNS_TABLE, schema.ANALYSIS_RUNS).sort_by("frames_version").to_pylist()
    assert [r["frames"] for r in runs[1:]] == [report.frames for report, _ in later]
    # A file a run, merged by the later runs (compaction.py); the findings' files, rewritten or
    # merged, do not gather one a run either.
    for name in (RUNS_TABLE, "findings"):
        assert len(DeltaTable(os.path.join(lake_dir, name)).file_uris()) < len(runs), name


def test_each_commit_names_its_run_and_provisional_rows_stay_in_files_of_their_own(appended_many):
    """provisional.py: every commit of the per-connection tables carries the id of a run that
    finished, so the next carried run may search only the files of provisional rows; no file holds
    both kinds (nor both requeue_related and other deliveries); and what the runs removed were
    provisional files, but for the compactions (compaction.py): commits that change no row, each
    merging final files of one partition and one value of every flag into as many rows."""
    lake_dir, _ = appended_many
    finished = finished_runs(lake_dir)
    compactions = 0
    for name in PER_CONNECTION_TABLES:
        table = DeltaTable(os.path.join(lake_dir, name))
        assert last_written_by_finished_run(table, finished), name
        files = {}
        for log in sorted(glob.glob(os.path.join(lake_dir, name, "_delta_log", "*.json"))):
            actions = [json.loads(line) for line in open(log) if line.strip()]
            info = next(a["commitInfo"] for a in actions if "commitInfo" in a)
            adds = [a["add"] for a in actions if "add" in a]
            removes = [a["remove"] for a in actions if "remove" in a]
            if adds:
                assert info.get("userMetadata") in finished, (name, log, info)
            for add in adds:
                stats = json.loads(add["stats"])
                files[add["path"]] = (stats["minValues"][PROVISIONAL], stats["maxValues"][PROVISIONAL],
                                      stats["numRecords"], add["partitionValues"]["date"])
            if removes and not any(a["dataChange"] for a in [*adds, *removes]):
                compactions += 1
                merged = [files[r["path"]] for r in removes]
                assert {(low, high, date) for low, high, _n, date in merged} == \
                    {(False, False, date) for *_rest, date in merged}, (name, log)
                assert sum(n for *_flags, n, _date in merged) == sum(files[a["path"]][2] for a in adds)
                assert len(adds) < len(removes), (name, log)
                continue
            for remove in removes:
                assert files[remove["path"]][:2] == (True, True), (name, log, remove["path"])
        live = pa.table(table.get_add_actions(flatten=True)).to_pylist()
        for flag in FLAGGED_TABLES[name]:  # and so are the deliveries a requeue touches (requeue_related.py)
            assert all(f[f"min.{flag}"] == f[f"max.{flag}"] for f in live), (name, flag)
            assert {f[f"max.{flag}"] for f in live} == set(table.to_pyarrow_table(columns=[flag])[flag].to_pylist()), \
                (name, flag)
    assert compactions >= 1
    deliveries = lake.read_table(lake_dir, "deliveries", OUTPUT_TABLES["deliveries"]).to_pylist()
    assert any(row[PROVISIONAL] for row in deliveries)
    assert 0 < sum(row[REQUEUE_RELATED] for row in deliveries) < len(deliveries) / 2


def test_a_rerun_over_the_same_new_frames_changes_nothing(spark, whole, traffic, tmp_path, monkeypatch):
    """A run cut short before its log entry (here: its log step fails; it has committed its tables,
    and has not merged the frames files it read, which comes after the log) is done again from the
    same baseline: the connections then continue from checkpoints already past those frames, so they
    are analysed whole again."""
    frames, connections = traffic
    lake_dir = str(tmp_path)
    first, rest = gen.as_appended(frames, [0.5])
    _append(lake_dir, "frames", first, schema.FRAMES, "piece-0")
    _append(lake_dir, "connections", connections, schema.CONNECTIONS, "all")
    assert analyze(spark, lake_dir, thresholds=LAB_THRESHOLDS).scope == FULL
    _append(lake_dir, "frames", rest, schema.FRAMES, "piece-1")

    def cut_short(*args, **kwargs):
        raise RuntimeError("the run is cut short before its log entry")

    with monkeypatch.context() as patch:
        patch.setattr(analyze_module, "_log_run", cut_short)
        with pytest.raises(RuntimeError, match="cut short"):
            analyze(spark, lake_dir, thresholds=LAB_THRESHOLDS)
    # Its commits are a cut-short run's: this run searches those tables whole.
    assert not all(last_written_by_finished_run(DeltaTable(os.path.join(lake_dir, name)), finished_runs(lake_dir))
                   for name in PER_CONNECTION_TABLES)
    report = analyze(spark, lake_dir, thresholds=LAB_THRESHOLDS)
    assert report.scope == NEW_DATA and report.carried_connections == 0 < report.connections
    assert "not after the last analysed seq" in report.reason
    assert _tables(lake_dir) == whole


def _hot_connection(frames: pa.Table) -> str:
    """The connection with the most frames: a channel open through every run."""
    counts = frames.group_by("connection_id").aggregate([("seq", "count")]).sort_by([("seq_count", "descending")])
    return counts["connection_id"][0].as_py()


def test_recorded_captures_cut_mid_connection_end_with_the_tables_of_one_run(spark, traffic, tmp_path_factory):
    """The recorded captures (mid-stream starts, transactions, violations, ...) were recorded long
    after the generated traffic, so the pieces above hold them whole: here they alone are cut in
    four by time, inside their connections and channels."""
    frames, connections = traffic
    recorded = frames.filter(pc.invert(pc.starts_with(frames["connection_id"], "10.1.")))
    assert recorded.num_rows and len(set(recorded["connection_id"].to_pylist())) >= len(IRREGULAR_EXAMPLES)
    whole_dir, pieces_dir = (str(tmp_path_factory.mktemp(name)) for name in ("recorded_whole", "recorded_pieces"))
    _append(whole_dir, "frames", recorded, schema.FRAMES, "all")
    for lake_dir in (whole_dir, pieces_dir):
        _append(lake_dir, "connections", connections, schema.CONNECTIONS, "all")
    analyze(spark, whole_dir, thresholds=LAB_THRESHOLDS)
    reports = []
    for number, piece in enumerate(gen.as_appended(recorded, [0.25, 0.5, 0.75])):
        _append(pieces_dir, "frames", piece, schema.FRAMES, f"piece-{number}")
        reports.append(analyze(spark, pieces_dir, thresholds=LAB_THRESHOLDS))
    assert sum(r.carried_connections for r in reports[1:]) > 0, [r.reason for r in reports]
    assert _tables(pieces_dir) == _tables(whole_dir)


def test_a_run_updates_findings_of_connections_it_did_not_analyse(spark, traffic, tmp_path_factory):
    """Findings that follow a message across connections: the consumer that closed its channel
    with deliveries unacked is in the lake first, the consumer that got them again (redelivered)
    arrives later, as if another agent appended it. The second run analyses only the newcomer, and
    must still find (and pin to the first consumer) what one run over everything finds."""
    frames, connections = traffic
    ids = set(lake.read_table(_recorded_example("redelivery_after_close", tmp_path_factory), "frames",
                              schema.FRAMES)["connection_id"].to_pylist())
    example = frames.filter(pc.is_in(frames["connection_id"], pa.array(sorted(ids))))
    named = {r["connection_id"]: r["connection_name"] for r in connections.to_pylist() if r["connection_id"] in ids}
    second = next(k for k, name in named.items() if (name or "").endswith("second-consumer"))
    whole_dir, pieces_dir = (str(tmp_path_factory.mktemp(name)) for name in ("across_whole", "across_pieces"))
    _append(whole_dir, "frames", example, schema.FRAMES, "all")
    for lake_dir in (whole_dir, pieces_dir):
        _append(lake_dir, "connections", connections, schema.CONNECTIONS, "all")
    analyze(spark, whole_dir, thresholds=LAB_THRESHOLDS)
    is_second = pc.equal(example["connection_id"], second)
    _append(pieces_dir, "frames", example.filter(pc.invert(is_second)), schema.FRAMES, "others")
    analyze(spark, pieces_dir, thresholds=LAB_THRESHOLDS)
    assert "redelivery_after_close" not in _kinds(pieces_dir)
    _append(pieces_dir, "frames", example.filter(is_second), schema.FRAMES, "second")
    report = analyze(spark, pieces_dir, thresholds=LAB_THRESHOLDS)
    assert report.scope == NEW_DATA and report.connections == 1
    assert _kinds(pieces_dir)["redelivery_after_close"] == {named_id for named_id, name in named.items()
                                                           if (name or "").endswith("first-consumer")}
    assert _tables(pieces_dir) == _tables(whole_dir)


def _recorded_example(name: str, tmp_path_factory) -> str:
    lake_dir = str(tmp_path_factory.mktemp(name))
    assert not ingest_file(os.path.join(ROOT, "examples", name + ".pcapng"), lake_dir).errors
    return lake_dir


def _kinds(lake_dir: str) -> dict[str, set]:
    found = lake.read_table(lake_dir, "findings", schema.FINDINGS, columns=["kind", "connection_id"]).to_pylist()
    kinds: dict[str, set] = {}
    for row in found:
        kinds.setdefault(row["kind"], set()).add(row["connection_id"])
    return kinds


def test_an_old_checkpoint_or_refused_detectors_state_is_analysed_whole(spark, whole, traffic, tmp_path):
    """A checkpoint of the format before the detectors' state, and one whose detectors' state is of
    another version, are not carried: those connections are analysed whole, and the tables still
    end as one run's."""
    lake_dir = str(tmp_path / "lake")
    last, states = analysed_but_the_last_piece(spark, traffic, lake_dir)
    old, forged = states[:2]
    doc = json.loads(forged["checkpoint"])
    doc["detectors"] = dict(doc["detectors"], version=doc["detectors"]["version"] + 1)
    replace_states(lake_dir, [dict(old, format="ackscope.timeline.state/1"),
                              dict(forged, checkpoint=json.dumps(doc).encode())])
    _append(lake_dir, "frames", last, schema.FRAMES, "last")
    report = analyze(spark, lake_dir, thresholds=LAB_THRESHOLDS)
    assert report.scope == NEW_DATA
    assert f"{old['connection_id']}: checkpoint format ackscope.timeline.state/1" in report.reason, report.reason
    assert f"{forged['connection_id']}: detectors' state refused" in report.reason, report.reason
    assert _tables(lake_dir) == whole


def analysed_but_the_last_piece(spark, traffic, lake_dir: str) -> tuple[pa.Table, list[dict]]:
    """The traffic's pieces but the last appended and analysed one by one: the last piece, and the
    analysis_state rows with a checkpoint of the connections it continues, by connection."""
    from spark_jobs.connection_pass import STATE_TABLE

    frames, connections = traffic
    *first, last = _pieces(frames)
    _append(lake_dir, "connections", connections, schema.CONNECTIONS, "all")
    for number, piece in enumerate(first):
        _append(lake_dir, "frames", piece, schema.FRAMES, f"piece-{number}")
        analyze(spark, lake_dir, thresholds=LAB_THRESHOLDS)
    ids = set(last["connection_id"].to_pylist())
    states = [row for row in lake.read_table(lake_dir, STATE_TABLE, schema.ANALYSIS_STATE).to_pylist()
              if row["checkpoint"] is not None and row["connection_id"] in ids]
    return last, sorted(states, key=lambda row: row["connection_id"])


def replace_states(lake_dir: str, rows: list[dict]) -> None:
    """These analysis_state rows in place of their connections' (forged checkpoints, for tests)."""
    from spark_jobs.connection_pass import STATE_TABLE

    DeltaTable(os.path.join(lake_dir, STATE_TABLE)).delete(
        "connection_id in (" + ", ".join(f"'{row['connection_id']}'" for row in rows) + ")")
    _append(lake_dir, STATE_TABLE, pa.Table.from_pylist(rows, schema=schema.ANALYSIS_STATE), schema.ANALYSIS_STATE,
            "tampered")


def _frames(rows: list[dict]) -> pa.Table:
    from analyzer.rows import dicts_to_table
    return dicts_to_table(rows, schema.FRAMES, {"ts": "ts_ns"}, "ts_ns")


def _lakes_split_at(spark, tmp_path, a, b, held: int) -> tuple[str, str]:
    """Two connections (test_timeline.Conv) in two lakes, each analysed: one with all their
    frames, one without A's from the `held`th on (_carry_on appends them)."""
    from analyzer.rows import dicts_to_table

    connections = dicts_to_table([{"connection_id": c.id, "agent_id": "test", "first_ts_ns": c.rows[0]["ts_ns"],
                                   "last_ts_ns": c.rows[-1]["ts_ns"]} for c in (a, b)],
                                 schema.CONNECTIONS, schema.CONNECTION_TIMESTAMPS, schema.CONNECTION_DATE_FROM)
    whole_dir, pieces_dir = str(tmp_path / "whole"), str(tmp_path / "pieces")
    _append(whole_dir, "frames", _frames(a.rows + b.rows), schema.FRAMES, "all")
    _append(pieces_dir, "frames", _frames(a.rows[:held] + b.rows), schema.FRAMES, "first")
    for lake_dir in (whole_dir, pieces_dir):
        _append(lake_dir, "connections", connections, schema.CONNECTIONS, "all")
        analyze(spark, lake_dir, thresholds=LAB_THRESHOLDS)
    return whole_dir, pieces_dir


def _carry_on(spark, lake_dir: str, rows: list[dict]) -> None:
    """These frame rows of one connection appended, and the run that carries it on."""
    _append(lake_dir, "frames", _frames(rows), schema.FRAMES, "second")
    report = analyze(spark, lake_dir, thresholds=LAB_THRESHOLDS)
    assert report.scope == NEW_DATA and report.carried_connections == report.connections == 1, report.reason


def _spy(monkeypatch, module, name: str, calls: list) -> None:
    """`module.name` called as before, each call's arguments kept in `calls`."""
    original = getattr(module, name)
    monkeypatch.setattr(module, name, lambda *args, **kw: calls.append(args) or original(*args, **kw))


def findings_searched(monkeypatch, searches: list) -> None:
    """The findings step rewrites the findings table as one too large to be rewritten whole (a
    bound of 0 bytes while it does: the files holding a replaced row searched for by the driver),
    each search's arguments kept in `searches`."""
    from spark_jobs import findings

    rewrite = findings.rewrite

    def searched(*args):
        with pytest.MonkeyPatch.context() as bound:
            bound.setattr(delta_io, "REWRITTEN_WHOLE_BYTES", 0)
            return rewrite(*args)

    monkeypatch.setattr(findings, "rewrite", searched)
    _spy(monkeypatch, delta_io, "scan", searches)


def _stray_files(lake_dir: str) -> list[str]:
    """Data files in a table's folder that no commit of its log added: a run's files are committed
    or deleted, never left behind."""
    stray = []
    for log in glob.glob(os.path.join(lake_dir, "*", "_delta_log")):
        table = os.path.dirname(log)
        added = {unquote(action["add"]["path"]) for commit in glob.glob(os.path.join(log, "*.json"))
                 for action in map(json.loads, open(commit)) if "add" in action}
        stray += [path for path in glob.glob(os.path.join(table, "**", "*.parquet"), recursive=True)
                  if not path.startswith(log) and os.path.relpath(path, table) not in added]
    return stray


def test_a_carried_runs_writes_are_commits_of_files_written_beside_its_pass(spark, tmp_path):
    """analyze._carried_with_rewrites: when every connection is carried on, the carried pass writes
    all its rows as files (channel_metrics and checkpoints too), and the files holding the rows they
    replace are rewritten beside it, so writing the tables starts no Spark job; nothing is left
    behind, and the tables are one run's over everything."""
    import io

    from .test_timeline import T0, Conv

    a, b = Conv("10.9.0.11:40011>10.9.0.9:5672@1", start=T0), Conv("10.9.0.12:40012>10.9.0.9:5672@2", start=T0)
    for conv in (a, b):
        conv.open(1)
        conv.consume(1)
    for tag in range(1, 6):
        a.deliver(1, tag, msg=f"m{tag}")
        b.deliver(1, tag, msg=f"n{tag}")
    held = len(a.rows)   # A's five deliveries open when the first run ends: provisional rows
    for tag in range(1, 6):
        a.ack(1, tag)
    whole_dir, pieces_dir = _lakes_split_at(spark, tmp_path, a, b, held)
    _append(pieces_dir, "frames", _frames(a.rows[held:]), schema.FRAMES, "second")
    progress = io.StringIO()
    report = analyze(spark, pieces_dir, thresholds=LAB_THRESHOLDS, progress=progress)
    assert report.carried_connections == report.connections == 1, report.reason
    for step in ("plan", "write tables"):   # the new files' connections read by the driver; commits
        assert f": {step} (" in progress.getvalue() and ", 0 Spark jobs)" in next(
            line for line in progress.getvalue().splitlines() if f": {step} (" in line)
    assert report.rows["deliveries"] == 5 and report.rows["channel_metrics"] > 0
    assert _stray_files(pieces_dir) == []
    assert _tables(pieces_dir) == _tables(whole_dir)


def test_a_first_delivery_settled_later_as_a_requeue_completes_a_loop_stored_elsewhere(spark, tmp_path):
    """The rescoping of the message kinds (detectors/scoped.py) must start from every row a run
    wrote that either kind reads, not only from those that came back: consumer A holds the first delivery of a poison
    message open when the first run ends (a provisional row), while consumer B's redeliveries of it,
    each requeued, are already in the lake (another agent appended them). The next run carries A on,
    A's nack settles that row as a requeue, and only with it does the loop reach the threshold."""
    from .test_timeline import T0, Conv

    a, b = Conv("10.9.0.1:40001>10.9.0.9:5672@1", start=T0), Conv("10.9.0.2:40002>10.9.0.9:5672@2", start=T0 + 10**9)
    for conv in (a, b):
        conv.open(1)
        conv.consume(1)
    a.deliver(1, 1, msg="poison")
    held = len(a.rows)
    a.ack(1, 1, method="basic.nack", requeue=True)
    bounces = LAB_THRESHOLDS.requeue_loop_deliveries - 2   # B's; A's nack makes the one the loop needs
    for tag in range(1, bounces + 2):
        b.deliver(1, tag, msg="poison", redelivered=True)
        b.ack(1, tag, method="basic.nack" if tag <= bounces else "basic.ack", requeue=True if tag <= bounces else None)
    whole_dir, pieces_dir = _lakes_split_at(spark, tmp_path, a, b, held)
    assert _kinds(whole_dir)["requeue_loop"] == {b.id}
    assert "requeue_loop" not in _kinds(pieces_dir)
    _carry_on(spark, pieces_dir, a.rows[held:])
    assert _tables(pieces_dir) == _tables(whole_dir)


def test_a_delivery_left_at_a_close_then_unsettled_by_a_gap_takes_its_finding_away(spark, tmp_path):
    """The rescoping must also start from the rows a run deletes: the broker closes consumer A's
    channel with a delivery unacked, and the first run ends before A's close-ok, so A's row is
    provisional and left at the close (a requeue_related row), and consumer B's redelivery of the
    message makes it a redelivery_after_close. Then bytes from A are missing before its close-ok:
    an ack may be among them, so the next run writes the row again with an unknown outcome, a row
    neither kind reads. The finding must go, as in one run over everything."""
    from .test_timeline import T0, Conv

    a, b = Conv("10.9.0.3:40003>10.9.0.9:5672@1", start=T0), Conv("10.9.0.4:40004>10.9.0.9:5672@2", start=T0)
    a.open(1)
    a.consume(1)
    a.deliver(1, 1, msg="twice")
    a.b(1, "channel.close", reply_code=406, reply_text="PRECONDITION_FAILED", failing_method="queue.declare")
    held = len(a.rows)
    a.c(0, "capture.gap", gap_bytes=100)
    a.c(1, "channel.close-ok")
    b.ts = a.ts
    b.open(1)
    b.consume(1)
    b.deliver(1, 1, msg="twice", redelivered=True)
    b.ack(1, 1)
    whole_dir, pieces_dir = _lakes_split_at(spark, tmp_path, a, b, held)
    assert "redelivery_after_close" not in _kinds(whole_dir)
    assert _kinds(pieces_dir)["redelivery_after_close"] == {a.id}
    _carry_on(spark, pieces_dir, a.rows[held:])
    assert "redelivery_after_close" not in _kinds(pieces_dir)
    assert _tables(pieces_dir) == _tables(whole_dir)


@pytest.mark.parametrize("findings_table", ["small", "large"])
def test_a_carried_runs_findings_take_one_spark_job_and_are_one_runs(spark, tmp_path, monkeypatch, findings_table):
    """findings.py: a run that carried every connection on computes its findings again in the
    driver, with no Spark job (the carried pass's rows were collected with it): here A's new frames make a requeue
    loop and leave a delivery at a close that B, already in the lake, got again (redelivered); A's
    delivery open when the first run ended, of a message that came back, is written again settled
    (a replaced requeue_related row). A findings table too large to be rewritten whole (forced by
    a bound of 0 bytes while the step rewrites it) has the files holding a replaced row searched
    for by the driver (delta_io.rewrite), still no Spark job. Both end with one run's
    tables over everything."""
    import io

    from spark_jobs import findings
    from .test_timeline import T0, Conv

    searches = []
    if findings_table == "large":
        findings_searched(monkeypatch, searches)
    a, b = Conv("10.9.0.13:40013>10.9.0.9:5672@1", start=T0), Conv("10.9.0.14:40014>10.9.0.9:5672@2", start=T0)
    a.open(1)
    a.consume(1)
    a.deliver(1, 1, msg="again", redelivered=True)
    held = len(a.rows)   # its delivery open: a provisional, requeue_related row
    a.ack(1, 1)
    for tag in range(2, LAB_THRESHOLDS.requeue_loop_deliveries + 2):
        a.deliver(1, tag, msg="poison", redelivered=tag > 2)
        a.ack(1, tag, method="basic.nack", requeue=True)
    a.open(2)
    a.consume(2)
    a.deliver(2, 1, msg="twice")
    a.close(2, by="broker", code=406, text="PRECONDITION_FAILED", failing="queue.declare")
    b.ts = a.ts
    b.open(1)
    b.consume(1)
    b.deliver(1, 1, msg="twice", redelivered=True)
    b.ack(1, 1)
    for conv in (a, b):   # as captured: packets the findings' evidence names, known without a scan
        for row in conv.rows:
            row.update(source=f"{conv.id}.pcap", source_packet=1000 + row["seq"])
    whole_dir, pieces_dir = _lakes_split_at(spark, tmp_path, a, b, held)
    assert _kinds(whole_dir) == {"requeue_loop": {a.id}, "redelivery_after_close": {a.id},
                                 "unbounded_prefetch": {a.id, b.id}}
    assert not {"requeue_loop", "redelivery_after_close"} & set(_kinds(pieces_dir))
    _append(pieces_dir, "frames", _frames(a.rows[held:]), schema.FRAMES, "second")
    progress = io.StringIO()
    report = analyze(spark, pieces_dir, thresholds=LAB_THRESHOLDS, progress=progress)
    assert report.carried_connections == report.connections == 1, report.reason
    findings_line = next(line for line in progress.getvalue().splitlines() if ": findings (" in line)
    assert findings_line.endswith(", 0 Spark jobs)"), findings_line
    assert len(searches) == (findings_table == "large"), searches
    assert _tables(pieces_dir) == _tables(whole_dir)


def test_a_run_that_changes_no_candidate_reads_no_deliveries_for_the_message_kinds(spark, tmp_path, monkeypatch):
    """findings.py: a run that adds or deletes no delivery either message kind reads (A's next
    messages are acked) keeps their stored findings (B's requeue loop) without reading the stored
    deliveries for them; the next run, whose rows hold a requeue, reads them. Both end as one run
    over everything."""
    from spark_jobs import findings
    from .test_timeline import T0, Conv

    a, b = Conv("10.9.0.5:40005>10.9.0.9:5672@1", start=T0), Conv("10.9.0.6:40006>10.9.0.9:5672@2", start=T0)
    for conv in (a, b):
        conv.open(1)
        conv.consume(1)
    a.deliver(1, 1, msg="plain")
    held = len(a.rows)   # the first run ends with A's delivery open: a provisional row, rewritten next
    a.ack(1, 1)
    quiet = len(a.rows)
    a.deliver(1, 2, msg="bounced")
    a.ack(1, 2, method="basic.nack", requeue=True)
    for tag in range(1, LAB_THRESHOLDS.requeue_loop_deliveries + 1):
        b.deliver(1, tag, msg="poison", redelivered=tag > 1)
        b.ack(1, tag, method="basic.nack", requeue=True)
    whole_dir, pieces_dir = _lakes_split_at(spark, tmp_path, a, b, held)
    assert _kinds(whole_dir)["requeue_loop"] == {b.id}
    read = []   # the stored deliveries read for the message kinds
    _spy(monkeypatch, findings, "stored_candidates", read)
    _carry_on(spark, pieces_dir, a.rows[held:quiet])
    assert read == [] and _kinds(pieces_dir)["requeue_loop"] == {b.id}
    _carry_on(spark, pieces_dir, a.rows[quiet:])
    assert len(read) == 1
    assert _tables(pieces_dir) == _tables(whole_dir)


def test_a_carried_runs_findings_take_their_packets_from_the_stored_findings_and_its_new_frames(
        spark, tmp_path, monkeypatch):
    """evidence_packets.known_packets: A's confirm_nack finding, stored with its packet, grows by a
    nack among the new frames, and its unbounded_prefetch finding stands: their packets come without
    a scan of `frames`. The next run's
    unacked_buildup names A's delivery, which no stored finding named: `frames` is scanned for that
    one. Both end as one run over everything."""
    from spark_jobs import findings
    from .test_timeline import T0, Conv

    a, b = Conv("10.9.0.7:40007>10.9.0.9:5672@1", start=T0), Conv("10.9.0.8:40008>10.9.0.9:5672@2", start=T0)
    b.open(1)
    a.open(1)
    a.c(1, "confirm.select")
    a.b(1, "confirm.select-ok")
    a.open(2)
    a.consume(2)
    a.deliver(2, 1)
    a.publish(1, "p1")
    a.confirm(1, 1, nack=True)
    held = len(a.rows)
    a.publish(1, "p2")
    a.confirm(1, 2, nack=True)
    nacked = len(a.rows)
    a.ts += 2 * 10**9   # A's delivery, acked now, stayed unacked past unacked_age_seconds
    a.ack(2, 1)
    for conv in (a, b):   # each piece of A from a capture file of its own, as a rotated capture's
        for row in conv.rows:
            piece = 1 if conv is b or row["seq"] <= held else 2 if row["seq"] <= nacked else 3
            row.update(source=f"{conv.id}-{piece}.pcap", source_packet=1000 + row["seq"])
    whole_dir, pieces_dir = _lakes_split_at(spark, tmp_path, a, b, held)
    assert _kinds(whole_dir) == {"confirm_nack": {a.id}, "unbounded_prefetch": {a.id}, "unacked_buildup": {a.id}}
    scans = []   # the scans of `frames`
    _spy(monkeypatch, findings, "_scanned", scans)
    _carry_on(spark, pieces_dir, a.rows[held:nacked])
    assert scans == [] and _kinds(pieces_dir) == {"confirm_nack": {a.id}, "unbounded_prefetch": {a.id}}
    _carry_on(spark, pieces_dir, a.rows[nacked:])
    assert len(scans) == 1
    unknown = scans[0][-1]   # only the frames of the finding that names one no stored finding named
    assert {connection_id for connection_id, _ in unknown} == {a.id} and len(unknown) <= 5, unknown
    assert _tables(pieces_dir) == _tables(whole_dir)


def test_a_connection_that_fails_a_check_after_its_rows_left_the_carried_pass_is_analysed_whole(
        spark, traffic, tmp_path, monkeypatch):
    """The carried pass lets records out in batches (here after every Arrow batch of 7 rows) and
    writes them to files (here a file per batch of a table's rows). A connection whose new frames
    fail a check after some of its rows left (a frame stamped before its carried bucket) is
    analysed whole, and none of the rows it had sent out is written: the tables are a full run's
    over the same lake (that its rows had left is shown by tests/test_carried_pass.py)."""
    import shutil

    from spark_jobs import connection_pass
    from spark_jobs.connection_pass import STATE_TABLE

    frames, connections = traffic
    lake_dir, full_dir = str(tmp_path / "lake"), str(tmp_path / "full")
    *first, last = _pieces(frames)
    _append(lake_dir, "connections", connections, schema.CONNECTIONS, "all")
    for number, piece in enumerate(first):
        _append(lake_dir, "frames", piece, schema.FRAMES, f"piece-{number}")
        analyze(spark, lake_dir, thresholds=LAB_THRESHOLDS)
    hot = _hot_connection(last)
    state, = [row for row in lake.read_table(lake_dir, STATE_TABLE, schema.ANALYSIS_STATE).to_pylist()
              if row["connection_id"] == hot]
    assert state["checkpoint"] is not None
    rows = last.to_pylist()
    mine = [i for i, row in enumerate(rows) if row["connection_id"] == hot]
    late = mine[len(mine) * 3 // 4]
    rows[late] = dict(rows[late], ts_ns=state["boundary_ns"] - 1)
    _append(lake_dir, "frames", pa.Table.from_pylist(rows, schema=last.schema), schema.FRAMES, "last")
    shutil.copytree(lake_dir, full_dir)

    monkeypatch.setattr(connection_pass, "FLUSH_RECORDS", 1)
    # Files of a row or two: the rows it sent out are in files written before the check failed.
    monkeypatch.setattr(connection_pass, "FILE_ROWS", 1)
    with conf_meanwhile(spark, "spark.sql.execution.arrow.maxRecordsPerBatch", "7"):
        report = analyze(spark, lake_dir, thresholds=LAB_THRESHOLDS)
    assert report.scope == NEW_DATA
    assert f"{hot}: a new frame (seq {rows[late]['seq']}) is older than the carried bucket" in report.reason
    # Nor is anything it wrote left behind: the rows taken back, the rewrite made beside the pass.
    assert _stray_files(lake_dir) == []
    analyze(spark, full_dir, thresholds=LAB_THRESHOLDS, full=True)
    assert _tables(lake_dir) == _tables(full_dir)
