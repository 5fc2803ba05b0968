"""Delta tables on disk through delta-rs: Parquet files written as data streams in, one atomic commit.

`TableWriter` writes Arrow tables as Parquet files inside the table folder while decoding runs
(memory stays bounded), then `commit()` adds them all in a single Delta commit carrying a Delta
app transaction id. Re-running with the same id adds nothing: that is how ingesting a file twice
stays idempotent, and why a crash before the commit leaves only unreferenced files behind.
The Spark jobs commit their Parquet output through this same module when the Delta JARs are absent.

A lake is a local folder or an object-store URL (`s3://bucket/prefix`, or `s3a://`, the spelling
Spark's s3a connector wants, which delta-rs accepts too). Credentials and the endpoint come from the
environment variables delta-rs reads (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION,
AWS_ENDPOINT_URL, AWS_ALLOW_HTTP, ...); pyarrow, which reads and writes the Parquet files, reads the
same ones (docs/deployment.md).
"""

import json
import os
import time
import uuid
from bisect import bisect_left
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import replace
from typing import NamedTuple
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from deltalake import CommitProperties, DeltaTable, Field, Transaction
from deltalake.exceptions import DeltaError, TableNotFoundError
from deltalake.transaction import AddAction, RemoveAction

from .schema import PARTITION_BY

# Every data file is written with a CRC32 of each page and read with it checked: bytes damaged
# inside a page (a bad disk, a torn copy) are an error naming the file, never other values read
# as if they were the table's. A file written without them (an older ackscope) is read unchecked.
WRITE_CHECKSUMS = {"write_page_checksum": True}
READ_CHECKSUMS = {"page_checksum_verification": True}


S3_SCHEMES = ("s3", "s3a")
# Reader features that leave a Parquet file meaning what it says: the only ones a read of a table's
# files themselves (pyarrow here; Spark through the bridge) may meet. Any other (deletion vectors
# hiding rows, column mapping renaming columns, ...) needs delta-spark to be read correctly.
FILE_READER_FEATURES = {"timestampNtz", "v2Checkpoint", "vacuumProtocolCheck"}


def is_local(path: str) -> bool:
    return "://" not in path


def is_s3(path: str) -> bool:
    return path.split("://", 1)[0] in S3_SCHEMES and "://" in path


def filesystem(path: str) -> tuple[pafs.FileSystem, str]:
    """pyarrow's file system for a lake path and the path within it. An object store is configured
    from the environment (AWS_* for S3), as delta-rs configures its own; `s3a://` is S3 to pyarrow."""
    if is_local(path):
        return pafs.LocalFileSystem(), os.path.abspath(path)
    rest = path.split("://", 1)[1]
    return pafs.FileSystem.from_uri(("s3://" + rest) if is_s3(path) else path)


def is_dir(path: str) -> bool:
    """A local folder, or an object-store prefix holding objects."""
    if is_local(path):
        return os.path.isdir(path)
    fs, inner = filesystem(path)
    return fs.get_file_info(inner).type == pafs.FileType.Directory


def make_dir(path: str) -> None:
    """A local folder (a path or a file:// URI), made with its parents; an object store needs none
    (prefixes exist by their objects, and a made "folder" would be an empty object)."""
    make_dir_in(*filesystem(path))


def make_dir_in(fs: pafs.FileSystem, inner: str) -> None:
    """`make_dir` for a path within a file system `filesystem()` gave."""
    if isinstance(fs, pafs.LocalFileSystem):
        fs.create_dir(inner, recursive=True)


def open_table(lake: str, name: str) -> DeltaTable | None:
    try:
        return DeltaTable(os.path.join(lake, name))
    except TableNotFoundError:
        return None


def unreadable(lake: str, name: str) -> str | None:
    """Why the table cannot be read: its log does not load (an entry cut short, not JSON), or a data
    file it names is missing or has no Parquet footer (cut short). None: it reads, or there is none.
    Each file's footer is one small read; a file damaged inside its pages passes."""
    try:
        table = open_table(lake, name)
        for uri in table.file_uris() if table is not None else ():
            fs, inner = filesystem(uri)
            with fs.open_input_file(inner) as data:
                pq.read_metadata(data)
    except (DeltaError, pa.ArrowInvalid, FileNotFoundError) as error:
        return (str(error).strip().splitlines() or [type(error).__name__])[0]
    return None


