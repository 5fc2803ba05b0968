"""Keeps the analysis tables from gathering small files run after run, and merges the agents' small
files of the input tables a run analysed (docs/analysis.md, "On a schedule, in one driver": Compaction,
The agents' small files), by the agent's compaction's rules (analyzer/agent/compaction.py).
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

# A file this small costs a reader more to open than to read; a larger one's bytes dominate its read,
# so a full run's files (wide_writes.FILE_ROWS rows: ~8 MB of deliveries) are not merged again. A group
# of at least so many is worth a commit; a merged file gathers about so many bytes at most (streamed).
SMALL_FILE_BYTES = OPEN_COST_BYTES
FILES_TO_MERGE = 16
MERGED_FILE_BYTES = 64 * 1024 * 1024
# Files removed longer ago are deleted (Delta's usual 7 days): a reader of an older snapshot (a
# report, a push) has long finished with them.
VACUUM_RETENTION_HOURS = 168


@dataclass(frozen=True)
class SmallFiles:
    """The groups of a table's files `compact` would merge: ((day, the flags' values), paths)."""
    schema: pa.Schema | None = None
    groups: list[tuple[tuple, list[str]]] = field(default_factory=list)


def small_final_files(lake: str, name: str) -> SmallFiles:
    """The final files (`provisional` false: no later run rewrites them) grouped by day and by the
    value of each flag the writers keep files apart by (wide_writes.FILE_FLAGS), so a merged file's
    statistics still let a read skip it (delta-rs's OPTIMIZE would mix them). A file whose
    statistics do not say one value of each flag is left alone."""
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
    """Each group merged into one file, all in one commit, `dataChange` false; how many files it removed."""
    if not found.groups:
        return 0
    writer = TableWriter(lake, name, found.schema, prefix=agent_compaction.COMPACTED_PREFIX)
    for (day, values), paths in found.groups:
        writer.write_merged(day, paths, dict(values))
    removed = [path for _, paths in found.groups for path in paths]
    # No app transaction: the commit is the run's, tagged with its id as its others are, so the table
    # still reads as last written by a finished run (provisional.last_written_by_finished_run).
    writer.commit([], {"userMetadata": tag} if tag is not None else {}, remove=removed, data_change=False)
    # As the agent does: a checkpoint (a run reads the log from the last one), then a vacuum.
    table = open_table(lake, name)
    table.create_checkpoint()
    table.vacuum(retention_hours=VACUUM_RETENTION_HOURS, enforce_retention_duration=False, dry_run=False)
    return len(removed)


def merge_analysed_input(lake: str, frames_version: int, run_id: str) -> dict[str, int]:
    """After a complete run that analysed `frames` at `frames_version`: that snapshot's small files
    still in the table (rows not analysed yet would make the next run full: run_scope.py), and every
    small file of `connections` (read whole by every run), merged by the agent's compaction; the
    files merged away, per table where there were any. Then a vacuum (a lake no agent writes has
    only this); no checkpoint: the agent's compaction writes one at its interval."""
    analysed = set(table_files(DeltaTable(os.path.join(lake, "frames"), version=frames_version)))
    metadata = {"ackscope.operation": "compaction", "ackscope.run_id": run_id}
    merged = {"frames": agent_compaction.compact_table(lake, "frames", metadata, among=analysed)[0],
              "connections": agent_compaction.compact_table(lake, "connections", metadata)[0]}
    for name in (name for name, files in merged.items() if files):
        open_table(lake, name).vacuum(retention_hours=VACUUM_RETENTION_HOURS, enforce_retention_duration=False,
                                      dry_run=False)
    return {name: files for name, files in merged.items() if files}
