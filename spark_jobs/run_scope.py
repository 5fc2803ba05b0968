"""Which connections a run of the analysis (re)computes, and why: the scopes full, new_data and days
(docs/analysis.md, "Incremental": Scopes), planned from the Delta logs alone.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass, replace
from urllib.parse import unquote

import pyarrow as pa
from deltalake import DeltaTable

from analyzer import schema
from analyzer.lake import (PROVISIONAL_PREFIX, UnreadableFile, damaged_file, filesystem, logged_rows, open_table,
                           read_table, set_aside, table_files, unreadable, written_with_prefix)
from analyzer.published import RUNS_TABLE

from .table_files import changes_between, distinct_strings, relative_in_table, spark_location
from analyzer.detectors.thresholds import Thresholds

FULL, NEW_DATA, DAYS = "full", "new_data", "days"
COMPLETE_SCOPES = (FULL, NEW_DATA)  # runs that leave every frame up to their version analysed


@dataclass(frozen=True)
class RunScope:
    scope: str
    reason: str
    frames_version: int                  # the frames snapshot this run analyses
    baseline_version: int | None = None  # new_data: the version the last complete run analysed
    new_files: tuple[str, ...] = ()      # new_data: the frames files added since the baseline
    since: str | None = None
    until: str | None = None
    frames_rows: int | None = None       # rows in that snapshot, from the Delta log (None: a file has no count)
    new_rows: int | None = None          # new_data: rows in the new files, from the Delta log
    whole: tuple[str, ...] = ()          # new_data: connections to analyse whole (their provisional frames taken out)

    @property
    def nothing_new(self) -> bool:
        return self.scope == NEW_DATA and not self.new_files and not self.whole

    @property
    def rows_to_read(self) -> int | None:
        """The frame rows the run reads, as the log counts them (None: not known); at most the snapshot's."""
        return self.new_rows if self.scope == NEW_DATA and not self.whole else self.frames_rows


def plan_run(lake: str, since: str | None, until: str | None, full: bool, bucket_seconds: int,
             overdue_ns: int, thresholds: Thresholds, output_tables: list[str],
             flagged_tables: dict[str, tuple[str, ...]] | None = None) -> RunScope:
    """`flagged_tables`: output tables and the columns a carried run relies on in them: a table
    written before one of them existed is replaced whole."""
    frames = open_table(lake, "frames")
    if frames is None:
        raise FileNotFoundError(f"no frames table in {lake}")
    version = frames.version()
    damaged = _set_aside_unreadable(lake, [*output_tables, RUNS_TABLE])
    if damaged:
        scope = RunScope(FULL, f"{damaged}: rebuilt by a whole analysis", version)
    else:
        scope = _scope(lake, frames, version, since, until, full, bucket_seconds, overdue_ns, thresholds,
                       output_tables, flagged_tables or {})
    new_files = {relative_in_table(path, spark_location(os.path.join(lake, "frames"))) for path in scope.new_files}
    return replace(scope, frames_rows=logged_rows(frames),
                   new_rows=logged_rows(frames, new_files) if scope.scope == NEW_DATA else None)


def _set_aside_unreadable(lake: str, tables: list[str]) -> str:
    """The tables the analysis writes that cannot be read, each set aside, as one reason ("": none).
    A whole analysis writes them again; a run that read them would fail, and so would every run after."""
    return "; ".join(_set_aside(lake, name, why) for name in tables if (why := unreadable(lake, name)) is not None)


def _set_aside(lake: str, name: str, why: str) -> str:
    aside = set_aside(lake, name)
    return f"table {name} unreadable ({why})" + (f", set aside as {os.path.basename(aside)}" if aside else "")


INPUT_TABLES = ("frames", "connections")   # the captured traffic: the ingest's, which no analysis can write again


class DamagedInput(Exception):
    """A data file of `frames` or `connections` that cannot be read: the run stops, naming it."""


def set_aside_damaged(lake: str, error: BaseException, tables: list[str]) -> str | None:
    """After a run failed on a data file of one of `tables` damaged inside its pages (its footer
    passed `unreadable` at plan time): that table set aside, and the reason; None: the run's own
    failure. The file the error names is read again here, checked: an error that merely names a
    file cannot set a table aside. A damaged file of the input raises DamagedInput."""
    for name, relative in _files_named(lake, error):
        if name not in tables and name not in INPUT_TABLES:
            continue
        try:
            table = open_table(lake, name)
            held = table is not None and relative in table_files(table)
        except Exception:  # noqa: BLE001 - a log that does not load now: not this file's fault to tell
            held = False
        why = damaged_file(os.path.join(lake, name, relative)) if held else None
        if why is None:
            continue
        if name in INPUT_TABLES:
            raise DamagedInput(f"the {name} table's file {os.path.join(lake, name, relative)} cannot be read ({why}): "
                               f"it holds captured traffic, which no analysis can write again; restore the file from "
                               f"a copy, or ingest the captures again into a new lake") from error
        return _set_aside(lake, name, f"{relative}: {why}")
    return None