def is_failure(error: BaseException) -> bool:
    """A failure of the store or of its libraries, for a caller that counts it and tries again: any
    Exception, and a panic in delta-rs's Rust code, which pyo3 raises as `PanicException`, a
    BaseException. Let through, a panic ends the thread it meets: in the agent, the sink's, and the
    capture would go on with nothing flushed again."""
    return isinstance(error, Exception) or type(error).__name__ == "PanicException"


class UnreadableFile(OSError):
    """A data file of a table that cannot be read (missing, cut short, damaged inside its pages):
    `path` names it, `why` is the reader's reason."""

    def __init__(self, path: str, why: str):
        super().__init__(f"{path}: unreadable ({why})")
        self.path, self.why = path, why


@contextmanager
def reading(path: str):
    """Errors reading the data file at `path` raised as UnreadableFile naming it (pyarrow's own
    say only what failed, not in which file)."""
    try:
        yield
    except UnreadableFile:
        raise
    except (OSError, pa.ArrowException) as error:
        raise UnreadableFile(path, (str(error).strip().splitlines() or [type(error).__name__])[0]) from error


def damaged_file(uri: str) -> str | None:
    """Why this data file cannot be read whole, its page checksums checked; None: it reads."""
    try:
        fs, inner = filesystem(uri)
        with fs.open_input_file(inner) as data:
            pq.read_table(data, **READ_CHECKSUMS)
    except (OSError, pa.ArrowException) as error:
        return (str(error).strip().splitlines() or [type(error).__name__])[0]
    return None


def set_aside(lake: str, name: str) -> str | None:
    """Move an unreadable table out of the way (a local lake keeps it beside, as NAME.unreadable-TIME,
    for whoever wants to look; an object store drops it): the path it was moved to, or None."""
    fs, inner = filesystem(os.path.join(lake, name))
    if isinstance(fs, pafs.LocalFileSystem):
        aside = f"{inner}.unreadable-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}"
        fs.move(inner, aside)
        return aside
    fs.delete_dir(inner)
    return None


def check_files_readable(table: DeltaTable, location: str) -> None:
    """Refuses a table whose Parquet files do not mean what they say without Delta's reader
    features (FILE_READER_FEATURES): its rows read from the files would be wrong, not missing."""
    protocol = table.protocol()
    if protocol.min_reader_version == 1:
        return
    # Reader version 2 is column mapping; 3 lists its features.
    features = set(protocol.reader_features or []) if protocol.min_reader_version >= 3 else {"columnMapping"}
    if not features <= FILE_READER_FEATURES:
        raise RuntimeError(f"{location}: the table uses {sorted(features - FILE_READER_FEATURES)}, which a read of "
                           f"its Parquet files cannot apply; read it with delta-spark (--delta-mode native, with "
                           f"--local-up-to 0 for a run the driver would make itself)")


def read_table(lake: str, name: str, schema: pa.Schema, columns: list[str] | None = None,
               where: pc.Expression | None = None, files: set[str] | None = None,
               version: int | None = None) -> pa.Table | None:
    """A table's current snapshot (or the one at `version`) as Arrow, or None if there is no such
    table. `where` (on columns other than the partition) filters rows while the Parquet files are
    read, so a few rows of a big table cost little memory; `files`: only these of the snapshot's
    files (paths relative to the table, unquoted), where the caller knows from that snapshot that
    the others hold none of the rows it wants.

    delta-rs resolves the snapshot (files and their partition values from the Delta log); pyarrow
    reads the Parquet files. Scanning through delta-rs's pyarrow dataset instead leaves threads
    behind that can abort the interpreter at exit (delta-rs#2184, polars#24169)."""
    table = open_table(lake, name)
    if table is None:
        return None
    if version is not None:
        table.load_as_version(version)
    check_files_readable(table, os.path.join(lake, name))
    wanted = [f for f in schema if columns is None or f.name in columns]
    # Files read in the schema's types (`where` may name columns not wanted); a column a file lacks
    # (written before the table had it) reads as nulls, as in Spark.
    in_files = pa.schema([f for f in schema if f.name not in PARTITION_BY])
    read = [f.name for f in wanted if f.name not in PARTITION_BY]
    parts = []
    fs, root = filesystem(os.path.join(lake, name))
    for path, file in table_files(table).items():
        if files is not None and path not in files:
            continue
        with reading(f"{root}/{path}"):
            part = pq.read_table(f"{root}/{path}", filesystem=fs, partitioning=None, schema=in_files, columns=read,
                                 filters=where, **READ_CHECKSUMS)
        parts.append(_conformed(part, pa.schema(wanted), file.partition_values))
    if not parts:
        return pa.schema(wanted).empty_table()
    return pa.concat_tables(parts)


