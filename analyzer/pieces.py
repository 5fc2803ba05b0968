"""A capture in pieces, decoded as one stream: Zeek's several `-r` files.

Long captures are written in pieces (dumpcap's ring buffer, tcpdump -C/-G, the agent's
`--pcap-out` rotation). `Capture` reads its files one after the other with one flow table, one
native lane and one row sink, so a TCP flow, its reassembly, its AMQP framing and its connection
identity go on across a file boundary: nothing is read twice and nothing is restarted.

The files follow each other when the next one starts no earlier than the last one ended and no
later than `continue_within_ns` after it. Otherwise the capture is *broken* there: every open flow
ends as at the end of a file (ended_by end-of-capture) and the next file starts afresh, with a note
saying why (an overlap: the same traffic may be in both; a time gap: the flows' packets in between
were never captured). A file missing from inside a flow within the bound shows as a TCP hole, a
capture gap, as a lost packet does.

At the end of the capture the open flows describe themselves as data (flow_state.py) before they
end as today: the lake keeps those states (flow_lake.py) for the next ingest of the same source,
and `provisional` holds the rows their ending made, which that ingest takes back if it continues them.
"""

from collections import Counter

from . import native
from .capture_file import CaptureFileError, read_packets
from .connection import TO_BROKER, AmqpConnection
from .flow_state import MAX_SNAPSHOT_BYTES, FlowStateError, dumps, loads
from .flows import FlowTable
from .packets import SUPPORTED_LINKTYPES, tcp_segment
from .rows import RowSink

BATCH_ROWS = 100_000
# A flow that ended this long before a piece's end is remembered as ended into the next piece: a
# segment on its ends there (data in flight at a reset, a segment sent again after the FINs) is a
# straggler, dropped as one capture drops it, not a connection starting mid-stream. Two minutes is
# TCP's longest retransmission timeout (Linux's TCP_RTO_MAX) and twice its TIME_WAIT.
STRAGGLERS_NS = 120 * 10**9


OVERLAP, GAP = "overlap", "gap"
# A capture on several cores can stamp a packet a few µs before the one it follows, and a ring
# may rotate between the two: no overlap of files, that.
REORDER_NS = 10_000_000


def apart(last_ts_ns: int, first_ts_ns: int, continue_within_ns: int) -> str | None:
    """Why a piece starting at `first_ts_ns` does not continue one that ended at `last_ts_ns`:
    OVERLAP (it starts before that end), GAP (more than `continue_within_ns` after it), else None."""
    if first_ts_ns < last_ts_ns - REORDER_NS:
        return OVERLAP
    if first_ts_ns - last_ts_ns > continue_within_ns:
        return GAP
    return None


# connection.start-ok (its SASL response) and connection.update-secret: frames that hold a secret.
SECRET_METHOD_IDS = (b"\x00\x0a\x00\x0b", b"\x00\x0a\x00\x46")


def may_hold_credentials(conn: AmqpConnection) -> bool:
    """Could the client's bytes a flow holds (a partial frame, segments out of order) be part of a
    frame that carries a secret? Then the flow is not saved: credentials are never stored. Held
    bytes of a frame begin at the frame, so its method id is among them once it could matter; out-
    of-order segments may be a frame's middle, so before the handshake's start-ok any are refused."""
    held = b"".join(conn.framers[TO_BROKER]._chunks)
    pending = conn.tcp[TO_BROKER].pending.values()
    if any(method in data for data in (held, *pending) for method in SECRET_METHOD_IDS):
        return True
    return bool(conn.tcp[TO_BROKER].pending) and conn.facts["started_at_syn"] and conn.facts.get("auth_mechanism") is None


# A flow silent this long at the end of a piece is taken for dead, its end never captured (a lost
# FIN), and not saved again and again. RabbitMQ closes a connection after two missed heartbeats:
# three intervals of silence, and no less than the agent's idle timeout (a capture missing a
# minute is no proof), or a day for a connection without heartbeats (0, or joined mid-stream).
DEAD_AFTER_MIN_NS = 600 * 10**9
DEAD_WITHOUT_HEARTBEATS_NS = 24 * 3600 * 10**9


def not_saved(conn: AmqpConnection, last_ts_ns: int) -> str | None:
    """Why an open flow is not saved at the end of a piece (None: it is)."""
    if may_hold_credentials(conn):
        return "the client's bytes it holds may be part of a credential exchange (never stored)"
    heartbeat = conn.facts.get("heartbeat")
    dead_after = max(3 * heartbeat * 10**9, DEAD_AFTER_MIN_NS) if heartbeat else DEAD_WITHOUT_HEARTBEATS_NS
    if last_ts_ns - conn.ts_ns > dead_after:
        return (f"silent for {seconds(last_ts_ns - conn.ts_ns)}, past {seconds(dead_after)} "
                f"({'three heartbeat intervals' if heartbeat else 'no heartbeats'}): taken for dead, its end not captured")
    return None


