"""The agent's decode loop: live packets through the same sans-IO core as `ackscope ingest`.

Raw link-layer bytes -> packets.tcp_segment -> FlowTable (reassembly, framing, frame rows) ->
RowSink, exactly as ingest.decode does for a file, so the frames and connections rows are the
same in form. The Python path only: the native lane is built around reading whole capture files
(it takes over packets inside its pcap/pcapng record loop), and a live batch is small.

What a file decode does once at its end happens here continuously:
- `take()` hands over the frame rows decoded so far (an Arrow table of schema.FRAMES), the rows
  the state machine may see now (in seq order per connection; see `_ordered_for_timelines`),
  and the connection rows of the connections that ended, once each.
- Connections end by FIN/RST (the core notices), or by expiring after `idle_timeout_s` without a
  packet; ended flows linger a little so their last stray ACKs do not open a phantom flow, then
  they are forgotten. Memory is bounded by the connections open, not by the agent's uptime.
"""

from __future__ import annotations

import time
from collections import Counter

import pyarrow as pa

from .. import schema
from ..flows import FlowTable
from ..ingest import connections_table
from ..packets import SUPPORTED_LINKTYPES, tcp_segment
from ..rows import RowSink
from ..spec import DEFAULT_MAX_FRAME
from ..timeline import INPUT_COLUMNS
from ..tls.layer import HANDSHAKE_STATE, NOT_DECRYPTED, WAITING

DEFAULT_IDLE_TIMEOUT_S = 600.0
LINGER_S = 30.0  # an ended flow's stragglers (last ACK, retransmitted FIN) still find it this long
MAX_ERRORS_KEPT = 100
# Row keys the state machine indexes (row["..."]) rather than .get(): kept even when null.
ALWAYS_KEYS = frozenset(("connection_id", "seq", "ts_ns", "direction", "method", "delivery_tag", "consumer_tag"))
SHARED_STRINGS = frozenset(("connection_id", "agent_id", "direction", "method", "exchange", "routing_key", "queue",
                            "consumer_tag", "reply_text", "failing_method"))
MAX_SHARED_STRINGS = 100_000
# What a delivery's row holds only to be copied into its Delivery record: the agent counts records
# by outcome, requeue, redelivered and latency, so the 100,000 outstanding deliveries it may hold
# need not carry them (the batch analysis, which writes the records, gets every column).
DELIVERING = frozenset(("basic.deliver", "basic.get-ok"))
RECORD_ONLY_DELIVERY_KEYS = frozenset(("exchange", "routing_key", "message_id", "message_identity", "x_death_count",
                                       "body_size", "delivery_mode"))  # the report keeps the first errors; the count goes on


