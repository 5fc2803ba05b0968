"""The flow table: TCP segments in, routed to the AMQP connection they belong to.

Sans-IO. Flows on the broker ports are decoded (through TLS when they open with a ClientHello), or
reported unsupported when they speak another protocol (AMQP 1.0, the stream protocol). Flows on
other ports are decoded only when they open with the AMQP 0-9-1 protocol header, or with a
ClientHello when a TLS key log was given; everything else is ignored, cheaply.
"""

from .connection import TO_BROKER, TO_CLIENT, AmqpConnection
from .packets import TCP_ACK, TCP_SYN, Segment
from .rows import RowSink
from .spec import DEFAULT_BROKER_PORTS, DEFAULT_MAX_FRAME, PROTOCOL_HEADER_091
from .tls import KeyLog, looks_like_client_hello


class FlowTable:
    def __init__(self, *, sink: RowSink, counts: dict, errors: list, source: str, agent_id: str = "",
                 broker_ports=DEFAULT_BROKER_PORTS, max_frame: int = DEFAULT_MAX_FRAME,
                 shard: tuple[int, int] = (0, 1), keylog: KeyLog | None = None):
        self.sink, self.counts, self.errors = sink, counts, errors
        self.source, self.agent_id = source, agent_id
        self.broker_ports = frozenset(broker_ports)
        self.max_frame = max_frame
        self.keylog = keylog  # TLS secrets by client random (tls/keylog.py); None: TLS is not decrypted
        # With several workers reading the same file, each decodes every shards-th flow in order of
        # first appearance: the same deal in every process, and two busy flows land on two workers.
        self.shard, self.shards = shard
        self.flow_owner: dict[tuple, int] = {}
        self.flows: dict[tuple, tuple[AmqpConnection, int]] = {}
        self.ignored: set[tuple] = set()
        self.connections: list[AmqpConnection] = []
        # Flows that ended in the capture's previous piece (pieces.py): client + server -> (client,
        # server, last_ts_ns). Their stragglers are dropped, as the rest of one capture drops them.
        self.ended_earlier: dict[tuple, tuple] = {}

    def packet(self, packet_no: int, ts_ns: int, seg: Segment) -> None:
        key = (seg.src, seg.sport, seg.dst, seg.dport)
        entry = self.flows.get(key)
        if entry is not None:
            conn, direction = entry
            if seg.flags & TCP_SYN and not seg.flags & TCP_ACK and self._is_new_connection(conn, seg):
                conn.finish("port-reused")
            elif conn.finished:
                return  # stragglers after a reset
            else:
                self._deliver(conn, direction, seg, ts_ns, packet_no)
                return
        elif key in self.ignored:
            return
        elif self.ended_earlier and (key in self.ended_earlier or key[2:] + key[:2] in self.ended_earlier) and not (
                seg.flags & TCP_SYN and not seg.flags & TCP_ACK):
            return  # stragglers after the end of a flow that ended in the previous piece
        if self.shards > 1 and self._owner(seg) != self.shard:
            self.ignored.add(key)
            return
        conn, direction = self._open(key, seg, ts_ns)
        if conn is not None:
            self._deliver(conn, direction, seg, ts_ns, packet_no)

    def _deliver(self, conn: AmqpConnection, direction: int, seg: Segment, ts_ns: int, packet_no: int) -> None:
        self._guarded(conn, packet_no, conn.segment, direction, seg, ts_ns, packet_no)

    def resume(self, conn: AmqpConnection, direction: int, rest: bytes, packet_no: int, wire: bytes | None = None) -> None:
        """The rest of a packet's stream bytes, from where the native lane stopped (native.py)."""
        self._guarded(conn, packet_no, conn.resume, direction, rest, wire)

    def _guarded(self, conn: AmqpConnection, packet_no: int, step, *args) -> None:
        try:
            step(*args)
            if conn.tcp[0].fin_seq is not None and conn.tcp[1].fin_seq is not None:
                conn.finish("tcp.fin")
        except Exception as exc:  # a bug or an input we did not foresee: lose this flow, never the others
            self.errors.append(f"{self.source}: packet {packet_no}: connection {conn.id}: "
                               f"decoding stopped: {type(exc).__name__}: {exc}")
            conn.facts["ended_by"] = "decoder-error"
            conn.finished = True

    def _owner(self, seg: Segment) -> int:
        a, b = (seg.src, seg.sport), (seg.dst, seg.dport)
        flow = (a, b) if a < b else (b, a)
        owner = self.flow_owner.get(flow)
        if owner is None:
            owner = self.flow_owner[flow] = len(self.flow_owner) % self.shards
        return owner

    def finish(self) -> None:
        for conn in self.connections:
            conn.finish()

    def _tls_opening(self, payload: bytes) -> bool:
        """A ClientHello off the broker ports is taken for amqps only when there are keys to read it with."""
        return self.keylog is not None and looks_like_client_hello(payload)

    # -- a capture in pieces (pieces.py) ---------------------------------------------------------------

    def continue_in(self, source: str) -> None:
        """The capture goes on in another file: the open connections' rows name it from here on."""
        self.source = source
        for conn in self.connections:
            if not conn.finished:
                conn.continue_in(source)

    def adopt(self, conn: AmqpConnection, owner: int) -> None:
        """A connection restored from its saved state (flow_state.py), decoded by worker `owner` of
        the shards (every worker is given the restored flows in one order, and deals them alike)."""
        a, b = conn.client_end, conn.server_end
        self.flow_owner[(a, b) if a < b else (b, a)] = owner
        if owner != self.shard:
            self.ignored.update((a + b, b + a))
            return
        self.connections.append(conn)
        self.flows[a + b] = (conn, TO_BROKER)
        self.flows[b + a] = (conn, TO_CLIENT)

    def remember_ended(self, ended: list[tuple]) -> None:
        """Flows that ended in the previous piece, as `ended_flows` gave them."""
        for client, server, last_ts_ns in ended:
            self.ended_earlier[client + server] = (client, server, last_ts_ns)

    def ended_flows(self, since_ns: int) -> list[tuple]:
        """The flows whose last connection has ended, last seen at `since_ns` or later, as
        (client, server, last_ts_ns): a segment on their ends after this piece is a straggler
        unless it opens a new connection."""
        ended = {key: flow for key, flow in self.ended_earlier.items() if key not in self.flows}
        for conn in self.connections:
            key = conn.client_end + conn.server_end
            if conn.finished and self.flows.get(key, (None,))[0] is conn:
                ended[key] = (conn.client_end, conn.server_end, conn.ts_ns)
        return sorted(flow for flow in ended.values() if flow[2] >= since_ns)

    @staticmethod
    def _is_new_connection(conn: AmqpConnection, seg: Segment) -> bool:
        """A SYN on a known flow is a new connection unless it is the same SYN sent again."""
        return conn.finished or conn.tcp[TO_BROKER].isn != seg.seq

    def _open(self, key: tuple, seg: Segment, ts_ns: int) -> tuple[AmqpConnection | None, int]:
        flags = seg.flags
        syn = bool(flags & TCP_SYN)
        if syn and not flags & TCP_ACK:
            from_client = True
        elif syn:
            from_client = False
        elif seg.dport in self.broker_ports and seg.sport not in self.broker_ports:
            from_client = True
        elif seg.sport in self.broker_ports:
            from_client = False
        elif seg.payload.startswith(PROTOCOL_HEADER_091) or self._tls_opening(seg.payload):
            from_client, syn = True, True  # an AMQP (or amqps) stream's opening bytes: as good as its SYN
        else:
            if seg.payload:
                self.ignored.add(key)
            return None, 0
        if from_client:
            client, server = (seg.src, seg.sport), (seg.dst, seg.dport)
        else:
            client, server = (seg.dst, seg.dport), (seg.src, seg.sport)
        if server[1] not in self.broker_ports and not (
                syn and (seg.payload.startswith(PROTOCOL_HEADER_091) or self._tls_opening(seg.payload))):
            if syn:
                return None, 0  # a handshake on another port: wait for its first bytes
            self.ignored.add(key)
            return None, 0
        if not syn and not seg.payload:
            # Nothing to decode on a flow the capture joined late: wait for its first bytes. Often
            # it is the last ACK, FIN or RST of a connection that ended before the capture began,
            # which would otherwise be a connection row of no protocol.
            return None, 0
        conn = AmqpConnection(client=client, server=server, first_ts_ns=ts_ns, started_at_syn=syn,
                              sink=self.sink, counts=self.counts, errors=self.errors, source=self.source,
                              agent_id=self.agent_id, max_frame=self.max_frame, keylog=self.keylog)
        self.connections.append(conn)
        self.flows[client + server] = (conn, TO_BROKER)
        self.flows[server + client] = (conn, TO_CLIENT)
        return conn, TO_BROKER if from_client else TO_CLIENT