def first_packet_ts(path: str) -> int | None:
    """The first packet's timestamp (ns), None for a capture without packets. Raises CaptureFileError."""
    for _number, ts_ns, _linktype, _data in read_packets(path, read_size=1 << 16):
        return ts_ns
    return None


def seconds(ns: int) -> str:
    return f"{ns / 1e9:.3f} s"


class Capture:
    """Capture files in time order, decoded as one capture. `on_batch(arrow_table)` takes the frame
    rows in batches of schema.FRAMES; the files' reports are filled as they are read."""

    def __init__(self, on_batch, *, agent_id: str, broker_ports, max_frame: int, shard: tuple[int, int] = (0, 1),
                 tls_keylog=None):
        self.on_batch = on_batch
        self.agent_id, self.broker_ports, self.max_frame, self.shard = agent_id, broker_ports, max_frame, shard
        self.tls_keylog = tls_keylog  # tls.KeyLog: the secrets amqps flows are decrypted with, restored ones too
        self.rows = RowSink()
        self.counts: dict = {}
        self.errors: list[str] = []  # the flow tables' and connections' own list: reports take slices
        self.flows: FlowTable | None = None
        self.lane = None
        self.ended: list[AmqpConnection] = []  # connections of flow tables a break ended
        self.last_ts_ns: int | None = None
        self.last_file: str | None = None
        self.moved: dict = {}  # connections continued into the current file: where they were (_continue_in)

    # -- the stream ------------------------------------------------------------------------------------

    def _new_table(self, source: str) -> None:
        if self.flows is not None:
            self._take_back()
            self._unmoved()
            self.flows.finish()
            self.ended += self.flows.connections
            self._flush(force=True)  # the lane's rows, before its engine is replaced
        self.flows = FlowTable(sink=self.rows, counts=self.counts, errors=self.errors, source=source,
                               agent_id=self.agent_id, broker_ports=self.broker_ports, max_frame=self.max_frame,
                               shard=self.shard, keylog=self.tls_keylog)
        self.lane = native.lane_for(self.flows)

    def restore(self, flows: list[tuple[str, str]], ended: list[tuple], source: str, notes: list[str]) -> None:
        """Continue these saved flows ((connection id, JSON state), in the order every worker is
        given them) in `source`, after the flows that `ended` there (FlowTable.ended_flows). A state
        that fails a check is refused: that flow starts mid-stream when its packets come, as it
        would without one."""
        self._new_table(source)
        self.flows.remember_ended(ended)
        for k, (connection_id, text) in enumerate(flows):
            try:
                conn = AmqpConnection.restore(loads(text), sink=self.rows, counts=self.counts, errors=self.errors,
                                              max_frame=self.max_frame, keylog=self.tls_keylog)
            except FlowStateError as exc:
                notes.append(f"{source}: connection {connection_id}: its saved state was refused ({exc}); "
                             f"it starts again mid-stream")
                continue
            self.flows.adopt(conn, k % self.flows.shards)

    def follows(self, first_ts_ns: int | None, continue_within_ns: int) -> str | None:
        """None when a file starting at `first_ts_ns` continues what was read; else why not."""
        last = self.last_ts_ns
        if last is None or first_ts_ns is None:
            return None
        why = apart(last, first_ts_ns, continue_within_ns)
        if why == OVERLAP:
            return (f"it starts {seconds(last - first_ts_ns)} before {self.last_file} ends (overlapping files): "
                    f"read as a capture of its own, its flows not continued")
        if why == GAP:
            return (f"it starts {seconds(first_ts_ns - last)} after {self.last_file} ends, more than "
                    f"--continue-within {seconds(continue_within_ns)}: the flows open then ended there")
        return None

    def read(self, path: str, first_ts: int | None, report, continue_within_ns: int, progress=None) -> None:
        """Decode one file (its first packet at `first_ts`) after those read so far. Damage ends the
        file's read but keeps everything decoded before it; a failure inside one flow drops that flow only."""
        first_error = len(self.errors)
        counts_before = Counter(self.counts)
        if self.flows is None:
            self._new_table(path)
        else:
            why = self.follows(first_ts, continue_within_ns)
            if why is not None:
                report.notes.append(f"{path}: {why}")
                self._new_table(path)
            else:
                if self.last_file is not None:
                    report.notes.append(f"{path}: continues {self.last_file}")
                self._continue_in(path)
        self._decode(path, report, progress)
        self._take_back()
        report.errors += self.errors[first_error:]
        counts = Counter(self.counts)
        counts.subtract(counts_before)
        report.gaps = counts.pop("gaps", 0)
        report.frames_by_method.update({name: n for name, n in counts.items() if n})
        if report.last_ts_ns is not None:
            self.last_ts_ns, self.last_file = report.last_ts_ns, path

    def _continue_in(self, path: str) -> None:
        """The open flows go on in `path`. A flow that gets no packet of it still names the file it
        last had one in (`_unmoved`): the rows its ending makes point at packets of that file."""
        self._unmoved()
        self.moved = {conn: (conn.index, conn.source, conn.packet, conn.ts_ns)
                      for conn in self.flows.connections if not conn.finished}
        self.flows.continue_in(path)

    def _unmoved(self) -> None:
        for conn, (index, source, packet, ts_ns) in self.moved.items():
            if not conn.finished and conn.packet == packet and conn.ts_ns == ts_ns:
                conn.index, conn.source = index, source
        self.moved = {}

    def _decode(self, path: str, report, progress) -> None:
        flows, lane = self.flows, self.lane
        deliver = lane.packet if lane is not None else flows.packet
        seen_linktypes: set[int] = set()
        packets = 0
        last_ts = None
        captured_bytes = 0  # packet bytes read so far: the progress bar's measure of how far into the file
        try:
            for number, ts_ns, linktype, data in read_packets(path, lane):
                packets, last_ts = number, ts_ns
                if linktype is None:  # packets up to `number` taken by the native lane; `data` is their size
                    captured_bytes += data
                else:
                    captured_bytes += len(data)
                    if linktype not in seen_linktypes:
                        seen_linktypes.add(linktype)
                        if linktype not in SUPPORTED_LINKTYPES:
                            self.errors.append(f"{path}: packet {number}: link type {linktype} is not "
                                               f"supported; its packets are skipped")
                    segment = tcp_segment(linktype, data)
                    if segment is not None:
                        deliver(number, ts_ns, segment)
                if not number & 0x3FF:  # the lane stops at every multiple of 1024 packets too
                    self._flush()
                    if progress is not None and not number & 0x3FFF:
                        progress(number, captured_bytes)
        except CaptureFileError as exc:
            self.errors.append(str(exc))
            report.damaged = exc.damaged
            report.unreadable = not exc.damaged
        report.packets = packets
        report.last_ts_ns = last_ts

    def _flush(self, force: bool = False) -> None:
        if len(self.rows) >= (1 if force else BATCH_ROWS):
            self.on_batch(self.rows.take())

    def _take_back(self) -> None:
        """Every connection back from the native lane: to be continued in another file, saved or ended."""
        if self.lane is not None:
            self.lane.next_file()

    # -- the end -----------------------------------------------------------------------------------------

    def close(self, notes: list[str]) -> tuple[list[dict], list[tuple[str, str]], object, set[str], list[tuple]]:
        """End the capture: (every connection's row, the open flows' saved states as (connection id,
        JSON), the frame rows their ending made (an Arrow table, or None), the ids of the saved
        connections (their rows are provisional: the next piece takes them back), the flows that
        ended within STRAGGLERS_NS of its end). Open flows end as at the end of any capture, after
        their state was taken; a flow that cannot be saved ends for good, its rows final."""
        if self.flows is None:
            return [], [], None, set(), []
        self._take_back()
        self._unmoved()
        self._flush(force=True)
        last_ts_ns = self.last_ts_ns if self.last_ts_ns is not None else 0
        ended = self.flows.ended_flows(last_ts_ns - STRAGGLERS_NS)
        saved, still_open = [], set()
        for conn in self.flows.connections:
            if conn.finished:
                continue
            why, text = not_saved(conn, last_ts_ns), None
            if why is None:
                text = dumps(conn.snapshot())
                if len(text) > MAX_SNAPSHOT_BYTES:
                    why = f"its state ({len(text):,} bytes) is larger than a saved flow may be"
            if why is not None:
                notes.append(f"connection {conn.id}: not saved, {why}; it ends here")
                conn.finish()
                continue
            saved.append((conn.id, text))
            still_open.add(conn.id)
        self._flush(force=True)  # the rows of the flows that end for good are final, not provisional
        self.flows.finish()
        provisional = self.rows.take() if len(self.rows) else None
        connections = self.ended + self.flows.connections
        return [conn.connection_row() for conn in connections], saved, provisional, still_open, ended