class LiveDecoder:
    def __init__(self, *, source: str, agent_id: str, broker_ports, linktype: int,
                 max_frame: int = DEFAULT_MAX_FRAME, idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S,
                 clock=time.time_ns, keylog=None):
        if linktype not in SUPPORTED_LINKTYPES:
            raise ValueError(f"link type {linktype} is not supported")
        self.linktype = linktype
        self.rows = RowSink()
        self.counts: dict = {}          # method -> frames, plus "gaps": the core counts here
        self.errors: list[str] = []     # the core appends here; moved to kept_errors at each take
        self.kept_errors: list[str] = []  # the first MAX_ERRORS_KEPT, for the exit report
        self.error_count = 0
        self.flows = FlowTable(sink=self.rows, counts=self.counts, errors=self.errors, source=source,
                               agent_id=agent_id, broker_ports=broker_ports, max_frame=max_frame, keylog=keylog)
        self.idle_timeout_ns = int(idle_timeout_s * 1e9)
        self.clock = clock
        self.packets = 0
        self.bytes = 0
        self.flows_seen = 0
        self.unsupported: Counter = Counter()
        # amqps: connections seen, and those that will not be decrypted (no key, or it came too late)
        self.tls_connections = self.tls_not_decrypted = 0
        self._tls_counted: dict = {}  # connection -> counted as not decrypted yet
        self.ended: dict = {}           # connection -> wall time it ended (its row already handed over)
        self._held: list[dict] = []     # rows waiting for an earlier content row (see _ordered_for_timelines)
        self._ending: list = []         # the connections the last take ended
        self._strings: dict = {}

    # -- packets in --------------------------------------------------------------------------------

    def packets_in(self, batch: list[tuple[int, bytes]]) -> None:
        packet = self.flows.packet
        linktype = self.linktype
        number = self.packets
        for ts_ns, data in batch:
            number += 1
            self.bytes += len(data)
            try:
                segment = tcp_segment(linktype, data)
            except Exception as exc:  # a truncated header: the packet is lost, never the loop
                self._error(f"packet {number}: undecodable headers: {type(exc).__name__}: {exc}")
                continue
            if segment is not None:
                packet(number, ts_ns, segment)  # FlowTable guards each flow: a bad flow stops alone
        self.packets = number

    def _error(self, message: str) -> None:
        self.errors.append(message)

    # -- rows out ----------------------------------------------------------------------------------

    def take(self, *, end_all: bool = False) -> tuple[pa.Table | None, list[dict], list[dict], list[str]]:
        """(frame rows, rows for the state machine, connection rows of ended connections, ids of
        connections the state machine may end now). `end_all`: the capture stops, every
        connection ends (ended_by end-of-capture, as at the end of a file)."""
        now = self.clock()
        ending = []
        for conn in self.flows.connections:
            if conn in self.ended:
                continue
            if not conn.finished and (end_all or now - conn.ts_ns > self.idle_timeout_ns):
                conn.finish("end-of-capture" if end_all else "idle-timeout")
            if conn.tls is not None and not self._tls_settled(conn, now, end_all):
                continue  # ended, but its key may still come: its rows would come after its end
            if conn.finished:
                ending.append(conn)
        self._count_new_errors()
        frames = self.rows.take() if len(self.rows) else None
        connection_rows = []
        self.flows_seen += len(ending)
        for conn in ending:
            self.ended[conn] = now
            row = conn.connection_row()
            connection_rows.append(row)
            protocol = row["protocol"]
            if protocol not in ("amqp-0-9-1", "none", "tls"):  # as ingest counts them (TLS: tls_not_decrypted)
                self.unsupported[protocol] += 1
        timeline_rows = self._ordered_for_timelines(frames)
        ended_ids = [conn.id for conn in ending]
        self._ending = ending
        self._forget_lingering(now)
        return frames, timeline_rows, connection_rows, ended_ids

    def _tls_settled(self, conn, now: int, end_all: bool) -> bool:
        """Held records whose key has come are decrypted now, or the connection gives up past its
        bound (or as the capture stops). Counts the connection, and once it will not be decrypted.
        False while it still waits for its key."""
        if end_all:
            conn.tls.stop_waiting()
        conn.tls_retry(now)
        if conn not in self._tls_counted:
            self.tls_connections += 1
            self._tls_counted[conn] = False
        state = conn.tls.state
        if not self._tls_counted[conn] and (state == NOT_DECRYPTED or (conn.finished and state == HANDSHAKE_STATE)):
            self.tls_not_decrypted += 1
            self._tls_counted[conn] = True
        return not (conn.finished and state == WAITING)

    def _count_new_errors(self) -> None:
        # Counted exactly, kept only the first few: garbage on the port must not grow memory.
        self.error_count += len(self.errors)
        room = MAX_ERRORS_KEPT - len(self.kept_errors)
        if room > 0:
            self.kept_errors += self.errors[:room]
        del self.errors[:]  # in place: the flow table and its connections hold this list

    def _ordered_for_timelines(self, frames: pa.Table | None) -> list[dict]:
        """The state machine needs each connection's rows in seq order with none missing. A content
        method (publish, deliver) gets its seq when its method frame arrives but reaches the sink
        only when its body is complete, possibly after rows with higher seq: rows after a content
        row still pending on their connection are held back until it comes."""
        rows = self._held
        if frames is not None and frames.num_rows:
            rows += self._rows_of(frames)
        if not rows:
            return []
        barrier = {}
        for conn in self.flows.connections:
            if conn.content and not conn.finished:
                barrier[conn.id] = min(p.row[1] for p in conn.content.values())
        rows.sort(key=lambda row: (row["connection_id"], row["seq"]))
        if not barrier:
            self._held = []
            return rows
        ready, held = [], []
        for row in rows:
            limit = barrier.get(row["connection_id"])
            (held if limit is not None and row["seq"] > limit else ready).append(row)
        self._held = held
        return ready

    def _rows_of(self, frames: pa.Table) -> list[dict]:
        """The state machine's rows, made small: the machine keeps the row of every outstanding delivery
        and publish (100,000 of them must fit in the agent's memory budget). Null columns are left out
        (the machine reads them with .get) but for those it indexes; repeated strings (exchange,
        routing key, consumer tag, ...) share one object per distinct value."""
        names = INPUT_COLUMNS
        columns = []
        for name in names:
            values = frames[name].to_pylist()
            if name in SHARED_STRINGS:
                shared = self._strings
                if len(shared) > MAX_SHARED_STRINGS:
                    shared.clear()
                values = [shared.setdefault(v, v) if v is not None else None for v in values]
            columns.append(values)
        keep = ALWAYS_KEYS
        rows = [{k: v for k, v in zip(names, values) if v is not None or k in keep} for values in zip(*columns)]
        for row in rows:
            if row["method"] in DELIVERING:
                for key in RECORD_ONLY_DELIVERY_KEYS.intersection(row):
                    del row[key]
        return rows

    def _forget_lingering(self, now: int) -> None:
        """Drop ended connections from the flow table once their linger is over, and the row
        sink's per-connection constants with them. A flow key may already belong to a newer
        connection on the same ports (port reuse): only the gone connection's own entries go."""
        linger_ns = int(LINGER_S * 1e9)
        gone = {conn for conn, ended_at in self.ended.items() if now - ended_at > linger_ns}
        if not gone:
            return
        flows = self.flows
        for conn in gone:
            del self.ended[conn]
            self._tls_counted.pop(conn, None)
            for key in (conn.client_end + conn.server_end, conn.server_end + conn.client_end):
                entry = flows.flows.get(key)
                if entry is not None and entry[0] is conn:
                    del flows.flows[key]
            self.rows.forget_connection(conn.index)
            self._strings.pop(conn.id, None)  # its rows are gone: the id is never shared again
        flows.connections = [conn for conn in flows.connections if conn not in gone]
        flows.ignored.clear()  # flows off the broker ports: cheap to learn again

    def open_connections(self) -> int:
        return sum(1 for conn in self.flows.connections if not conn.finished)

    def connection_facts(self) -> dict[str, dict]:
        """Facts of the connections open and of those the last take ended (their last records are
        labelled by them), by id: what the metric labels are made of. Connections ended earlier and
        lingering are left out: the live state let them go when they ended, and handing them over
        again would keep them there for ever."""
        facts = {conn.id: conn.facts for conn in self.flows.connections if conn not in self.ended}
        facts.update((conn.id, conn.facts) for conn in self._ending)
        return facts

    def frames_by_method(self) -> dict:
        return {k: v for k, v in sorted(self.counts.items()) if k != "gaps"}

    def gaps(self) -> int:
        return self.counts.get("gaps", 0)


def connection_rows_table(rows: list[dict]) -> pa.Table:
    return connections_table(rows) if rows else schema.CONNECTIONS.empty_table()
