"""What every detector shares: the raw finding, its evidence vocabulary, bounded evidence lists,
the Spark-compatible text formatting, and `finish`, which turns raw findings into rows of
schema.FINDINGS.

A detector returns `RawFinding`s: the FINDINGS columns it knows plus `evidence`, a dict in the
order of EVIDENCE holding only the fields that apply (the JSON leaves the others out, as Spark's
`to_json` leaves out null fields). `evidence["seqs"]` are the frame rows the finding points at;
`finish` asks the caller's `packets_of` for their capture packet numbers.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from decimal import ROUND_HALF_UP, Decimal
from operator import itemgetter

from ..schema import FINDING_SEVERITY

# Items listed in a finding's evidence: enough to open the first few in Wireshark; `count` says
# how many there are in all.
MAX_EVIDENCE = 20

SEVERITY = FINDING_SEVERITY

# The evidence fields of every kind, in the order the JSON lists them: the one vocabulary.
EVIDENCE = (
    "seqs", "tags", "confirm_seqs", "message_identities", "message_id", "exchanges", "routing_keys",
    "ended_by", "end_seq", "close_code", "close_text", "violations", "methods", "evidence_from",
    "delivered_on_channels", "reply_code", "reply_text", "return_codes", "out_of_order_by_max",
    "oldest_tag", "oldest_seq", "oldest_age_seconds", "stall_seconds", "prefetch_limit", "peak_unacked",
    "confirm_mode_publishes", "lockstep_publishes", "median_idle_seconds", "publishes_per_second",
    "deliveries", "bounces", "x_death_max", "channels", "redelivered_on", "redelivered_on_channels",
    "queues", "reason", "episodes", "still_blocked",
)

# The frames columns `packets_of` reads: a seq's capture packet number and capture file.
PACKET_COLUMNS = ("seq", "source_packet", "source")

# (source_packet, source) of each seq asked for, in order; None where the frames lack the seq.
PacketsOf = Callable[[Sequence[int]], Sequence["tuple[int | None, str | None] | None"]]

Incarnation = tuple[int, int]  # (channel, incarnation)


@dataclass(slots=True)
class RawFinding:
    kind: str
    agent_id: str | None
    channel: int
    incarnation: int | None
    first_ts_ns: int | None
    last_ts_ns: int | None
    count: int
    summary: str
    evidence: dict
    value: float | None = None
    threshold: float | None = None
    message_identity: str | None = None   # the message a finding follows (messages.py's kinds)


# -- bounded running aggregates ------------------------------------------------------------------

class Firsts:
    """The MAX_EVIDENCE items of smallest key among items that arrive in any order, in key order.
    Holds at most 4 * MAX_EVIDENCE of them between trims."""
    __slots__ = ("_items",)

    def __init__(self):
        self._items: list = []

    def add(self, key, item) -> None:
        self._items.append((key, item))
        if len(self._items) >= 4 * MAX_EVIDENCE:
            self._trim()

    def _trim(self) -> None:
        self._items.sort(key=itemgetter(0))
        del self._items[MAX_EVIDENCE:]

    def listed(self) -> list:
        self._trim()
        return [item for _, item in self._items]


class Tally:
    """Count, span and the first items of one group of records (a kind on one incarnation)."""
    __slots__ = ("agent_id", "n", "first_ns", "last_ns", "items")

    def __init__(self):
        self.agent_id, self.n, self.first_ns, self.last_ns = None, 0, None, None
        self.items = Firsts()

    def add(self, agent_id, first_ns: int, last_ns: int, key, item) -> None:
        self.agent_id = least(self.agent_id, agent_id)
        self.n += 1
        self.first_ns = first_ns if self.first_ns is None or first_ns < self.first_ns else self.first_ns
        self.last_ns = last_ns if self.last_ns is None or last_ns > self.last_ns else self.last_ns
        self.items.add(key, item)


def least(a, b):
    """min that skips None, as SQL's min."""
    return b if a is None else a if b is None else min(a, b)


def most(a, b):
    """max that skips None, as SQL's max."""
    return b if a is None else a if b is None else max(a, b)


def nulls_first(values: Iterable) -> tuple:
    """A sort key for a row with nulls, ordered as Spark's sort_array orders structs (nulls first)."""
    return tuple((0, 0) if v is None else (1, v) for v in values)


def column(items: list[dict], name: str) -> list:
    return [item[name] for item in items]


def seconds(ns: int | None) -> float | None:
    return None if ns is None else float(ns) / 1e9