# The rows of each batch `scan` yields, read on one thread through a buffer of SCAN_BUFFER_BYTES (not a
# row group's column chunks at once): what it holds of a table at a time. Measured on the 1 M-frame
# generated lake's deliveries (526,464 rows, 15 of their columns, a row group a file): +145 MB of peak
# RSS at 65,536 rows with pyarrow's defaults, +51-65 MB so, as fast (0.4-0.6 s).
SCAN_BATCH_ROWS = 16_384
SCAN_BUFFER_BYTES = 1024 * 1024
# Delta truncates string statistics to a prefix this long (the protocol's "fixed prefix length"):
# a logged maximum this long or longer may be a cut value, lower than the file's true maximum.
LOGGED_STRING_PREFIX = 32

Bounds = dict[str, tuple]   # column -> (smallest, largest) value, None where unknown


def scan(lake: str, name: str, schema: pa.Schema, columns: list[str], version: int | None = None,
         since: str | None = None, files: set[str] | None = None, bounded: tuple[str, ...] = (),
         may_hold: Callable[[Bounds], bool] | None = None, batch_rows: int | None = None):
    """A table's snapshot (at `version`; None: the current one) streamed: (file, batch) pairs, the
    file's path relative to the table, each batch at most `batch_rows` rows (None: SCAN_BATCH_ROWS)
    of `columns` in `schema`'s types (a column a file lacks reads as nulls, a partition column as
    its value), so what is held at a time is one batch, however big the table. `since`: only the `date`
    partitions from that UTC day on (a file without a day is left out, as Spark's filter leaves
    it); `files`: only these (paths relative to the table). Pruned by statistics: `may_hold(bounds)`,
    given the smallest and largest values of the `bounded` columns that a file's log entry keeps
    (Delta's statistics) and then that each of its row groups keeps (Parquet's), says whether
    those rows may hold a wanted one; where it says no, they are not read. A bound that is not
    kept is None (so is a logged string maximum that may have been cut: LOGGED_STRING_PREFIX)."""
    table = open_table(lake, name)
    if table is None:
        return
    if version is not None:
        table.load_as_version(version)
    check_files_readable(table, os.path.join(lake, name))
    fs, root = filesystem(os.path.join(lake, name))
    actions = pa.table(table.get_add_actions(flatten=True))
    partitions = {column: actions[f"partition.{column}"].to_pylist() if f"partition.{column}" in actions.column_names
                  else [None] * actions.num_rows for column in PARTITION_BY}
    logged = {column: [actions[f"{side}.{column}"].to_pylist() if f"{side}.{column}" in actions.column_names
                       else [None] * actions.num_rows for side in ("min", "max")] for column in bounded}
    wanted = pa.schema([schema.field(column) for column in columns])
    for index, path in enumerate(unquote(path) for path in actions["path"].to_pylist()):
        values = {column: partitions[column][index] for column in PARTITION_BY}
        if files is not None and path not in files or since is not None and (values["date"] is None
                                                                             or str(values["date"]) < since):
            continue
        if may_hold is not None and not may_hold({column: (low[index], _logged_max(high[index]))
                                                  for column, (low, high) in logged.items()}):
            continue
        with reading(f"{root}/{path}"), fs.open_input_file(f"{root}/{path}") as source:
            parquet = pq.ParquetFile(source, pre_buffer=False, buffer_size=SCAN_BUFFER_BYTES, **READ_CHECKSUMS)
            groups = [group for group in range(parquet.metadata.num_row_groups)
                      if may_hold is None or may_hold(_group_bounds(parquet.metadata, group, bounded))]
            present = [column for column in columns if column in parquet.schema_arrow.names]
            if not groups:
                continue
            for batch in parquet.iter_batches(batch_size=batch_rows or SCAN_BATCH_ROWS, row_groups=groups,
                                              columns=present, use_threads=False):
                yield path, _conformed(batch, wanted, {c: v for c, v in values.items() if c not in present})


