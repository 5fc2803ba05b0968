"""Delta tables in and out of Spark, with the Delta Lake JARs (native) or without them (bridge).

The bridge gives the same tables as delta-spark: delta-rs resolves the snapshot and commits,
Spark only reads and writes Parquet. A read hands Spark exactly the snapshot's files, and the
partition values Spark sees are checked against the log's (Delta keeps them in the log, not in the
files). A write commits every file Spark wrote in one Delta commit, carrying the app-transaction id
delta-spark's `txnAppId` would, so whichever path wrote a table, the other path, `deltalake` and
`analyzer.lake.read_table` read it, and a retried write is a no-op.
"""

import json
import os
import re
import shutil
import uuid
import time
from dataclasses import dataclass
from datetime import date, datetime, timezone
from functools import reduce
from math import prod
from urllib.parse import unquote, urlparse

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import CommitProperties, DeltaTable, Transaction
from deltalake.exceptions import CommitFailedError, TableNotFoundError
from deltalake.transaction import AddAction, RemoveAction
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from analyzer.lake import committed, open_table
from analyzer.schema import PARTITION_BY

from . import session
from .timeline.plans import IN_LIST_CONNECTIONS, lookup
from .types import spark_schema

# Where Spark writes before the commit; a leading underscore hides it from Delta and Spark readers.
STAGING_DIR = "_ackscope_staging"
# analyzer.lake.TableWriter commits app ids at version 1 too: an app id has landed or it has not.
TRANSACTION_VERSION = 1
# How Spark (like Hive) names the directory of a null partition value.
NULL_PARTITION = "__HIVE_DEFAULT_PARTITION__"
SAVE_MODES = ("append", "overwrite")
# Reader features that leave a Parquet file meaning what it says. Anything else (deletion vectors
# hiding rows, column mapping renaming columns, ...) needs delta-spark to read correctly.
BRIDGE_READER_FEATURES = {"timestampNtz", "v2Checkpoint", "vacuumProtocolCheck"}
_ESCAPE = re.compile(r"%([0-9A-Fa-f]{2})")


def read_delta(spark: SparkSession, lake: str, name: str, schema: pa.Schema | None = None, mode: str = "auto",
               since: date | str | None = None, until: date | str | None = None,
               version: int | None = None) -> DataFrame:
    """The table's current snapshot (or the one at `version`), in `schema` (by default the table's own).

    `since` and `until` are UTC days, both inclusive, and select `date` partitions; a datetime
    selects the day it falls on. A missing table reads as an empty DataFrame of `schema`.
    `mode` is the Delta path: auto, native or bridge (see `session.delta_mode`)."""
    table = open_table(lake, name)
    if table is not None and version is not None:
        table.load_as_version(version)
    if schema is None:
        if table is None:
            raise FileNotFoundError(f"no Delta table {name!r} in {lake}, and no schema to make an empty one")
        schema = pa.schema(table.schema().to_arrow())
    struct = spark_schema(schema)
    days = (_utc_day(since), _utc_day(until))
    route = session.delta_mode(spark, mode)
    if table is None:
        return spark.createDataFrame([], struct)
    if days != (None, None) and "date" not in table.metadata().partition_columns:
        raise ValueError(f"table {name!r} is not partitioned by date: since/until cannot select its days")
    location = os.path.join(lake, name)
    if route == "native":
        reader = spark.read.format("delta")
        if version is not None:
            reader = reader.option("versionAsOf", version)
        data = _in_days(reader.load(os.path.abspath(location)), *days)
    else:
        data = _read_bridge(spark, table, location, struct, *days)
    return _schema_contract(data, struct)


def write_delta(df: DataFrame, lake: str, name: str, schema: pa.Schema, app_id: str | None = None,
                mode: str = "append", partition_by: list[str] = PARTITION_BY, delta_mode: str = "auto") -> int:
    """Append `df` to the table, or replace its contents (`mode="overwrite"`), in one commit.

    With an `app_id` that the table has already committed, nothing is written: retried jobs stay
    idempotent. Returns a table version that includes the write (a concurrent writer may have
    committed after it)."""
    if mode not in SAVE_MODES:
        raise ValueError(f"mode must be one of {', '.join(SAVE_MODES)}, not {mode!r}")
    route = session.delta_mode(df.sparkSession, delta_mode)
    if app_id is not None and committed(lake, name, app_id):
        return open_table(lake, name).version()
    data = _schema_contract(df, spark_schema(schema))
    location = os.path.join(lake, name)
    if route == "native":
        _write_native(data, location, app_id, mode, partition_by)
    else:
        _write_bridge(data, location, schema, app_id, mode, partition_by)
    return open_table(lake, name).version()


