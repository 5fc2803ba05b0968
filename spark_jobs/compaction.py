"""Keeps the analysis tables from gathering small files run after run.

Every scoped run adds files to the tables it patches (a file per partition and flag combination
written), and a driver that runs every few minutes (`analyze --every`) adds hundreds a day: after
40 runs of bench/every.py, 234 files in deliveries. Each read opens them all, or those the flags'
statistics keep. So at the end of a scoped run, a table's small files are rewritten into one where
there are enough of them to pay.

Which files: those a later run never rewrites, the final ones (`provisional` false in their
statistics: provisional.py; every file of findings and analysis_runs, which have no such flag),
grouped by partition and by the value of every flag the writers keep files apart by
(wide_writes.FILE_FLAGS), so the merged file has one value of each flag and its
statistics still let a read skip it (table_files.files_that_may_hold). delta-rs's OPTIMIZE would
merge across the flags and lose that. The groups are cut and merged by the agent's compaction's
rules (analyzer/agent/compaction.py: small_file_groups, each group streamed into one file by
TableWriter.write_merged, the flags' values kept in its statistics), with this module's sizes and
key; unlike the agent's, every group goes in one commit, which removes the old files and adds the
new ones with `dataChange` false (no row changed: a reader of changes skips it), tagged with the
run's id like the run's other commits (provisional.last_written_by_finished_run), with no app
transaction. Then, as the agent does, a checkpoint of the log and a vacuum of the files removed
over a week ago.

The input tables too (`merge_analysed_input`): after each complete run, the small files of
`frames` in the snapshot the run analysed, and those of `connections`, are merged by the agent's
own compaction (analyzer/agent/compaction.py), in the driver, where memory is plentiful. The
agent then finds nothing old enough to merge (its --compact-min-age), so its sidecar's peak is its
steady state; and as only analysed files are merged, the next run stays scoped (a compaction of
rows not analysed yet makes it analyse everything: run_scope.py).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from urllib.parse import unquote

import pyarrow as pa
from deltalake import DeltaTable

from analyzer.agent import compaction as agent_compaction
from analyzer.lake import TableWriter, open_table, table_files

from .provisional import PROVISIONAL
from .table_files import OPEN_COST_BYTES
from .wide_writes import FILE_FLAGS

# A file this small is worth merging: it costs a reader more to open than to read
# (table_files.OPEN_COST_BYTES). A larger file's bytes dominate its read and merging it saves little;
# so a full run's files (a pass writes wide_writes.FILE_ROWS rows a file: ~8 MB of deliveries) are
# not rewritten by the run after it. A group of at least so many is worth a commit; a merged file
# gathers at most about so many bytes of them (streamed: the driver holds lake.MERGE_ROW_GROUP_BYTES).
SMALL_FILE_BYTES = OPEN_COST_BYTES
FILES_TO_MERGE = 16
MERGED_FILE_BYTES = 64 * 1024 * 1024
# A compacted table's files removed longer ago than this are deleted from the store (Delta's usual
# 7 days): a reader of an older snapshot (a report, a push) has long finished with them.
VACUUM_RETENTION_HOURS = 168


@dataclass(frozen=True)
class SmallFiles:
    """The groups of a table's files `compact` would merge, as one read of its log found them:
    ((day, the flags' values), paths relative to the table)."""
    schema: pa.Schema | None = None
    groups: list[tuple[tuple, list[str]]] = field(default_factory=list)


def small_final_files(lake: str, name: str) -> SmallFiles:
    """The groups of at least FILES_TO_MERGE final files under SMALL_FILE_BYTES of one partition
    and one value of each flag, cut into runs of at most about MERGED_FILE_BYTES, by the agent's
    rule (agent_compaction.small_file_groups). A file whose statistics do not say one value of each
    flag is left alone."""
    table = open_table(lake, name)
    if table is None:
        return SmallFiles()
    schema = pa.schema(table.schema().to_arrow())
    flags = tuple(flag for flag in FILE_FLAGS if flag in schema.names)
    files = {}
    for action in pa.table(table.get_add_actions(flatten=True)).to_pylist():
        values = {flag: action.get(f"min.{flag}") for flag in flags}
        if not values.get(PROVISIONAL) and all(
                value is not None and value == action.get(f"max.{flag}") and not action.get(f"null_count.{flag}")
                for flag, value in values.items()):
            files[unquote(action["path"])] = (action["size_bytes"], (action["partition.date"], tuple(values.items())))
    return SmallFiles(schema, agent_compaction.small_file_groups(files, SMALL_FILE_BYTES, MERGED_FILE_BYTES,
                                                                 FILES_TO_MERGE))


def compact(lake: str, name: str, found: SmallFiles, tag: str | None) -> int:
    """Merges each group of files (small_final_files) into one file, streamed as the agent merges
    (TableWriter.write_merged), all in one commit; returns how many files it removed."""
    if not found.groups:
        return 0
    writer = TableWriter(lake, name, found.schema, prefix=agent_compaction.COMPACTED_PREFIX)
    for (day, values), paths in found.groups:
        writer.write_merged(day, paths, dict(values))
    removed = [path for _, paths in found.groups for path in paths]
    # No app transaction: the commit is the run's, tagged with its id as its others are.
    writer.commit([], {"userMetadata": tag} if tag is not None else {}, remove=removed, data_change=False)
    # As the agent does after its compactions: a checkpoint of the log (a run reads the table's log
    # from the last one), then the files removed long enough ago, by every run's patches too.
    table = open_table(lake, name)
    table.create_checkpoint()
    table.vacuum(retention_hours=VACUUM_RETENTION_HOURS, enforce_retention_duration=False, dry_run=False)
    return len(removed)


def merge_analysed_input(lake: str, frames_version: int, run_id: str) -> dict[str, int]:
    """After a complete run that analysed `frames` at `frames_version`: the small files of that
    snapshot still in the table, and every small file of `connections` (read whole by every run,
    so merging its files changes no run's scope), merged as the agent merges (one implementation,
    its groups and commits); the files merged away, per table where there were any. Then, as after
    the analysis tables' compactions, the files removed over VACUUM_RETENTION_HOURS ago are deleted
    (the agent vacuums sooner, with its --retention-hours; a lake no agent writes has only this).
    No checkpoint: the agent's compaction writes one at its interval."""
    analysed = set(table_files(DeltaTable(os.path.join(lake, "frames"), version=frames_version)))
    metadata = {"ackscope.operation": "compaction", "ackscope.run_id": run_id}
    merged = {"frames": agent_compaction.compact_table(lake, "frames", metadata, among=analysed)[0],
              "connections": agent_compaction.compact_table(lake, "connections", metadata)[0]}
    for name in (name for name, files in merged.items() if files):
        open_table(lake, name).vacuum(retention_hours=VACUUM_RETENTION_HOURS, enforce_retention_duration=False,
                                      dry_run=False)
    return {name: files for name, files in merged.items() if files}