def any_within(values: list, bounds: tuple | None) -> bool:
    """May one of these values (sorted, no None) be among values whose smallest and largest are
    `bounds` (each None where unknown; `bounds` None: nothing is known)?"""
    low, high = bounds if bounds is not None else (None, None)
    try:
        first = bisect_left(values, low) if low is not None else 0
        return first < len(values) and (high is None or values[first] <= high)
    except TypeError:   # bounds of another type than the values: they say nothing
        return True


def _logged_max(value):
    """A maximum from the Delta log as a bound: a string as long as Delta's prefix may be cut (lower
    than the true maximum), so it bounds nothing."""
    return None if isinstance(value, str) and len(value) >= LOGGED_STRING_PREFIX else value


def _group_bounds(footer: pq.FileMetaData, group: int, columns: tuple[str, ...]) -> Bounds:
    """The smallest and largest value of these columns in a row group, as its footer keeps them."""
    row_group = footer.row_group(group)
    bounds = {}
    for index in range(row_group.num_columns):
        chunk = row_group.column(index)
        if chunk.path_in_schema in columns:
            stats = chunk.statistics
            bounds[chunk.path_in_schema] = (stats.min, stats.max) if stats is not None and stats.has_min_max \
                else (None, None)
    return bounds


def logged_rows(table: DeltaTable, files: set[str] | None = None) -> int | None:
    """The snapshot's rows (or those of `files`, paths relative to the table) as its log counts them
    (each file's numRecords), without reading a file: frames can be billions of rows. None when
    some file counted was committed without the count."""
    actions = pa.table(table.get_add_actions(flatten=True))
    if files is not None:
        actions = actions.filter(pa.array([unquote(path) in files for path in actions["path"].to_pylist()],
                                          pa.bool_()))
    if "num_records" not in actions.column_names or actions["num_records"].null_count:
        return None
    return sum(actions["num_records"].to_pylist())


def committed(lake: str, name: str, app_id: str) -> bool:
    """Has a commit with this app transaction id already landed in the table?"""
    table = open_table(lake, name)
    return table is not None and table.transaction_version(app_id) is not None


# A merge of files (TableWriter.write_merged) reads them this many rows at a time, on one thread, and
# holds at most about so many bytes of rows (Arrow, decoded) before it writes them as a row group of
# the new file: what a compaction holds, whatever it merges. Measured merging 24 of the agent's frames
# files (bench/compaction.py's rows, 4.8 MB): anonymous memory +80 MB at 16 MB and 16,384 rows on
# pyarrow's threads, +58 MB on one thread, +32 MB at 4 MB and 8,192 rows; less gains nothing.
MERGE_BATCH_ROWS = 8_192
MERGE_ROW_GROUP_BYTES = 4 * 1024 * 1024

# The name prefix (TableWriter's `prefix`) of the files an ingest commits provisionally: the rows
# that ended a capture's open flows, which the ingest of the next piece takes out again. Compactions
# leave them alone.
PROVISIONAL_PREFIX = "provisional"

# How Hive, Spark and Delta writers name the folder of a null partition value.
NULL_PARTITION = "__HIVE_DEFAULT_PARTITION__"

# String columns whose values are unique (one per message): a dictionary page only adds to them.
UNIQUE_STRINGS = frozenset(("message_id", "message_identity"))


def dictionary_columns(schema: pa.Schema) -> list[str]:
    """The columns a data file dictionary-encodes: strings that repeat (connection ids, methods,
    queues, outcomes). Not numbers: seqs, times and tags are mostly unique, and zstd compresses
    the few that repeat. Measured on a generated deliveries table (176k rows), against a
    dictionary on every column: 37% less CPU to write, 41% smaller, no slower to read."""
    return [f.name for f in schema if pa.types.is_string(f.type) and f.name not in UNIQUE_STRINGS]