@dataclass(frozen=True)
class FileChanges:
    """What happened to a table's data between two versions, as absolute file paths."""
    added: tuple[str, ...]      # files of new rows, still in the table
    removed: tuple[str, ...]    # files whose rows were deleted or changed, or new rows' files rewritten since


def changes_between(lake: str, name: str, old_version: int, new_version: int) -> FileChanges:
    """The files of rows added after `old_version` (up to `new_version`), and the files whose rows
    changed or whose new rows cannot be read alone any more.

    Read from the commits in between: a compaction (delta-rs `optimize`, as the agent runs it)
    rewrites files without changing their rows (`dataChange: false`), so it neither adds new rows
    nor loses any, unless it swallowed a file of rows added since `old_version`: those rows now sit
    in a file with older ones. Where a commit is no longer in the log (cleaned up), the two
    snapshots are compared instead, and every rewritten file counts as removed."""
    location = os.path.abspath(os.path.join(lake, name))
    commits = _commits(location, old_version + 1, new_version)
    if commits is None:
        snapshots = [set(_snapshot_files(DeltaTable(location, version=v), location)) for v in (old_version, new_version)]
        old, new = snapshots
        return FileChanges(added=tuple(sorted(new - old)), removed=tuple(sorted(old - new)))
    added: set[str] = set()
    removed: set[str] = set()
    for actions in commits:
        for action in actions:
            if "add" in action and action["add"].get("dataChange", True):
                added.add(_log_path(location, action["add"]["path"]))
            elif "remove" in action:
                path = _log_path(location, action["remove"]["path"])
                if path in added or action["remove"].get("dataChange", True):
                    removed.add(path)
    return FileChanges(added=tuple(sorted(added - removed)), removed=tuple(sorted(removed)))


def _commits(location: str, first: int, last: int) -> list[list[dict]] | None:
    """The actions of each commit from `first` to `last`, or None if one is gone from the log."""
    commits = []
    for version in range(first, last + 1):
        path = os.path.join(location, "_delta_log", f"{version:020d}.json")
        try:
            with open(path, encoding="utf-8") as commit:
                commits.append([json.loads(line) for line in commit if line.strip()])
        except FileNotFoundError:
            return None
    return commits


def _log_path(root: str, path: str) -> str:
    # Paths in the log are URIs relative to the table: `%` in a file name is written `%25`.
    return os.path.normpath(os.path.join(root, unquote(path)))


def read_files(spark: SparkSession, lake: str, name: str, files: tuple[str, ...], columns: list[str]) -> DataFrame:
    """Data columns (no partition columns) of exactly these Parquet files of a table."""
    table_schema = pa.schema(DeltaTable(os.path.join(lake, name)).schema().to_arrow())
    struct = spark_schema(pa.schema([table_schema.field(c) for c in columns]))
    if not files:
        return spark.createDataFrame([], struct)
    return spark.read.schema(struct).parquet(*files)


@dataclass(frozen=True)
class Match:
    """Rows equal to one of `keys` on the columns `on`; with `at_least` (column, key column), only
    those whose column is at least that key row's key column."""
    keys: DataFrame
    on: tuple[str, ...]
    at_least: tuple[str, str] | None = None
    rows: int | None = None             # at most how many key rows, if known (else they are counted)


@dataclass(frozen=True)
class Listed:
    """Rows whose every column named holds one of its listed values: a literal IN filter, so no
    join and no broadcast job (plans.IN_LIST_CONNECTIONS)."""
    values: dict[str, tuple]


def connections_match(spark: SparkSession, keys: list[str], **also: tuple) -> Match | Listed:
    """The rows of these connections (and, per column of `also`, one of its values)."""
    if len(keys) <= IN_LIST_CONNECTIONS:
        return Listed({"connection_id": tuple(keys), **also})
    ids = spark.createDataFrame([(k,) for k in keys], "connection_id string")
    for column, values in also.items():
        ids = ids.crossJoin(spark.createDataFrame([(v,) for v in values], [column]))
    return Match(ids, ("connection_id", *also), rows=len(keys) * prod(len(v) for v in also.values()))


