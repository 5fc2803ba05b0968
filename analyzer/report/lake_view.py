"""What the report shows, read from the lake with delta-rs and pyarrow (no Spark), in bounded pieces.

Whole tables are never loaded: the frame count comes from the Delta log's statistics, the big
timeline tables are read a few columns at a time, and the rows of single channels or messages are
filtered while the Parquet files are read. Every table may be missing (a lake only ingested, or
not even that): the fields are then empty and `analysed` / `ingested` say so.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc

from .. import lake, schema
from ..findings import read_findings
from ..published import read_published
from ..timeline.tables import CHANNELS

CONNECTION_COLUMNS = [
    "connection_id", "first_ts_ns", "last_ts_ns", "source", "client_addr", "client_port", "server_addr",
    "server_port", "protocol", "started_at_syn", "client_product", "client_version", "connection_name",
    "server_product", "server_version", "user", "vhost", "close_code", "close_text", "closed_by", "ended_by",
    "frames_to_broker", "frames_to_client", "gaps", "framing_errors"]
CHANNEL_COLUMNS = ["connection_id", "channel", "incarnation", "open_ts_ns", "end_ts_ns", "ended_by",
                   "observed_until_ts_ns", "deliveries", "publishes", "peak_unacked", "confirm_mode",
                   "consumer_prefetch", "channel_prefetch"]


class LakeMissing(Exception):
    """The folder does not exist: nothing to report on (a typo, most often)."""


MAX_CONNECTIONS = 300   # connections listed beside those with findings
BUSIEST_CHANNELS = 8    # per kind of traffic: the channels the pictures may pick besides those with findings


@dataclass
class LakeView:
    """What the page needs. Lists are a bounded selection; the counts and the span are of everything."""
    lake_dir: str
    ingested: bool = False               # a frames or connections table exists
    analysed: bool = False               # a findings table exists
    frames: int = 0
    connection_count: int = 0
    amqp_connections: int = 0
    span_ns: tuple[int, int] | None = None
    servers: list[tuple[str, int]] = field(default_factory=list)  # server product and version, how many
    connections: list[dict] = field(default_factory=list)  # those with findings, then the first by time
    findings: list[dict] = field(default_factory=list)
    channels: list[dict] = field(default_factory=list)  # those with findings, and the busiest
    last_run: dict | None = None
    runs: int = 0
    has_channel_metrics: bool = False

    @property
    def bucket_seconds(self) -> int:
        """channel_metrics' bucket length, as the last run wrote it (10 s, the default, if unknown)."""
        return int((self.last_run or {}).get("bucket_seconds") or 10)

    def connection(self, connection_id: str) -> dict | None:
        if not hasattr(self, "_by_id"):
            self._by_id = {c["connection_id"]: c for c in self.connections}
        return self._by_id.get(connection_id)


def read_lake(lake_dir: str) -> LakeView:
    if not lake.is_dir(lake_dir):
        raise LakeMissing(f"no lake at {lake_dir}: the folder does not exist")
    view = LakeView(lake_dir)
    frames = lake.open_table(lake_dir, "frames")
    if frames is not None:
        view.frames = _row_count(lake_dir, frames)
    view.analysed = lake.open_table(lake_dir, "findings") is not None
    view.findings = read_findings(lake_dir)
    connections = lake.read_table(lake_dir, "connections", schema.CONNECTIONS, columns=CONNECTION_COLUMNS)
    view.ingested = frames is not None or connections is not None
    if connections is not None:
        _read_connections(view, connections)
    channels = read_published(lake_dir, "channels", CHANNELS, columns=CHANNEL_COLUMNS)
    if channels is not None:
        view.channels = _chosen_channels(channels, view.findings)
    view.has_channel_metrics = lake.open_table(lake_dir, "channel_metrics") is not None
    runs = lake.read_table(lake_dir, "analysis_runs", schema.ANALYSIS_RUNS)
    if runs is not None and runs.num_rows:
        rows = sorted(runs.to_pylist(), key=lambda r: r["finished_ts"] or r["started_ts"])
        view.runs, view.last_run = len(rows), rows[-1]
    return view


