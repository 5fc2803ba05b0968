"""The driver's side of the delta-rs bridge, without Spark: which files a table's snapshot holds
(named as Spark reads them), what changed between two versions, and the commits of files written.
Every look at the store goes through delta-rs or analyzer.lake's file system, never `os` on a lake
path, so the local tests run the code an S3 lake runs.
"""

from __future__ import annotations

import json
import os
import posixpath
import re
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import unquote, urlparse

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import CommitProperties, DeltaTable
from deltalake.transaction import AddAction

from analyzer.lake import (NULL_PARTITION, READ_CHECKSUMS, check_files_readable, filesystem, is_local, is_s3,
                           open_or_create, reading, removals, table_files)

# Spark's own estimate of what opening a file costs, in bytes it could have read meanwhile
# (spark.sql.files.openCostInBytes): below it a file costs a reader more to open than to read.
OPEN_COST_BYTES = 4 * 1024 * 1024
_ESCAPE = re.compile(r"%([0-9A-Fa-f]{2})")


def spark_location(path: str) -> str:
    """A lake path as Spark's Hadoop file systems take it: a local folder made absolute; S3 as
    `s3a://` (Hadoop's `s3://` is not the s3a connector); any other URI as it is."""
    if is_local(path):
        return os.path.abspath(path)
    if is_s3(path):
        return "s3a://" + path.split("://", 1)[1]
    return path


def files_that_may_hold(table: DeltaTable, column: str) -> set[str]:
    """The snapshot's files (paths relative to the table) that may hold a row whose boolean `column`
    is true, by their statistics."""
    actions = pa.table(table.get_add_actions(flatten=True))
    paths = [unquote(path) for path in actions.column("path").to_pylist()]
    most = f"max.{column}"
    if most not in actions.column_names:
        return set(paths)
    return {path for path, largest in zip(paths, actions.column(most).to_pylist()) if _may_be_true(largest)}


def adds_that_may_hold(adds: list[AddAction], column: str) -> list[AddAction]:
    """files_that_may_hold of files written and not committed yet (their add actions)."""
    return [add for add in adds if _may_be_true(json.loads(add.stats or "{}").get("maxValues", {}).get(column))]


def rows_in(adds: list[AddAction]) -> int:
    """How many rows the files hold, from their statistics (the writers always keep numRecords)."""
    return sum(json.loads(add.stats)["numRecords"] for add in adds)


def _may_be_true(largest: bool | None) -> bool:
    """Only a false largest value says no row of the file is true (None: no statistics kept)."""
    return largest is not False


def relative_in_table(file_uri: str, base: str) -> str:
    """A file as Spark names it (a URI) back to its path relative to the table at `base` (a `spark_location`)."""
    return posixpath.relpath(unquote(urlparse(file_uri).path), urlparse(base).path)


@dataclass(frozen=True)
class SparkRead:
    """What the bridge hands Spark for a snapshot: the table's location (`basePath`: Spark takes
    partition values from the `column=value/` folders below it) and exactly the files to read."""
    base: str
    files: tuple[str, ...]


def files_to_read(table: DeltaTable, location: str, since: str | None, until: str | None) -> SparkRead:
    """The snapshot's files on the `date` partitions from `since` to `until` (inclusive, None: open).
    Spark takes partition values from folder names (a constant per file, at no cost per row), as both
    delta-rs and delta-spark lay files out; but the log is the truth: a file whose folders would
    give Spark anything else stops the read."""
    check_files_readable(table, location)
    base = spark_location(location)
    files = []
    for relative, file in table_files(table).items():
        if _day_selected(file.partition_values.get("date"), since, until):
            _check_partition_folders(relative, file.partition_values)
            files.append(f"{base}/{relative}")
    return SparkRead(base, tuple(files))


def _day_selected(day: str | None, since: str | None, until: str | None) -> bool:
    if since is None and until is None:
        return True
    return day is not None and (since is None or day >= since) and (until is None or day <= until)