# -- text as Spark's format_string writes it ------------------------------------------------------

def fixed(x: float | None, digits: int) -> str:
    """`%.Nf` as Java's Formatter writes it: half-up on the shortest decimal form (0.25 -> 0.3, 0.15
    -> 0.2), where Python rounds the binary value half-even; null as "null"."""
    if x is None:
        return "null"
    return f"{Decimal(repr(float(x))).quantize(Decimal(1).scaleb(-digits), rounding=ROUND_HALF_UP):f}"


def text(x) -> str:
    """`%d` / `%s` of format_string: null as "null"."""
    return "null" if x is None else str(x)


# -- the last step --------------------------------------------------------------------------------

def endpoint(addr: str | None, port: int | None) -> str | None:
    if addr is None:
        return None
    host = f"[{addr}]" if ":" in addr else addr
    return host if port is None else f"{host}:{port}"


def finding_id(kind: str, connection_id: str, channel: int | None, incarnation: int | None,
               message_identity: str | None = None) -> str:
    """A hash of what identifies a finding, so a rerun over the same data gives the same id."""
    parts = (kind, connection_id, channel, incarnation, message_identity)
    return hashlib.sha256("|".join("" if p is None else str(p) for p in parts).encode()).hexdigest()


_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def timestamp(ns: int | None) -> datetime | None:
    # Integer division, as the agent derives its timestamps (analyzer/rows.py): never through a double.
    return None if ns is None else _EPOCH + timedelta(microseconds=ns // 1000)


def day(ns: int | None) -> str | None:
    return None if ns is None else (_EPOCH + timedelta(days=ns // (86_400 * 10**9))).strftime("%Y-%m-%d")


def evidence_json(evidence: dict, source_packets: list, source_files: list | None = None) -> str:
    """The JSON Spark's to_json writes: EVIDENCE order, null fields (also inside structs) left
    out, nulls inside arrays kept. `source_files`: the file of each packet, given only when the
    packets are in more than one file (a capture in pieces)."""
    ordered = {name: _without_nulls(evidence[name]) for name in EVIDENCE if evidence.get(name) is not None}
    ordered["source_packets"] = source_packets
    if source_files is not None:
        ordered["source_files"] = source_files
    return json.dumps(ordered, separators=(",", ":"))


def packet_files(located: list) -> list | None:
    """Each evidence frame's capture file, when they are not all one (a connection whose capture
    came in pieces: packet numbers count from 1 in each file), else None: the finding's `source`
    names the one file."""
    files = [None if where is None else where[1] for where in located]
    return files if len({f for f in files if f is not None}) > 1 else None


def _without_nulls(value):
    if isinstance(value, list):
        return [_without_nulls(v) for v in value]
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    return value


def finish(raw: RawFinding, connection: dict, packets_of: PacketsOf) -> dict:
    """A raw finding -> a row of schema.FINDINGS: stable id, who the connection is, capture packets
    of the evidence frames, timestamps and date. `connection` is its schema.CONNECTIONS row."""
    seqs = raw.evidence.get("seqs") or []
    located = list(packets_of(seqs)) if seqs else []
    packets = [None if where is None else where[0] for where in located]
    # The capture file of the first evidence frame that names one, else the connection's.
    evidence_source = next((where[1] for where in located if where is not None and where[1] is not None), None)
    connection_id = connection["connection_id"]
    return {
        "date": day(raw.first_ts_ns),
        "finding_id": finding_id(raw.kind, connection_id, raw.channel, raw.incarnation, raw.message_identity),
        "kind": raw.kind,
        "severity": SEVERITY[raw.kind],
        "connection_id": connection_id,
        "agent_id": raw.agent_id,
        "connection_name": connection.get("connection_name"),
        "client": endpoint(connection.get("client_addr"), connection.get("client_port")),
        "server": endpoint(connection.get("server_addr"), connection.get("server_port")),
        "channel": raw.channel,
        "incarnation": raw.incarnation,
        "first_ts": timestamp(raw.first_ts_ns), "first_ts_ns": raw.first_ts_ns,
        "last_ts": timestamp(raw.last_ts_ns), "last_ts_ns": raw.last_ts_ns,
        "count": raw.count,
        "value": None if raw.value is None else float(raw.value),
        "threshold": None if raw.threshold is None else float(raw.threshold),
        "message_identity": raw.message_identity,
        "summary": raw.summary,
        "evidence": evidence_json(raw.evidence, packets, packet_files(located)),
        "source": evidence_source if evidence_source is not None else connection.get("source"),
    }