class TableWriter:
    """`split_by`: boolean columns whose true and false rows go to files apart (a file per
    combination of their values), each file's add action carrying each column's min, max and null
    count (the Spark jobs' `provisional` and the deliveries' `requeue_related`)."""

    def __init__(self, lake: str, name: str, schema: pa.Schema, split_by: tuple[str, ...] = (), prefix: str = ""):
        self.path = os.path.join(lake, name)
        self.prefix = f"{prefix}-" if prefix else ""  # in the files' names: files_named() finds them
        self.fs, self.root = filesystem(self.path)
        self.schema = schema
        self.split_by = split_by
        self.actions: list[AddAction] = []
        self.rows = 0

    def write(self, table: pa.Table) -> None:
        if table.num_rows == 0:
            return
        for date, whole in by_day(table):
            # Delta keeps partition values in the log, not in the data files.
            for part, values in by_flags(whole.drop_columns(PARTITION_BY), self.split_by):
                relative, full = self._new_file(date)
                pq.write_table(part, full, compression="zstd", use_dictionary=dictionary_columns(part.schema),
                               filesystem=self.fs, **WRITE_CHECKSUMS)
                self._written(relative, date, part.num_rows, values)

    def _new_file(self, date: str | None) -> tuple[str, str]:
        """A new data file's path relative to the table and in the store, its folder made."""
        relative = (f"date={NULL_PARTITION if date is None else date}/"
                    f"part-{self.prefix}{uuid.uuid4().hex}.zstd.parquet")
        full = f"{self.root}/{relative}"
        make_dir_in(self.fs, os.path.dirname(full))
        return relative, full

    def _written(self, relative: str, date: str | None, rows: int, values: dict) -> None:
        """A file written, into the next commit."""
        self.actions.append(AddAction(relative, self.fs.get_file_info(f"{self.root}/{relative}").size, {"date": date},
                                      int(time.time() * 1000), True, json.dumps(_file_stats(rows, values))))
        self.rows += rows

    def take_back(self, relative: str) -> pa.Table:
        """A file written so far, out of the next commit and deleted: its rows, in the writer's
        schema (its `date` from the folder it was in)."""
        (action,) = [a for a in self.actions if a.path == relative]
        self.actions.remove(action)
        rows = self.read_file(relative, action.partition_values["date"])
        self.fs.delete_file(f"{self.root}/{relative}")
        self.rows -= rows.num_rows
        return rows

    def read_file(self, relative: str, date: str | None) -> pa.Table:
        """The rows of a data file of this table (its path relative to the table, as the store
        names it) in the writer's schema, with `date`, its partition value (the log's, not in the
        file)."""
        with reading(f"{self.root}/{relative}"):
            rows = pq.read_table(f"{self.root}/{relative}", filesystem=self.fs, partitioning=None, **READ_CHECKSUMS)
        return _conformed(rows, self.schema, {"date": date})

    def write_merged(self, date: str | None, files: list[str], values: dict[str, bool] | None = None) -> None:
        """The rows of these data files of the table (paths relative to it, all of partition `date`)
        into one new file, streamed: a batch of a file at a time is read, and at most
        MERGE_ROW_GROUP_BYTES of rows are held before they are written as a row group, so the memory
        is bounded whatever the files add up to. `values`: the one value of each of the `split_by`
        columns that every row of the files holds, kept in the new file's statistics as `write`
        keeps them."""
        in_file = pa.schema([f for f in self.schema if f.name not in PARTITION_BY])
        relative, full = self._new_file(date)
        held: list[pa.Table] = []
        rows = 0
        with pq.ParquetWriter(full, in_file, compression="zstd", use_dictionary=dictionary_columns(in_file),
                              filesystem=self.fs, **WRITE_CHECKSUMS) as out:
            for path in files:
                for batch in _batches(self.fs, f"{self.root}/{path}"):
                    held.append(_conformed(batch, in_file, {}))
                    rows += batch.num_rows
                    if sum(t.nbytes for t in held) >= MERGE_ROW_GROUP_BYTES:
                        out.write_table(pa.concat_tables(held))
                        held = []
            if held:
                out.write_table(pa.concat_tables(held))
        self._written(relative, date, rows, values or {})

    def files(self) -> list[tuple]:
        """The files written so far, as plain tuples another process can hand to `adopt()`."""
        return [(a.path, a.size, dict(a.partition_values), a.modification_time, a.stats) for a in self.actions]

    def adopt(self, files: list[tuple], rows: int) -> None:
        """Include files another process wrote into this table's folder in the next commit."""
        for path, size, partition_values, mtime, stats in files:
            self.actions.append(AddAction(path, size, partition_values, mtime, True, stats))
        self.rows += rows

    def commit(self, app_id: str | list[str], metadata: dict | None = None, version: int = 1,
               remove: list[str] = (), data_change: bool = True, table: DeltaTable | None = None) -> int:
        """Add every file written so far in one commit tagged with the app transaction (app_id,
        version), or with each of several ids; `remove`: files of the table (paths
        relative to it) taken out in the same commit. `data_change` false: the commit moves rows
        between files and changes none (a compaction), and readers of changes skip it. Returns the
        table version.

        `table`: this table, kept open by a caller that commits again and again (the agent's
        sink): it is brought up to date by reading only the commits since it was (Delta's log
        read incrementally), instead of loaded anew from the last checkpoint, and is left up to
        date, this commit included."""
        if table is None:
            table = open_or_create(self.path, self.schema)
        else:
            table.update_incremental()
        add_missing_columns(table, self.schema)
        ids = [app_id] if isinstance(app_id, str) else app_id
        adds = self.actions if data_change else [replace(add, data_change=False) for add in self.actions]
        table.create_write_transaction(
            [*adds, *removals(table, remove, data_change)], mode="append", schema=self.schema, partition_by=PARTITION_BY,
            commit_properties=CommitProperties(
                custom_metadata={k: str(v) for k, v in (metadata or {}).items()},
                app_transactions=[Transaction(i, version) for i in ids]))
        table.update_incremental()  # a commit leaves the table object at the version it read
        return table.version()


