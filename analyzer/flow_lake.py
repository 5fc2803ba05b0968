"""The `flow_state` table: a capture source's open flows, kept between two ingests.

At the end of an ingest, every flow still open is saved as data (flow_state.py), keyed by (capture
source, connection id), with the source's own row (connection id ""): how far its capture got
(`last_ts_ns`, the last file) and the files of `frames` and `connections` that hold the rows the
open flows' provisional ending made (they ended as at the end of any capture, so the lake is
complete if nothing follows). The next ingest from the same source whose first packet follows
within --continue-within restores those flows, takes the provisional files out in its own commits
and writes the connections' rows again as they stand then. A source's rows are replaced as a whole,
in one commit (Delta's replaceWhere on `source`), tagged with the ingested files' app ids.

A row that fails any check is refused, that flow only: it starts again mid-stream, nothing false.
"""

from dataclasses import dataclass, field
from datetime import datetime, timezone

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import CommitProperties, Transaction, write_deltalake

from . import lake
from .connection import address_text
from .flow_state import FORMAT_VERSION, Fields, FlowStateError, dumps, loads
from .schema import FLOW_STATE, PARTITION_BY

TABLE = "flow_state"
SOURCE_ROW = ""  # the connection_id of a source's own row
MAX_ENDED = 1 << 20  # flows ended in a piece's last two minutes (pieces.STRAGGLERS_NS): a busy broker's churn and more


@dataclass
class SourceState:
    """What a source's last ingest left: how far it got, its open flows, its provisional files."""
    last_ts_ns: int
    last_file: str
    flows: list[tuple[str, str]] = field(default_factory=list)      # (connection id, JSON state), by id
    provisional: dict[str, list[str]] = field(default_factory=dict)  # table -> files (relative paths)
    ended: list[tuple] = field(default_factory=list)  # flows ended near its end: FlowTable.ended_flows

    def source_doc(self) -> dict:
        return {"last_ts_ns": self.last_ts_ns, "last_file": self.last_file,
                "provisional": {name: sorted(paths) for name, paths in self.provisional.items()},
                "ended": [{"client": [address_text(client[0]), client[1]], "server": [address_text(server[0]), server[1]],
                           "last_ts_ns": last_ts_ns} for client, server, last_ts_ns in self.ended]}


def load(lake_dir: str, source: str, notes: list[str]) -> SourceState | None:
    """The source's saved state, or None (none saved, or its own row refused: a note says why)."""
    rows = lake.read_table(lake_dir, TABLE, FLOW_STATE, where=pc.field("source") == source)
    if rows is None or rows.num_rows == 0:
        return None
    rows = rows.to_pylist()
    own = [r for r in rows if r["connection_id"] == SOURCE_ROW]
    try:
        if len(own) != 1 or own[0]["format_version"] != FORMAT_VERSION:
            raise FlowStateError(f"{len(own)} rows of the source's own state, of format "
                                 f"{[r['format_version'] for r in own]}, where one of format {FORMAT_VERSION} is read")
        f = Fields(loads(own[0]["state"]), "source")
        state = SourceState(f.int("last_ts_ns"), f.str("last_file"))
        provisional = f.obj("provisional")
        for name in ("frames", "connections"):
            paths = provisional.list(name, 1 << 16)
            if not all(type(p) is str and p and ".." not in p.split("/") for p in paths):
                provisional.fail(name, "not a list of file paths within the table")
            state.provisional[name] = paths
        for k, item in enumerate(f.list("ended", MAX_ENDED)):
            flow = Fields(item, f"source.ended[{k}]")
            state.ended.append((flow.end("client"), flow.end("server"), flow.int("last_ts_ns")))
    except FlowStateError as exc:
        notes.append(f"source {source!r}: its saved state in {lake_dir} was refused ({exc}); its flows "
                     f"start again mid-stream")
        return None
    for row in sorted((r for r in rows if r["connection_id"] != SOURCE_ROW), key=lambda r: r["connection_id"]):
        if row["format_version"] != FORMAT_VERSION or row["state"] is None:
            notes.append(f"source {source!r}: connection {row['connection_id']}: saved state of format "
                         f"{row['format_version']} refused; it starts again mid-stream")
            continue
        state.flows.append((row["connection_id"], row["state"]))
    return state


def save(lake_dir: str, source: str, state: SourceState, app_ids: list[str], metadata: dict) -> None:
    """Replace the source's rows with `state`, in one commit tagged with `app_ids`."""
    date = datetime.fromtimestamp(state.last_ts_ns / 1e9, timezone.utc).strftime("%Y-%m-%d")
    rows = [{"source": source, "connection_id": SOURCE_ROW, "state": dumps(state.source_doc())}]
    rows += [{"source": source, "connection_id": cid, "state": text} for cid, text in state.flows]
    for row in rows:
        row.update(date=date, format_version=FORMAT_VERSION, last_ts_ns=state.last_ts_ns)
    path = f"{lake_dir}/{TABLE}"
    lake.open_or_create(path, FLOW_STATE)
    write_deltalake(path, pa.Table.from_pylist(rows, FLOW_STATE), mode="overwrite", partition_by=PARTITION_BY,
                    predicate=f"source = {sql_string(source)}",
                    commit_properties=CommitProperties(
                        custom_metadata={k: str(v) for k, v in metadata.items()},
                        app_transactions=[Transaction(i, 1) for i in app_ids]))


def sql_string(text: str) -> str:
    """A string literal for a Delta predicate (delta-rs's SQL): quotes doubled."""
    return "'" + text.replace("'", "''") + "'"


def sources(lake_dir: str) -> list[str]:
    rows = lake.read_table(lake_dir, TABLE, FLOW_STATE, columns=["source", "connection_id"])
    if rows is None:
        return []
    return sorted(set(rows.filter(pc.field("connection_id") == SOURCE_ROW)["source"].to_pylist()))