def replace_rows(df: DataFrame, lake: str, name: str, schema: pa.Schema, key: str, keys: list[str],
                 partition_by: list[str] = PARTITION_BY, delta_mode: str = "auto") -> int | None:
    """Replace every row whose `key` is one of `keys` with the rows of `df`, in one commit (see
    replace_matching). `df` must hold only rows of `keys`. Returns the new table version, or None
    when there was nothing to do."""
    route = session.delta_mode(df.sparkSession, delta_mode)
    if open_table(lake, name) is not None and not keys:
        return None
    if route == "native" and open_table(lake, name) is not None:
        listed = ", ".join("'" + k.replace("'", "''") + "'" for k in keys)
        (_schema_contract(df, spark_schema(schema)).write.format("delta").mode("overwrite")
         .option("replaceWhere", f"`{key}` IN ({listed})").partitionBy(*partition_by).save(os.path.abspath(os.path.join(lake, name))))
        return open_table(lake, name).version()
    wanted = df.sparkSession.createDataFrame([(k,) for k in keys], T.StructType([T.StructField(key, T.StringType())]))
    return replace_matching(df, lake, name, schema, [Match(wanted, (key,))], partition_by, route)


def replace_matching(df: DataFrame, lake: str, name: str, schema: pa.Schema, matches: list[Match | Listed],
                     partition_by: list[str] = PARTITION_BY, delta_mode: str = "auto") -> int | None:
    """Delete the rows any of `matches` names and append the rows of `df`, in one commit.

    Copy-on-write, as Delta's MERGE does it: only the files holding such rows are rewritten
    (their other rows copied), the rest of the table is untouched. Done the bridge's way (Spark
    writes Parquet, delta-rs commits) on both paths: delta-spark reads the result like any commit.
    Returns the new table version, or None when there was nothing to do."""
    route = session.delta_mode(df.sparkSession, delta_mode)
    data = _schema_contract(df, spark_schema(schema))
    location = os.path.join(lake, name)
    table = open_table(lake, name)
    if table is None:
        return write_delta(df, lake, name, schema, mode="append", partition_by=partition_by, delta_mode=route)
    spark = df.sparkSession
    struct = spark_schema(schema)
    root = os.path.abspath(location)
    logged = _snapshot_files(table, root)
    touched, kept = [], spark.createDataFrame([], struct)
    if logged and matches:
        current = _read_bridge(spark, table, location, struct, None, None).withColumn("_file", F.col("_metadata.file_path"))
        marked = _marked(current, matches)
        # Spark names files by URI; the Delta log by path relative to the table.
        touched = sorted(r["_file"] for r in marked.where(F.col("_doomed")).select("_file").distinct().collect())
        kept = (marked.where((F.col("_file").isin(*touched) if touched else F.lit(False)) & ~F.col("_doomed"))
                .select(*struct.names))
    staging = os.path.join(location, STAGING_DIR, uuid.uuid4().hex)
    _schema_contract(kept, struct).unionByName(data) \
        .write.partitionBy(*partition_by).option("compression", "zstd").parquet(staging)
    try:
        adds = [_move_into_table(staging, relative, location, partition_by) for relative in _written_files(staging)]
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    if not adds and not touched:
        return None
    now = int(time.time() * 1000)
    removes = [RemoveAction(os.path.relpath(path, root), True, now, os.path.getsize(path), logged[path])
               for path in map(_local_path, touched)]
    # A concurrent writer removing one of these files makes this commit fail rather than lose its rows.
    table.create_write_transaction([*removes, *adds], mode="append", schema=schema, partition_by=partition_by)
    return open_table(lake, name).version()


