"""Durable micro-batches: the agent's rows committed to the Delta lake once per flush interval.

Each table keeps its own flush sequence; a flush is one commit per table, tagged with the Delta
app transaction (`ackscope-agent-<agent id>`, sequence). The sequence starts after the last one
the table holds for this agent, so a restart continues it; a commit whose outcome is unknown (it
raised, but may have landed) is looked up by its transaction before it is tried again, so a
retried flush adds nothing twice.

A failing sink (disk full, permission denied, the store unreachable) never stops the capture:
rows stay buffered up to `max_buffered_rows`, the oldest are dropped beyond that (counted per
table), and the next flush tries again. Parquet files of a failed commit are never referenced;
vacuum removes them after the retention period. A failure is logged when it starts or its cause
changes, and the recovery once: a lake down for a day is not a log line per flush.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections import Counter

import pyarrow as pa

from .. import lake, schema
from ..metric_names import FLUSH_FAILED
from . import compaction
from .live_state import Histogram

TABLES = {"frames": schema.FRAMES, "connections": schema.CONNECTIONS}
DEFAULT_MAX_BUFFERED_ROWS = 1_000_000
FLUSH_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
DEFAULT_RETENTION_HOURS = 1.0
# The least retention `ackscope capture` accepts. A file a compaction replaced is still read by
# whoever resolved an older version of the table: an analysis run reads the snapshot it planned
# (minutes on a big lake, spark_jobs/analyze.py), a scoped run compares the versions since its last
# one (table_files.changes_between), and another agent's flush writes its files before it commits
# them. Removing files under them fails the run or loses the commit; an hour is longer than any of
# these, and delta-rs's vacuum counts whole hours anyway.
MIN_RETENTION_HOURS = 1.0
# The agent merges only small files written at least this long ago (compaction.py): the scheduled
# analysis merges the files it has analysed after each complete run (every 5-15 minutes as deployed),
# so beside it the agent merges nothing and its compaction costs its memory nothing; without it, the
# agent's tables still hold at most an interval and this of small files.
DEFAULT_COMPACT_MIN_AGE_S = 3600.0
log = logging.getLogger("ackscope.agent")


def check_retention(hours: float) -> None:
    if not hours >= MIN_RETENTION_HOURS:
        raise ValueError(f"--retention-hours {hours:g} is below the floor of {MIN_RETENTION_HOURS:g} h: readers "
                         "of older versions of the tables (an analysis run, another agent's flush) would lose "
                         "files under them")


def app_id_of(agent_id: str) -> str:
    return f"ackscope-agent-{agent_id}"


class _Table:
    def __init__(self, name: str, table_schema: pa.Schema, sequence: int | None):
        self.name, self.schema = name, table_schema
        # The version of this table's next commit for this agent; None while the lake could not be
        # read (at start): it is learnt before the first commit, never guessed.
        self.sequence = sequence
        self.buffered: list[pa.Table] = []
        self.inflight: list[pa.Table] = []  # the rows of a commit that failed (it may have landed)
        self.uncertain = False
        # The table, kept open from flush to flush and brought up to date with the commits since
        # (lake.TableWriter.commit): loaded anew each flush, each load replayed the log since the
        # last checkpoint (up to 100 commits) twice a flush. None: loaded at the next flush (at
        # start, after a failed flush, after a compaction).
        self.delta = None

    def rows(self) -> int:
        return sum(t.num_rows for t in self.buffered) + sum(t.num_rows for t in self.inflight)


class LakeSink:
    def __init__(self, lake_dir: str, agent_id: str, *, max_buffered_rows: int = DEFAULT_MAX_BUFFERED_ROWS,
                 retention_hours: float = DEFAULT_RETENTION_HOURS):
        self.lake_dir, self.agent_id = lake_dir, agent_id
        self.app_id = app_id_of(agent_id)
        self.max_buffered_rows = max_buffered_rows
        self.retention_hours = retention_hours
        self.lock = threading.Lock()
        self.tables = {name: _Table(name, s, self._next_sequence(name)) for name, s in TABLES.items()}
        self.rows_dropped: Counter = Counter()
        self.flushes: Counter = Counter()      # outcome -> flushes
        self.flush_durations = Histogram(FLUSH_BUCKETS)
        self.last_flush_ts: float | None = None
        self.last_error: str | None = None
        self.failing = 0                       # flushes failed in a row (0: the last one succeeded)
        self._failure_kinds: set = set()
        self.compactions = 0

    def _next_sequence(self, name: str) -> int | None:
        try:
            return self._last_sequence_or_raise(name) + 1
        except Exception:  # an unreadable lake at start: the flushes report it and learn the sequence
            return None

    # -- rows in (decode loop's thread) ------------------------------------------------------------

    def add(self, name: str, table: pa.Table | None) -> None:
        if table is None or not table.num_rows:
            return
        with self.lock:
            self.tables[name].buffered.append(table)
            self._bound()

    def buffered_rows(self) -> int:
        with self.lock:
            return sum(t.rows() for t in self.tables.values())

    def _bound(self) -> None:
        """Beyond the bound, the oldest batches go (frames before connections: a connection row is
        one per connection, its loss costs more)."""
        total = sum(t.rows() for t in self.tables.values())
        for t in self.tables.values():
            for batches in (t.inflight, t.buffered):
                while total > self.max_buffered_rows and batches:
                    dropped = batches.pop(0)
                    total -= dropped.num_rows
                    self.rows_dropped[t.name] += dropped.num_rows

    # -- flushing (the sink's own thread) --------------------------------------------------------------

    def flush(self, metadata: dict | None = None) -> bool:
        """One commit per table with rows. True when every table's rows are committed."""
        started = time.perf_counter()
        errors, kinds = [], set()
        for t in self.tables.values():
            try:
                self._flush_table(t, metadata or {})
            except BaseException as exc:  # noqa: B036 - an interrupt too may come after the commit landed
                t.uncertain = True
                t.delta = None  # what the failure left in it is not trusted: loaded anew
                if not lake.is_failure(exc):
                    raise
                errors.append(f"{t.name}: {type(exc).__name__}: {exc}")
                kinds.add(type(exc).__name__)
        elapsed = time.perf_counter() - started
        error = "; ".join(errors) or None
        with self.lock:
            self.flushes[FLUSH_FAILED if error else "ok"] += 1
            self.flush_durations.observe(elapsed)
            # Messages name files that differ from try to try, and a table joins the failure when it
            # has rows: a new cause is a new type of error.
            if error and kinds != self._failure_kinds:
                log.warning("flush to %s failed (rows kept up to --max-buffered-rows, retried every flush): %s",
                            self.lake_dir, error)
            elif not error and self.failing:
                log.warning("flush to %s succeeded again after %d failed flushes", self.lake_dir, self.failing)
            self.failing = self.failing + 1 if error else 0
            self.last_error, self._failure_kinds = error, kinds
            if not error:
                self.last_flush_ts = time.time()
        return not error

    def _flush_table(self, t: _Table, metadata: dict) -> None:
        if t.sequence is None:
            t.sequence = self._last_sequence_or_raise(t.name) + 1
        if t.uncertain:
            committed = self._last_sequence_or_raise(t.name)
            with self.lock:
                if committed >= t.sequence:  # the failed commit did land: its rows are in the table
                    t.inflight = []
                    t.sequence = committed + 1
                t.uncertain = False
        with self.lock:
            t.inflight += t.buffered
            t.buffered = []
            batch = list(t.inflight)
        if not batch:
            return
        writer = lake.TableWriter(self.lake_dir, t.name, t.schema)
        writer.write(pa.concat_tables(batch).combine_chunks() if len(batch) > 1 else batch[0])
        if t.delta is None:
            t.delta = lake.open_or_create(writer.path, t.schema)
        writer.commit(self.app_id, {"ackscope.agent_id": self.agent_id, **metadata}, version=t.sequence,
                      table=t.delta)
        with self.lock:
            # Rows dropped by the bound while writing were in this commit after all: not lost.
            for dropped in batch:
                if not any(dropped is kept for kept in t.inflight):
                    self.rows_dropped[t.name] -= dropped.num_rows
            t.inflight = []
            t.sequence += 1

    def _last_sequence_or_raise(self, name: str) -> int:
        table = lake.open_table(self.lake_dir, name)
        return (table.transaction_version(self.app_id) or 0) if table is not None else 0

    # -- small files ---------------------------------------------------------------------------------

    def compact(self, min_age_s: float = 0.0) -> None:
        """Merge small files written at least `min_age_s` ago in bounded groups (compaction.py),
        checkpoint the log and vacuum files older than the retention, table by table; appends from
        this and other agents go on meanwhile (an append never conflicts with a compaction; two
        agents, or an agent and the analysis, merging the same files: one commit fails, and its
        group is tried again next time)."""
        written_before_ms = int((time.time() - min_age_s) * 1000)
        for name, t in self.tables.items():
            # The next flush loads the table from the checkpoint written here: the kept table's state
            # starts again from the compacted snapshot, at least once per compaction interval.
            t.delta = None
            try:
                compaction.compact_table(self.lake_dir, name, {"ackscope.agent_id": self.agent_id,
                                                               "ackscope.operation": "compaction"},
                                         written_before_ms=written_before_ms)
                table = lake.open_table(self.lake_dir, name)
                if table is None:
                    continue
                table.create_checkpoint()
                # delta-rs takes whole hours (a float raised TypeError, so vacuum never ran): round up,
                # never removing a file sooner than asked.
                table.vacuum(retention_hours=math.ceil(self.retention_hours), enforce_retention_duration=False,
                             dry_run=False)
                self.compactions += 1
            except BaseException as exc:  # noqa: B036 - lake.is_failure
                if not lake.is_failure(exc):
                    raise
                log.warning("compaction of %s failed (tried again later): %s: %s", name, type(exc).__name__, exc)

    def flush_histogram(self) -> tuple[list, float]:
        with self.lock:
            return self.flush_durations.cumulative(), self.flush_durations.sum


def lake_writable(lake_dir: str) -> bool:
    return os.access(lake_dir, os.W_OK)