def _check_partition_folders(relative: str, logged: dict) -> None:
    """The partition values Spark reads from the `column=value/` folders of a file's path are the
    log's: Spark unescapes every `%XX` as one character, never decoding UTF-8 sequences; so does this."""
    from_folders = {}
    for folder in relative.split("/")[:-1]:
        column, _, value = folder.partition("=")
        from_folders[column] = None if value == NULL_PARTITION else _ESCAPE.sub(lambda m: chr(int(m[1], 16)), value)
    logged_as_text = {column: None if value is None else str(value) for column, value in logged.items()}
    if from_folders != logged_as_text:
        raise RuntimeError(f"{relative}: the Delta log gives partition values {logged_as_text}, its folders "
                           f"{from_folders}; the bridge cannot read this table, --delta-mode native can")


def distinct_strings(files: tuple[str, ...], column: str) -> list[str]:
    """The distinct non-null values of a string column in these files (`spark_location`s), sorted:
    read by the driver a row group at a time, as a dictionary, so a column of few values (a frame's
    connection_id) costs an index a row, not a string, and no Spark job (which would cost more)."""
    values: set[str] = set()
    for location in files:
        fs, path = filesystem(location)
        with reading(location), fs.open_input_file(path) as source:
            parquet = pq.ParquetFile(source, read_dictionary=[column], **READ_CHECKSUMS)
            for group in range(parquet.metadata.num_row_groups):
                for chunk in parquet.read_row_group(group, columns=[column]).column(0).chunks:
                    chunk = chunk.unique()
                    if pa.types.is_dictionary(chunk.type):
                        chunk = chunk.dictionary_decode()
                    values.update(chunk.drop_null().to_pylist())
    return sorted(values)


@dataclass(frozen=True)
class FileChanges:
    """What happened to a table's data between two versions, as files Spark can read (`spark_location`)."""
    added: tuple[str, ...]      # files of new rows, still in the table
    removed: tuple[str, ...]    # files whose rows were deleted or changed, or new rows' files rewritten since


def changes_between(lake: str, name: str, old_version: int, new_version: int) -> FileChanges:
    """Read from the commits after `old_version` up to `new_version`: a compaction's rewrite
    (`dataChange: false`) neither adds rows nor loses any, unless it swallowed a file of rows added
    since `old_version` (they now sit with older ones). Where a commit is gone from the log, the
    two snapshots are compared instead, and every rewritten file counts as removed."""
    location = os.path.join(lake, name)
    base = spark_location(location)
    commits = _commits(location, old_version + 1, new_version)
    if commits is None:
        old, new = (set(table_files(DeltaTable(location, version=v))) for v in (old_version, new_version))
        added, removed = new - old, old - new
    else:
        added, removed = set(), set()
        for actions in commits:
            for action in actions:
                if "add" in action and action["add"].get("dataChange", True):
                    added.add(unquote(action["add"]["path"]))
                elif "remove" in action:
                    path = unquote(action["remove"]["path"])
                    if path in added or action["remove"].get("dataChange", True):
                        removed.add(path)
        added -= removed
    return FileChanges(added=tuple(sorted(f"{base}/{p}" for p in added)),
                       removed=tuple(sorted(f"{base}/{p}" for p in removed)))


def _commits(location: str, first: int, last: int) -> list[list[dict]] | None:
    """The actions of each commit from `first` to `last`, or None if one is gone from the log."""
    fs, root = filesystem(location)
    commits = []
    for version in range(first, last + 1):
        try:
            with fs.open_input_stream(f"{root}/_delta_log/{version:020d}.json") as commit:
                text = commit.read().decode("utf-8")
        except FileNotFoundError:
            return None
        commits.append([json.loads(line) for line in text.splitlines() if line.strip()])
    return commits


def commit(location: str, schema: pa.Schema, actions: list, partition_by: list[str], mode: str = "append",
           tag: str | None = None, table: DeltaTable | None = None, removed: Iterable[str] = ()) -> None:
    """Add (`mode="overwrite"`: replace the snapshot with) these files in one commit tagged `tag`,
    creating the table if there is none. `removed`: files of `table` (the snapshot they were found
    in) removed in the same commit: a concurrent writer removing one makes the commit fail rather
    than lose its rows."""
    table = open_or_create(location, schema, partition_by) if table is None else table
    # `userMetadata`: where delta-spark keeps its session's spark.databricks.delta.commitInfo.userMetadata.
    properties = CommitProperties(custom_metadata={"userMetadata": tag} if tag is not None else None)
    table.create_write_transaction([*removals(table, list(removed)), *actions], mode=mode, schema=schema,
                                   partition_by=partition_by, commit_properties=properties)