def _batches(fs: pafs.FileSystem, path: str):
    """A data file's rows, MERGE_BATCH_ROWS at a time, on one thread."""
    with reading(path), fs.open_input_file(path) as source:
        yield from pq.ParquetFile(source, **READ_CHECKSUMS).iter_batches(batch_size=MERGE_BATCH_ROWS, use_threads=False)


class TableFile(NamedTuple):
    size: int
    partition_values: dict


def table_files(table: DeltaTable) -> dict[str, TableFile]:
    """Each data file of the table's loaded snapshot by its path relative to the table as the store
    names it (the log URI-encodes paths: `%` in a file name is written `%25`): its size and
    partition values."""
    partitions = table.metadata().partition_columns
    actions = pa.table(table.get_add_actions(flatten=True))
    return {unquote(row["path"]): TableFile(row["size_bytes"], {c: row[f"partition.{c}"] for c in partitions})
            for row in actions.select(["path", "size_bytes"] + [f"partition.{c}" for c in partitions]).to_pylist()}


def written_with_prefix(path: str, prefix: str) -> bool:
    """Did a TableWriter with this `prefix` write the file at `path` (its name says so)?"""
    return path.rsplit("/", 1)[-1].startswith(f"part-{prefix}-")


def files_named(lake: str, name: str, prefix: str) -> list[str]:
    """The table's files a TableWriter with this `prefix` wrote (paths relative to the table)."""
    table = open_table(lake, name)
    return sorted(p for p in table_files(table) if written_with_prefix(p, prefix)) if table else []


def has_files(lake: str, name: str, paths: list[str]) -> bool:
    """Does the table's snapshot hold every one of these files?"""
    if not paths:
        return True
    table = open_table(lake, name)
    return table is not None and set(paths) <= set(table_files(table))


def removals(table: DeltaTable, paths: list[str], data_change: bool = True) -> list[RemoveAction]:
    """Remove actions for these files of the table; KeyError names one the snapshot does not hold."""
    if not paths:
        return []
    files = table_files(table)
    now = int(time.time() * 1000)
    return [RemoveAction(path, data_change, now, files[path][0], files[path][1]) for path in paths]


CREATE_RACE_WAIT_S = 10.0


