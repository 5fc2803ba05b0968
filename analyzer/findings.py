"""Reading and showing the findings table: no Spark needed to look at what the analysis found."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

from . import lake, schema
from .published import read_published
from .terminal import NAME_LIMIT, printable

SEVERITY_ORDER = {name: rank for rank, name in enumerate(reversed(schema.SEVERITIES))}  # critical first
EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
JSON_FIELDS = ("kind", "severity", "connection_id", "connection_name", "client", "server", "channel", "incarnation",
               "first_ts", "last_ts", "count", "value", "threshold", "message_identity", "summary", "evidence",
               "finding_id", "agent_id", "source")
SUMMARY_LIMIT = 1000  # a summary quotes a message id or reply text: a sentence's room, not a flood's


def read_findings(lake_dir: str, kind: str | None = None) -> list[dict]:
    """The findings, worst first, then by time."""
    if lake.open_table(lake_dir, "findings") is None:
        return []
    rows = read_published(lake_dir, "findings", schema.FINDINGS).to_pylist()
    if kind is not None:
        rows = [row for row in rows if row["kind"] == kind]
    return sorted(rows, key=lambda r: (SEVERITY_ORDER.get(r["severity"], 9), r["first_ts_ns"] or 0,
                                       r["connection_id"] or "", r["channel"] or 0, r["kind"]))


def findings_json(rows: list[dict]) -> list[dict]:
    out = []
    for row in rows:
        item = {name: row.get(name) for name in JSON_FIELDS}
        item["first_ts"], item["last_ts"] = _iso(row["first_ts_ns"]), _iso(row["last_ts_ns"])
        try:
            item["evidence"] = json.loads(row["evidence"]) if row["evidence"] else None
        except ValueError:
            pass  # kept as the text it is
        out.append(item)
    return out


def render_findings(rows: list[dict]) -> str:
    """The findings as a table for a terminal: one line per finding, every value from the wire
    (names, message ids and reply texts in the summaries) escaped and bounded (terminal.py)."""
    if not rows:
        return "no findings"
    header = ("SEVERITY", "KIND", "CONNECTION", "CH", "FIRST SEEN (UTC)", "COUNT", "SUMMARY")
    table = [header] + [(
        printable(row["severity"]), printable(row["kind"]), printable(connection_label(row), NAME_LIMIT),
        str(row["channel"]), (_iso(row["first_ts_ns"]) or "")[:23].replace("T", " "), f"{row['count']:,}",
        printable(row["summary"] or "", SUMMARY_LIMIT)) for row in rows]
    widths = [max(len(line[i]) for line in table) for i in range(len(header) - 1)]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(line, widths)) + "  " + line[-1] for line in table)


def connection_label(row: dict) -> str:
    """A finding's connection as people know it: its connection_name, else its two ends."""
    if row.get("connection_name"):
        return row["connection_name"]
    client, server = connection_ends(row)
    return f"{client} > {server}" if client or server else "unknown connection"


def connection_ends(row: dict) -> tuple[str | None, str | None]:
    """(client, server) of a finding: its columns; for a connection with no connections row (the
    analysis ran while it was open, or its row was lost), the ends its id names
    ("10.0.0.7:40112>10.0.0.2:5672@<first seen>")."""
    if row.get("client") or row.get("server"):
        return row.get("client") or "?", row.get("server") or "?"
    client, sep, server = (row.get("connection_id") or "").split("@", 1)[0].partition(">")
    return (client, server) if sep else (None, None)


def _iso(ns: int | None) -> str | None:
    if ns is None:
        return None
    return (EPOCH + timedelta(microseconds=ns // 1000)).isoformat(timespec="microseconds")