def _files_named(lake: str, error: BaseException) -> list[tuple[str, str]]:
    """(table, file path relative to it) of every data file of the lake the error or its causes name."""
    root = filesystem(lake)[1].rstrip("/")
    named = []
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        text = error.path if isinstance(error, UnreadableFile) else str(error)
        for token in re.findall(r"[^\s'\"()\[\],]+\.parquet", text):
            at = token.find(root + "/")
            if at >= 0 and "/" in (rest := token[at + len(root) + 1:]):
                name, relative = rest.split("/", 1)
                named.append((name, unquote(relative)))
        error = error.__cause__ or error.__context__
    return list(dict.fromkeys(named))


def _scope(lake: str, frames: DeltaTable, version: int, since: str | None, until: str | None, full: bool,
           bucket_seconds: int, overdue_ns: int, thresholds: Thresholds, output_tables: list[str],
           flagged_tables: dict[str, tuple[str, ...]]) -> RunScope:
    if full:
        return RunScope(FULL, "asked for (--full)", version)
    if since is not None or until is not None:
        return RunScope(DAYS, "asked for (--since/--until)", version, since=since, until=until)
    runs = read_table(lake, RUNS_TABLE, schema.ANALYSIS_RUNS)
    complete = [run for run in (runs.to_pylist() if runs is not None else []) if run["scope"] in COMPLETE_SCOPES]
    last = max(complete, key=lambda run: (run["frames_version"], run["finished_ts"]), default=None)
    if last is None:
        return RunScope(FULL, "first run", version)
    missing = [name for name in output_tables if open_table(lake, name) is None]
    if missing:
        return RunScope(FULL, f"output table(s) {', '.join(missing)} missing", version)
    lacking = [(name, column) for name, columns in flagged_tables.items() for column in columns
               if column not in pa.schema(open_table(lake, name).schema().to_arrow()).names]
    if lacking:
        older, columns = dict.fromkeys(name for name, _ in lacking), sorted({column for _, column in lacking})
        return RunScope(FULL, f"output table(s) {', '.join(older)} written by an older ackscope "
                              f"(no {' or '.join(columns)} column)", version)
    if (last["bucket_seconds"], last["overdue_ns"]) != (bucket_seconds, overdue_ns):
        return RunScope(FULL, f"--bucket-seconds/--overdue-seconds differ from the last run's "
                              f"({last['bucket_seconds']} s, {last['overdue_ns'] / 1e9:g} s)", version)
    if last["thresholds"] != thresholds_json(thresholds):
        # The checkpoints' detector state and every stored finding were made under the old ones.
        return RunScope(FULL, "--threshold settings differ from the last run's", version)
    baseline = last["frames_version"]
    if baseline > version:
        return RunScope(FULL, f"the frames table is at version {version}, older than the last run's {baseline}",
                        version)
    changes = changes_between(lake, "frames", baseline, version)
    whole, taken_out = (), ""
    if changes.removed:
        whole = _taken_out_provisionally(changes.removed)
        if whole is None:
            return RunScope(FULL, f"{len(changes.removed)} frames file(s) deleted or rewritten since version "
                                  f"{baseline} (a delete, or new rows compacted with older ones before a run read "
                                  f"them): what changed cannot be told", version)
        taken_out = (f"; {len(changes.removed)} provisional frames file(s) taken out by an ingest continuing "
                     f"their flows: {len(whole)} connection(s) analysed whole")
    return RunScope(NEW_DATA, f"{len(changes.added)} frames file(s) added since version {baseline}{taken_out}",
                    version, baseline_version=baseline, new_files=changes.added, whole=whole)


def _taken_out_provisionally(removed: tuple[str, ...]) -> tuple[str, ...] | None:
    """The connections whose frames were in these removed files, where every one is a file an ingest
    committed provisionally (lake.PROVISIONAL_PREFIX); None where one is not, or can no longer be
    read (removed files stay until a VACUUM): what changed cannot be told."""
    if not all(written_with_prefix(path, PROVISIONAL_PREFIX) for path in removed):
        return None
    try:
        return tuple(distinct_strings(removed, "connection_id"))
    except UnreadableFile:
        return None


def thresholds_json(thresholds: Thresholds) -> str:
    return json.dumps(asdict(thresholds), sort_keys=True)