def _read_connections(view: LakeView, table: pa.Table) -> None:
    """Counts, span and servers over every connection (a lake of reconnecting clients holds millions);
    as rows only those with findings and the first MAX_CONNECTIONS by time."""
    view.connection_count = table.num_rows
    view.amqp_connections = pc.sum(pc.equal(table["protocol"], "amqp-0-9-1")).as_py() or 0
    first, last = pc.min(table["first_ts_ns"]).as_py(), pc.max(table["last_ts_ns"]).as_py()
    view.span_ns = (first, last) if first is not None and last is not None else None
    seen = table.filter(pc.is_valid(table["server_product"]))
    products = pc.binary_join_element_wise(seen["server_product"], pc.fill_null(seen["server_version"], ""), " ")
    products = pc.utf8_rtrim_whitespace(products)
    view.servers = sorted(((v["values"], v["counts"]) for v in pc.value_counts(products).to_pylist()),
                          key=lambda item: -item[1])[:3]
    with_findings = pc.is_in(table["connection_id"], pa.array({f["connection_id"] for f in view.findings}, pa.string()))
    ordered = table.sort_by([("first_ts_ns", "ascending"), ("connection_id", "ascending")])
    chosen = pa.concat_tables([table.filter(with_findings), ordered.slice(0, MAX_CONNECTIONS)])
    rows = {row["connection_id"]: row for row in chosen.to_pylist()}
    view.connections = sorted(rows.values(), key=lambda c: (c["first_ts_ns"] or 0, c["connection_id"]))


def _chosen_channels(table: pa.Table, findings: list[dict]) -> list[dict]:
    """The channel incarnations a picture may show: those with findings, and the busiest consumers
    and publishers. A lake holds one row per channel incarnation ever opened: never all of them."""
    keys = {(f["connection_id"], f["channel"], f["incarnation"]) for f in findings}
    on_findings = table.filter(pc.is_in(table["connection_id"],
                                        pa.array({k[0] for k in keys}, pa.string())))
    rows = {}
    for row in on_findings.to_pylist():
        key = (row["connection_id"], row["channel"], row["incarnation"])
        if key in keys:
            rows[key] = row
    for column in ("deliveries", "publishes"):
        for row in table.sort_by([(column, "descending")]).slice(0, BUSIEST_CHANNELS).to_pylist():
            rows.setdefault((row["connection_id"], row["channel"], row["incarnation"]), row)
    return list(rows.values())


def _row_count(lake_dir: str, table) -> int:
    """Rows of the frames table: from its log's per-file statistics, else counted from its files."""
    logged = lake.logged_rows(table)
    if logged is not None:
        return logged
    return lake.read_table(lake_dir, "frames", schema.FRAMES, columns=["seq"]).num_rows


def evidence_of(finding: dict) -> dict:
    """A finding's evidence JSON as a dict ({} if absent; the raw text under "text" if not JSON)."""
    raw = finding.get("evidence")
    if not raw:
        return {}
    try:
        parsed = json.loads(raw)
    except ValueError:
        return {"text": raw}
    return parsed if isinstance(parsed, dict) else {"value": parsed}


def incarnation_rows(lake_dir: str, table: str, table_schema: pa.Schema, columns: list[str],
                     key: tuple[str, int, int]) -> pa.Table:
    """The rows of one channel incarnation, filtered while reading."""
    connection_id, channel, incarnation = key
    where = ((pc.field("connection_id") == connection_id) & (pc.field("channel") == channel)
             & (pc.field("incarnation") == incarnation))
    rows = read_published(lake_dir, table, table_schema, columns=columns, where=where)
    return rows if rows is not None else table_schema.empty_table().select(columns)


def message_deliveries(lake_dir: str, message_identity: str, limit: int) -> tuple[list[dict], int]:
    """The first `limit` deliveries of one message, in time order, and how many there are in all."""
    columns = ["connection_id", "channel", "incarnation", "ts_ns", "delivery_tag", "consumer_tag", "queue",
               "redelivered", "x_death_count", "outcome", "requeue", "settle_ts_ns"]
    rows = read_published(lake_dir, "deliveries", schema.DELIVERIES, columns=columns,
                           where=pc.field("message_identity") == message_identity)
    if rows is None or rows.num_rows == 0:
        return [], 0
    rows = rows.sort_by([("ts_ns", "ascending")])
    return rows.slice(0, limit).to_pylist(), rows.num_rows


def column_values(lake_dir: str, table: str, table_schema: pa.Schema, column: str,
                  where: pc.Expression) -> pa.Array:
    """One column of a table, filtered while reading (latencies, out-of-order distances)."""
    rows = read_published(lake_dir, table, table_schema, columns=[column], where=where)
    if rows is None:
        return pa.array([], table_schema.field(column).type)
    return rows[column].combine_chunks()
