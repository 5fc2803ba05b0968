"""What readers of the analysis' tables see: each table as the last finished run left it.

A run commits its tables one after another (Delta has no transaction across tables), every commit
naming the run (its commitInfo `userMetadata`, as delta-spark writes it), and publishes them all
by its last commit: its row in `analysis_runs`. `ackscope findings`, `report` and `push` read each
table at its newest version not written by a run that has not logged itself, so a run that fails
half-way (a full disk, a killed driver, a table it cannot write) leaves the tables of the run
before it visible, never a mix of two runs; the next run first deletes what the cut-short one
wrote (spark_jobs/provisional.py) and publishes a consistent set again. Commits that name no run
(a table's creation, a compaction) change no row and are visible as they land.
"""

from __future__ import annotations

import pyarrow as pa

from . import schema
from .lake import open_table, read_table

RUNS_TABLE = "analysis_runs"
# The commitInfo key naming the analysis run that wrote a commit (delta-spark's `userMetadata`).
RUN_ID_KEY = "userMetadata"
NOTHING = -1  # published_version of a table no finished run wrote


def finished_runs(lake: str) -> set[str]:
    """The ids of the runs that finished (logged), whatever their scope."""
    runs = read_table(lake, RUNS_TABLE, schema.ANALYSIS_RUNS, columns=["run_id"])
    return set(runs["run_id"].to_pylist()) if runs is not None else set()


def read_published(lake: str, name: str, table_schema: pa.Schema, finished: set[str] | None = None,
                   **read) -> pa.Table | None:
    """lake.read_table (same `read` arguments) at the table's published version; None if there is
    no such table. `finished`: finished_runs(lake), for a caller reading several tables."""
    table = open_table(lake, name)
    if table is None:
        return None
    version = published_version(table, finished_runs(lake) if finished is None else finished)
    if version == NOTHING:
        columns = read.get("columns")
        return pa.schema([f for f in table_schema if columns is None or f.name in columns]).empty_table()
    return read_table(lake, name, table_schema, version=version, **read)


def published_version(table, finished: set[str]) -> int | None:
    """The newest version of `table` (a DeltaTable) not written by an unfinished run; None: its
    current one. Usually the latest commit is a finished run's: one commit read."""
    limit = 8
    while True:
        history = table.history(limit)
        for commit in history:  # newest first
            run = commit.get(RUN_ID_KEY)
            if run is None or run in finished:
                return None if commit is history[0] else commit["version"]
        if len(history) < limit:
            return NOTHING  # every commit an unfinished run's
        limit *= 8
