"""Tables written into a lake as uncommitted Parquet files by a pass's tasks (either executor's:
connection_pass.py, carried_pass.py) or the driver's rewrites (delta_io.py), with the agent's
writer (analyzer.lake.TableWriter); the caller commits each table's files in one Delta commit
(docs/analysis.md, "One implementation of the rules", 3). Until then no log names a file: those of a
failed or repeated task are never committed, and VACUUM removes them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import pyarrow as pa
import pyarrow.compute as pc
from deltalake.transaction import AddAction

from analyzer.lake import TableWriter, by_flags

from .provisional import PROVISIONAL
from .requeue_related import REQUEUE_RELATED

# One row per file a task wrote.
FILES = pa.schema([("table", pa.string()), ("path", pa.string()), ("size", pa.int64()), ("date", pa.string()),
                   ("modified_ms", pa.int64()), ("stats", pa.string())])
# A table's rows (of one combination of FILE_FLAGS) a task gathers before writing them as files:
# large enough for Parquet's compression and few files, few enough that a task's memory stays
# bounded on a hot connection.
FILE_ROWS = 250_000
# The columns whose true and false rows go to files apart, where a table has them.
FILE_FLAGS = (PROVISIONAL, REQUEUE_RELATED)


def add_actions(files: list) -> dict[str, list[AddAction]]:
    """FILES rows (Spark's Rows, or dicts) -> each table's add actions."""
    adds: dict[str, list[AddAction]] = {}
    for file in files:
        adds.setdefault(file["table"], []).append(AddAction(file["path"], file["size"], {"date": file["date"]},
                                                            file["modified_ms"], True, file["stats"]))
    return adds


class FilesWriter:
    """One task's rows of table `name` written as Parquet files `file_rows` at a time (the agent's
    TableWriter: files by day); `files()` writes what is left and gives the files as FILES rows.
    Rows of each combination of FILE_FLAGS' values gather apart (up to `file_rows` each) and make
    files of their own, so the few flagged rows (open items, deliveries a requeue touched) fill
    few files however many the others fill. `order`: columns each file's rows are sorted by, in
    the writer's thread (a sorted file is smaller: ~5% for the deliveries); a file holds one day.
    `drop(connection_id)` takes back every row of a connection, written or not (a carried connection
    that falls back; channel_metrics computed again), and `of_connection` reads them."""

    def __init__(self, lake: str, name: str, table_schema: pa.Schema, file_rows: int = FILE_ROWS,
                 order: tuple[str, ...] = ()):
        self.name, self.schema, self.file_rows = name, table_schema, file_rows
        self.order = [(column, "ascending") for column in order]
        self.flags = tuple(flag for flag in FILE_FLAGS if flag in table_schema.names)
        self.writer = TableWriter(lake, name, table_schema, split_by=self.flags)
        self.pending: dict[tuple, list[pa.Table]] = {}   # the flags' values -> rows not written yet
        self.holds: dict[str, set[str]] = {}    # a written file (its path in the table) -> its connections
        self.beside = Beside()

    def add(self, rows: pa.Table) -> None:
        """Takes the rows; they are cast, sorted into piles and written in the writer's thread, so
        that the task goes on meanwhile (`Beside`); `drop` and `files` wait for it."""
        self.beside.run(self._add, rows)

    def _add(self, rows: pa.Table) -> None:
        # Cast by position, names checked: Spark's types to the stored ones (e.g. its timestamps' zone).
        for part, values in by_flags(rows.cast(self.schema), self.flags):
            key = tuple(values.values())
            pile = self.pending.setdefault(key, [])
            pile.append(part)
            if sum(piece.num_rows for piece in pile) >= self.file_rows:
                self._write(key)

    def drop(self, connection_id: str) -> None:
        """Every row of this connection out: of the rows not written yet, and of the files written
        (each rewritten without them, the old file deleted: it is in no log)."""
        self.beside.wait()

        def others(rows: pa.Table) -> pa.Table:
            return rows.filter(pc.not_equal(rows["connection_id"], connection_id))

        self.pending = {values: [others(rows) for rows in pile] for values, pile in self.pending.items()}
        for path in [path for path, held in self.holds.items() if connection_id in held]:
            del self.holds[path]
            kept = others(self.writer.take_back(path))
            if kept.num_rows:
                self._add(kept.select(self.schema.names))

    def of_connection(self, connection_id: str) -> pa.Table:
        """Every row of this connection so far, written or not (in the table's schema)."""
        self.beside.wait()

        def mine(rows: pa.Table) -> pa.Table:
            return rows.filter(pc.equal(rows["connection_id"], connection_id))

        days = {action.path: action.partition_values["date"] for action in self.writer.actions}
        parts = [mine(rows) for pile in self.pending.values() for rows in pile]
        parts += [mine(self.writer.read_file(path, days[path])) for path, held in self.holds.items()
                  if connection_id in held]
        return pa.concat_tables([self.schema.empty_table(), *parts])

    def _write(self, values: tuple) -> None:
        pile = self.pending.pop(values, [])
        if pile:
            rows = pa.concat_tables(pile)
            if self.order:  # by day first: each day's file is then a slice (lake.by_day), not a filtered copy
                rows = rows.sort_by([("date", "ascending"), *self.order])
            connections = set(pc.unique(rows["connection_id"]).to_pylist())
            written = len(self.writer.actions)
            self.writer.write(rows)
            for action in self.writer.actions[written:]:
                self.holds[action.path] = connections

    def files(self) -> pa.RecordBatch:
        self.beside.wait()
        for values in list(self.pending):
            self._write(values)
        return pa.RecordBatch.from_pylist([{"table": self.name, "path": path, "size": size, "date": values["date"],
                                            "modified_ms": modified, "stats": stats}
                                           for path, size, values, modified, stats in self.writer.files()],
                                          schema=FILES)


class Beside:
    """Work done in a thread beside the caller's (why: docs/analysis.md, "One implementation of the
    rules", 1), one piece at a time: `run` waits for the piece before (at most one is held: memory
    stays bounded) and starts the next; `wait` waits for the last and raises what it raised."""

    def __init__(self):
        self.thread: threading.Thread | None = None
        self.failed: BaseException | None = None

    def run(self, work: Callable, *args) -> None:
        self.wait()

        def piece() -> None:
            try:
                work(*args)
            except BaseException as error:  # noqa: B036 - handed to the caller's thread by `wait`
                self.failed = error

        self.thread = threading.Thread(target=piece, name="ackscope-files", daemon=True)
        self.thread.start()

    def wait(self) -> None:
        if self.thread is not None:
            self.thread.join()
            self.thread = None
        failed, self.failed = self.failed, None
        if failed is not None:
            raise failed