def _marked(current: DataFrame, matches: list[Match | Listed]) -> DataFrame:
    """`current` with `_doomed`: does any match name the row. Key sets are small next to the table
    (broadcast where they are: plans.lookup) and made distinct, so a left join never repeats a row."""
    doomed = F.lit(False)
    for i, match in enumerate(matches):
        if isinstance(match, Listed):
            doomed = doomed | reduce(Column.__and__, [F.col(c).isin(list(v)) for c, v in match.values.items()])
            continue
        hit, since = f"_hit_{i}", f"_from_{i}"
        keys = (match.keys.groupBy(*match.on).agg(F.min(match.at_least[1]).alias(since)) if match.at_least
                else match.keys.select(*match.on).distinct()).withColumn(hit, F.lit(True))
        current = current.join(lookup(keys, match.rows), on=list(match.on), how="left")
        reached = F.col(hit).isNotNull()
        if match.at_least:
            reached = reached & (F.col(match.at_least[0]) >= F.col(since))
        doomed = doomed | F.coalesce(reached, F.lit(False))
    return current.withColumn("_doomed", doomed)


def _local_path(file_uri: str) -> str:
    """A path as Spark's `_metadata.file_path` gives it (a URI) back to the file system's."""
    return os.path.normpath(unquote(urlparse(file_uri).path))


def _schema_contract(df: DataFrame, struct: T.StructType) -> DataFrame:
    """Exactly the schema's columns, in its order and types."""
    types = {field.name: field.dataType for field in df.schema}
    missing = [field.name for field in struct if field.name not in types]
    if missing:
        raise ValueError(f"the DataFrame lacks the table's columns {missing}")
    # A cast is several JVM round trips per column: only where the type differs.
    return df.select(*[field.name if types[field.name] == field.dataType
                       else F.col(field.name).cast(field.dataType).alias(field.name) for field in struct])


def _in_days(df: DataFrame, since: str | None, until: str | None) -> DataFrame:
    if since is not None:
        df = df.where(F.col("date") >= F.lit(since))
    if until is not None:
        df = df.where(F.col("date") <= F.lit(until))
    return df


def _utc_day(value: date | str | None) -> str | None:
    """'YYYY-MM-DD', the form of the `date` partition values."""
    if value is None:
        return None
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise ValueError(f"{value} has no time zone: partitions are UTC days, so say which instant you mean")
        return value.astimezone(timezone.utc).date().isoformat()
    if isinstance(value, date):
        return value.isoformat()
    return date.fromisoformat(value).isoformat()


# --- bridge: read ---------------------------------------------------------------------------------

def _read_bridge(spark: SparkSession, table: DeltaTable, location: str, struct: T.StructType,
                 since: str | None, until: str | None) -> DataFrame:
    """Spark reads exactly the snapshot's files; their partition values are checked against the log first.

    Spark takes partition values from `column=value/` folders under `basePath`, as a constant per
    file at no cost per row. Both delta-rs and delta-spark lay files out that way, but the log is
    the truth: a file whose folders would give Spark anything else stops the read."""
    _check_bridge_can_read(table, location)
    root = os.path.abspath(location)
    files = {file: values for file, values in _snapshot_files(table, root).items()
             if _day_selected(values.get("date"), since, until)}
    if not files:
        return spark.createDataFrame([], struct)
    for file, values in files.items():
        _check_partition_folders(os.path.relpath(file, root), values)
    return spark.read.schema(struct).option("basePath", root).parquet(*files)


def _check_bridge_can_read(table: DeltaTable, location: str) -> None:
    protocol = table.protocol()
    if protocol.min_reader_version == 1:
        return
    # Reader version 2 is column mapping; 3 lists its features.
    features = set(protocol.reader_features or []) if protocol.min_reader_version >= 3 else {"columnMapping"}
    if not features <= BRIDGE_READER_FEATURES:
        raise RuntimeError(f"{location}: the table uses {sorted(features - BRIDGE_READER_FEATURES)}, which the "
                           f"bridge cannot apply to its Parquet files; read it with --delta-mode native")


def _snapshot_files(table: DeltaTable, root: str) -> dict[str, dict]:
    """Absolute path of each file in the current snapshot -> its partition values, from the Delta log."""
    partition_columns = table.metadata().partition_columns
    actions = pa.table(table.get_add_actions(flatten=True))
    files = {}
    for action in actions.select(["path"] + [f"partition.{c}" for c in partition_columns]).to_pylist():
        files[_log_path(root, action["path"])] = {
            column: action[f"partition.{column}"] for column in partition_columns}
    return files