def add_missing_columns(table: DeltaTable, schema: pa.Schema) -> None:
    """A table made before columns were added to its schema (ackscope upgraded under an existing
    lake) gains them, nullable: its older rows read them as null. Another writer may add them at
    the same time: its commit wins, and the columns are there."""
    have = {field.name for field in table.schema().fields}
    missing = [field for field in schema if field.name not in have]
    if not missing:
        return
    try:
        table.alter.add_columns([Field.from_arrow(field) for field in missing])
    except Exception:
        table.update_incremental()
        if any(field.name not in {f.name for f in table.schema().fields} for field in missing):
            raise


def open_or_create(path: str, schema: pa.Schema, partition_by: list[str] = PARTITION_BY) -> DeltaTable:
    """The table, created if there is none. Several writers (agents on one lake, Spark jobs) may
    create it at once: Delta's log lets exactly one version 0 land, and the others, failing, open
    that one; the loser may look before the winner's log entry is visible, so it looks again for a while."""
    deadline = time.monotonic() + CREATE_RACE_WAIT_S
    while True:
        table = open_table(os.path.dirname(path), os.path.basename(path))
        if table is not None:
            return table
        try:
            return DeltaTable.create(path, schema, mode="ignore", partition_by=partition_by)
        except Exception:  # another writer created it first: use theirs, once it can be read
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def by_day(table: pa.Table) -> list[tuple[str | None, pa.Table]]:
    """`table`'s rows by their `date`: the days that occur, with their rows. A table within one day
    (nearly every batch) is that day's as it is; one sorted by day (FilesWriter sorts its files so)
    is cut into slices, which copy nothing; any other is filtered, a copy of every column per day."""
    days = pc.unique(table["date"]).to_pylist()
    if len(days) == 1:
        return [(days[0], table)]
    column = table["date"]
    runs = pc.run_end_encode(column.combine_chunks() if column.num_chunks != 1 else column.chunk(0))
    if len(runs.values) == len(days):
        ends = runs.run_ends.to_pylist()
        return [(day, table.slice(start, end - start))
                for day, start, end in zip(runs.values.to_pylist(), [0, *ends], ends)]
    return [(day, table.filter(pc.is_null(column) if day is None else pc.equal(column, day))) for day in days]


def by_flags(table: pa.Table, columns: tuple[str, ...]) -> list[tuple[pa.Table, dict[str, bool | None]]]:
    """`table`'s rows by their values of the boolean `columns`: each combination that occurs, as
    its rows and the values (column -> false, true or None)."""
    parts = [(table, {})]
    for column in columns:
        parts = [(piece, {**values, column: value}) for part, values in parts
                 for piece, value in _by_value(part, column)]
    return parts


def _by_value(table: pa.Table, column: str) -> list[tuple[pa.Table, bool | None]]:
    """`table`'s rows by their value of the boolean `column` (false, true, null): the values that
    occur, with their rows."""
    flags = table[column]
    trues = pc.sum(flags).as_py() or 0
    parts = []
    for value, n in ((False, table.num_rows - trues - flags.null_count), (True, trues), (None, flags.null_count)):
        if n:
            # Nearly always one value in the whole table: then it is written as it is.
            part = table if n == table.num_rows else table.filter(
                pc.is_null(flags) if value is None else pc.equal(flags, value))
            parts.append((part, value))
    return parts


def _conformed(rows: pa.Table | pa.RecordBatch, schema: pa.Schema, partition_values: dict) -> pa.Table:
    """A data file's rows in `schema`, the partition columns from their values (the log's, not in
    the file). A column the file lacks (written before the table had it) reads as nulls, as in Spark."""
    n = rows.num_rows
    return pa.Table.from_arrays([pa.repeat(pa.scalar(partition_values[f.name], f.type), n) if f.name in partition_values
                                 else rows.column(f.name).cast(f.type) if f.name in rows.schema.names
                                 else pa.nulls(n, f.type) for f in schema], schema=schema)


def _file_stats(rows: int, values: dict[str, bool | None]) -> dict:
    """Delta statistics of a file of `rows` rows all with these values of the columns split by."""
    stats: dict = {"numRecords": rows}
    known = {column: value for column, value in values.items() if value is not None}
    if known:
        stats.update(minValues=known, maxValues=known)
    if values:
        stats["nullCount"] = {column: rows if value is None else 0 for column, value in values.items()}
    return stats
