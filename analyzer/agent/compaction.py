"""The agent's small files merged in bounded groups, one Delta commit per group.

A flush is a small file per table (12 a minute under churn). delta-rs's `optimize.compact` rewrote
every file of a day under its target size at each compaction, the file the last one merged
included, and held what it rewrote: the agent's RSS reached 362, 429 then 480 MB at compactions
10 minutes apart (bench/README.md, soak.py). Here, as Delta's OPTIMIZE bins files but streamed:

- only files under TARGET_FILE_BYTES are merged; a file at or above it is never rewritten;
- a day's small files (in the log's order) are cut into groups of at most GROUP_BYTES of Parquet,
  and a group of one file is left as it is;
- a group is streamed into one new file (analyzer.lake.TableWriter.write_merged: a batch of a
  file at a time, at most lake.MERGE_ROW_GROUP_BYTES of rows held), so the memory is bounded by
  that, not by the group nor the day;
- each group is one commit, removing the group's files and adding the merged one, both with
  `dataChange` false (no row changed: a reader of changes skips it), tagged with the app
  transaction COMPACTION_APP_ID, never an agent's (the agents' flush sequences are theirs alone).

Who merges what. The scheduled analysis merges, after each complete run, the small files of
`frames` it has analysed and those of `connections` (spark_jobs/compaction.merge_analysed_input,
with `compact_table` here: one implementation; its own tables' small files too, grouped by
`small_file_groups` and merged by `write_merged`, in one commit tagged with the run:
spark_jobs/compaction.py); the agent merges only small files written longer
ago than `--compact-min-age`, which a working analysis job never leaves. So beside a running
analysis the sidecar's compaction merges nothing (a merge's ~35-40 MB of Parquet buffers and log
state stay out of the sidecar's peak: bench/README.md, soak.py and compaction_knobs.py), and
without one it still keeps its tables' files few.

Another writer may commit while a group is merged. An append (an agent's flush, an ingest) lands
beside it: Delta rebases the compaction over it. A commit that removed one of the group's files (an
ingest replacing its provisional files) makes the compaction's commit fail, as the file is gone from
the table or as Delta finds the conflict. Another compaction, of any agent: delta-rs does not count
a file removed with `dataChange` false as a conflict, so two merges of one file would both land and
its rows be there twice; the shared app transaction makes every compaction commit conflict with any
other that landed since its table was read, and the later one fails. A group that fails is tried
again at the next compaction from the files then in the table: no row is lost or added twice. Its
merged file is referenced by nothing, and the vacuum removes it after the retention (deleting it at
once would be wrong if the commit had in fact landed).
"""

from __future__ import annotations

import logging
from collections.abc import Hashable
from urllib.parse import unquote

import pyarrow as pa

from .. import lake

# A file this big is done: never merged again (that is what made each delta-rs compaction heavier
# than the last). Ten minutes of the churn soak's frames (~1,230 a second) merge into ~8 MB.
TARGET_FILE_BYTES = 8 * 1024 * 1024
# At most so many bytes of small files go into one merged file (and one commit): a group is full
# before it reaches the target, so merged files reach the target and leave the small ones.
GROUP_BYTES = 16 * 1024 * 1024
COMPACTED_PREFIX = "compacted"
COMPACTION_APP_ID = "ackscope-compaction"
log = logging.getLogger("ackscope.agent")


def small_file_groups(files: dict[str, tuple[int, Hashable]], small_bytes: int, group_bytes: int,
                      at_least: int = 2) -> list[tuple[Hashable, list[str]]]:
    """The groups to merge among a table's files (path -> size, the key of the files it may merge
    with: its day; the analysis' files, their day and flags' values): per key, the files under
    `small_bytes` in their order, if there are at least `at_least`, cut before a file that would
    take the group past `group_bytes`; groups of one file are left out."""
    small: dict[Hashable, list[tuple[str, int]]] = {}
    for path, (size, key) in files.items():
        if size < small_bytes:
            small.setdefault(key, []).append((path, size))
    groups = []
    for key, listed in small.items():
        if len(listed) < at_least:
            continue
        runs, total = [[]], 0
        for path, size in listed:
            if runs[-1] and total + size > group_bytes:
                runs.append([])
                total = 0
            runs[-1].append(path)
            total += size
        groups += [(key, run) for run in runs if len(run) > 1]
    return groups


def compact_table(lake_dir: str, name: str, metadata: dict, *, written_before_ms: int | None = None,
                  among: set[str] | None = None) -> tuple[int, int]:
    """Merge the table's small files, a group and a commit at a time: (files merged away, groups
    whose commit failed, left for the next compaction). `written_before_ms`: only files whose add
    action says they were written before this time (ms since the epoch: the agent's files older
    than its --compact-min-age); `among`: only these files (paths relative to the table, unquoted:
    the files of the snapshot an analysis run analysed). A file an ingest left provisional (it ends
    a capture's open flows, and the ingest of the next piece takes it out: analyzer/ingest.py) is
    left alone."""
    table = lake.open_table(lake_dir, name)
    if table is None:
        return 0, 0
    stored = pa.schema(table.schema().to_arrow())
    files = {path: (size, partition.get("date")) for path, (size, partition) in lake.table_files(table).items()
             if not lake.written_with_prefix(path, lake.PROVISIONAL_PREFIX)}
    if among is not None:
        files = {path: file for path, file in files.items() if path in among}
    if written_before_ms is not None:
        written = written_ms(table)
        files = {path: file for path, file in files.items() if written[path] < written_before_ms}
    merged = failed = 0
    for day, paths in small_file_groups(files, TARGET_FILE_BYTES, GROUP_BYTES):
        writer = lake.TableWriter(lake_dir, name, stored, prefix=COMPACTED_PREFIX)
        try:
            writer.write_merged(day, paths)
            # Removes exactly these files, or fails: one removed meanwhile is a KeyError (gone from the
            # table the commit reads) or a conflict in Delta's commit (gone since).
            version = (lake.open_table(lake_dir, name).transaction_version(COMPACTION_APP_ID) or 0) + 1
            writer.commit(COMPACTION_APP_ID, metadata, version=version, remove=paths, data_change=False)
            merged += len(paths)
        except BaseException as exc:  # noqa: B036 - lake.is_failure
            if not lake.is_failure(exc):
                raise
            failed += 1
            log.warning("compaction of %s: a group of %d files was not merged (tried again later): %s: %s",
                        name, len(paths), type(exc).__name__, exc)
    return merged, failed


def written_ms(table) -> dict[str, int]:
    """Each data file of the table's snapshot (path relative to the table, unquoted) -> the time its
    add action says it was written, in ms since the epoch."""
    actions = pa.table(table.get_add_actions(flatten=True)).select(["path", "modification_time"])
    return dict(zip((unquote(path) for path in actions["path"].to_pylist()),
                    actions["modification_time"].cast(pa.int64()).to_pylist()))