def _day_selected(day: str | None, since: str | None, until: str | None) -> bool:
    if since is None and until is None:
        return True
    return day is not None and (since is None or day >= since) and (until is None or day <= until)


# --- bridge: write --------------------------------------------------------------------------------

def _write_bridge(data: DataFrame, path: str, schema: pa.Schema, app_id: str | None, mode: str,
                  partition_by: list[str]) -> None:
    """Spark writes Parquet to a private staging folder; its files move into the table and are committed together.

    Until the commit, nothing in the log names them, so no reader sees a partial write; after a
    crash they are unreferenced files that `VACUUM` removes."""
    staging = os.path.join(path, STAGING_DIR, uuid.uuid4().hex)
    data.write.partitionBy(*partition_by).option("compression", "zstd").parquet(staging)
    try:
        actions = [_move_into_table(staging, relative, path, partition_by) for relative in _written_files(staging)]
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    table = _open_or_create(path, schema, partition_by)
    transactions = [Transaction(app_id, TRANSACTION_VERSION)] if app_id is not None else None
    # "overwrite" removes every file of the snapshot in this same commit.
    table.create_write_transaction(actions, mode=mode, schema=schema, partition_by=partition_by,
                                   commit_properties=CommitProperties(app_transactions=transactions))


def _written_files(staging: str) -> list[str]:
    """Data files under the staging folder, relative to it; Spark's `_SUCCESS` and `.crc` files are not data."""
    found = []
    for folder, _, names in os.walk(staging):
        found += [os.path.relpath(os.path.join(folder, n), staging) for n in names if not n.startswith(("_", "."))]
    return sorted(found)


def _move_into_table(staging: str, relative: str, path: str, partition_by: list[str]) -> AddAction:
    """Move one file Spark wrote to the same place in the table; its add action comes from what is on disk."""
    values = _folder_partition_values(relative)
    if list(values) != list(partition_by):
        raise RuntimeError(f"Spark wrote {relative}, not under folders for partitions {partition_by}")
    target = os.path.join(path, relative)
    os.makedirs(os.path.dirname(target), exist_ok=True)
    os.rename(os.path.join(staging, relative), target)
    stats = {"numRecords": pq.read_metadata(target).num_rows}
    # delta-rs URI-encodes the path as it writes the log: give it the plain one.
    return AddAction(relative, os.path.getsize(target), values,
                     int(os.path.getmtime(target) * 1000), True, json.dumps(stats))


def _folder_partition_values(relative: str) -> dict[str, str | None]:
    """Partition values as Spark reads them from the `column=value/` folders of a file's path.

    Spark escapes a few ASCII characters in folder names (`:` as `%3A`) and unescapes every `%XX`
    as one character; it never decodes UTF-8 sequences, so neither does this."""
    values = {}
    for folder in relative.split(os.sep)[:-1]:
        column, _, value = folder.partition("=")
        values[column] = None if value == NULL_PARTITION else _ESCAPE.sub(lambda m: chr(int(m[1], 16)), value)
    return values


def _check_partition_folders(relative: str, logged: dict) -> None:
    logged_as_text = {column: None if value is None else str(value) for column, value in logged.items()}
    from_folders = _folder_partition_values(relative)
    if from_folders != logged_as_text:
        raise RuntimeError(f"{relative}: the Delta log gives partition values {logged_as_text}, its folders "
                           f"{from_folders}; the bridge cannot read this table, --delta-mode native can")


def _open_or_create(path: str, schema: pa.Schema, partition_by: list[str]) -> DeltaTable:
    try:
        return DeltaTable(path)
    except TableNotFoundError:
        pass
    try:
        DeltaTable.create(path, schema, mode="ignore", partition_by=partition_by)
    except CommitFailedError:  # another writer created it first: use theirs
        pass
    return DeltaTable(path)


# --- native ---------------------------------------------------------------------------------------

def _write_native(data: DataFrame, path: str, app_id: str | None, mode: str, partition_by: list[str]) -> None:
    writer = data.write.format("delta").mode(mode).partitionBy(*partition_by)
    if app_id is not None:
        # delta-spark skips a write whose app id the table already has at this version.
        writer = writer.option("txnAppId", app_id).option("txnVersion", TRANSACTION_VERSION)
    writer.save(os.path.abspath(path))
