"""One AMQP connection (one TCP flow): segments in, frame-event rows out.

Sans-IO. The connection owns both directions' reassembly and framing, assembles content
(method + header + body frames) into one event, keeps the connection-level facts (client and
broker identity, negotiated limits, how it ended) and appends one row per method frame, plus
pseudo-rows for heartbeats, capture gaps and TCP ends, to the `rows.RowSink` it was given:
tuples in the sink's fixed layouts for the hot methods, dicts keyed by `schema.FRAMES` column
names for the rest.
"""

import functools
import hashlib
import ipaddress
from struct import Struct

from pamqp import decode as pamqp_decode

from . import spec
from .spec import FRAME_BODY, FRAME_HEADER, FRAME_METHOD
from .flow_state import FORMAT_VERSION, Fields, check_value, encode_bytes
from .framing import HUNT, START, FrameReader, FramingError, ProtocolHeader, Synchronised, Unsupported
from .methods import (ACK_DECODERS, CONTENT_DECODERS, DecodeMemo, MalformedFrame, decode_method,
                      delivery_tag_offset, to_json)
from .runs import MessageRun, MessageShape
from .reassembly import Gap, TcpDirection
from .methods import NO_PROPERTIES
from .schema import CONNECTION_TIMESTAMPS, CONNECTIONS, FRAMES
from .rows import DIRECTION_NAMES, LANE_CONTENT_METHODS as CONTENT_METHODS, PREFIX, PROPERTY_FIELDS, SHARED_METHOD_FIELDS, RowSink
from .tls import KeyLog, TlsLayer, looks_like_client_hello, looks_like_tls_records

TO_BROKER, TO_CLIENT = 0, 1
CONNECTION_FIELDS = [n for n in CONNECTIONS.names if n not in CONNECTION_TIMESTAMPS and n != "date"]
# Positions in a content row tuple (rows.CONTENT_LAYOUT) and in its shared method fields.
SHARED = len(PREFIX) + 1
EXCHANGE = SHARED_METHOD_FIELDS.index("exchange")
ROUTING_KEY = SHARED_METHOD_FIELDS.index("routing_key")
MESSAGE_ID = PROPERTY_FIELDS.index("message_id")
_METHOD_ID = Struct("!I")
MAX_SHAPES = 16  # message shapes remembered per direction; a stream with more starts over
MAX_MEMO_BODY = 4096  # a shape remembers its last body (to skip hashing it again) up to this size
MAX_KEPT_BODY = 1 << 20  # body bytes of an unfinished message kept for the flow's snapshot (flow_state.py)


def address_text(raw: bytes) -> str:
    return str(ipaddress.ip_address(raw))


def message_identity(message_id: str | None, exchange: str | None, routing_key: str | None, body_hash: str | None) -> str | None:
    """DESIGN.md: a message's identity is its message_id when set, else a hash of body, exchange and routing key."""
    return message_identities(message_id, exchange, routing_key, (body_hash,))[0]


def message_identities(message_id: str | None, exchange: str | None, routing_key: str | None,
                       body_hashes) -> list[str | None]:
    """`message_identity` of messages that share their message_id (or its absence), exchange and
    routing key, as runs of messages do (runs.py): the routing is hashed once for all of them."""
    if message_id:
        return ["id:" + message_id] * len(body_hashes)
    fed = _routing_hasher(exchange, routing_key).copy
    identities = []
    for body_hash in body_hashes:
        if body_hash is None:
            identities.append(None)
        else:
            hasher = fed()
            hasher.update(body_hash.encode())
            identities.append("h:" + hasher.hexdigest())
    return identities


def body_digests(body: bytes, shared: tuple, properties: tuple) -> tuple[str, str | None]:
    """(body hash, message identity) of a complete message, from its body, shared method fields and
    properties: what `_emit_content` computes, for the native lane (native.py)."""
    body_hash = hashlib.blake2b(body, digest_size=16).hexdigest()
    return body_hash, message_identity(properties[MESSAGE_ID], shared[EXCHANGE], shared[ROUTING_KEY], body_hash)


def incomplete_identity(properties: tuple) -> str | None:
    """The identity of a message cut short: its message_id, if it has one (no body, no hash)."""
    message_id = properties[MESSAGE_ID]
    return "id:" + message_id if message_id else None


@functools.lru_cache(maxsize=1024)
def _routing_hasher(exchange: str | None, routing_key: str | None):
    """The identity hash already fed with `exchange \0 routing_key \0`: a stream repeats its routing, and
    copying a fed hasher costs half of hashing the key again for every message."""
    return hashlib.blake2b(f"{exchange or ''}\x00{routing_key or ''}\x00".encode(), digest_size=16)


class PendingContent:
    """A content-carrying method (its row so far, as a tuple) waiting for its header and body frames."""
    __slots__ = ("row", "body_size", "received", "hasher", "properties", "body")

    def __init__(self, row: tuple):
        self.row = row
        self.body_size = 0
        self.received = 0
        self.hasher = hashlib.blake2b(digest_size=16)
        self.properties: tuple | None = None  # set when the content header arrives
        # The body so far, for a snapshot of the flow (a hasher's state cannot be saved): None once
        # past MAX_KEPT_BODY, and a flow saved then finishes this message as incomplete.
        self.body: list | None = []

    def add_body(self, payload: bytes) -> None:
        self.hasher.update(payload)
        self.received += len(payload)
        if self.body is not None:
            if self.received <= MAX_KEPT_BODY:
                self.body.append(payload)
            else:
                self.body = None


class AmqpConnection:
    def __init__(self, *, client: tuple[bytes, int], server: tuple[bytes, int], first_ts_ns: int,
                 started_at_syn: bool, sink: RowSink, counts: dict, errors: list, source: str,
                 agent_id: str, max_frame: int, keylog: KeyLog | None = None):
        client_addr, server_addr = address_text(client[0]), address_text(server[0])
        self.id = f"{client_addr}:{client[1]}>{server_addr}:{server[1]}@{first_ts_ns}"
        self.client_end, self.server_end = client, server  # (raw address, port): the flow keys
        self.sink, self.counts, self.errors = sink, counts, errors
        self.source = source
        # Columns every row of this connection shares are stored once in the sink, by index.
        self.index = sink.add_connection((self.id, agent_id, source, client_addr, client[1], server_addr, server[1]))
        self.tcp = (TcpDirection(), TcpDirection())
        self.framers = (FrameReader(True, started_at_syn, max_frame), FrameReader(False, started_at_syn, max_frame))
        # Between the two: TLS, when the client opens with a ClientHello (helpers/FLOW_STATE.md).
        self.keylog = keylog
        self.tls: TlsLayer | None = None
        self.content: dict[tuple[int, int], PendingContent] = {}
        self.memo = DecodeMemo()
        self.shapes: tuple[dict, dict] = ({}, {})  # per direction: message shapes seen (runs.py)
        self.seq = 0
        self.ts_ns = first_ts_ns
        self.packet = 0
        self.facts = {
            "connection_id": self.id, "agent_id": agent_id, "source": source,
            "client_addr": client_addr, "client_port": client[1], "server_addr": server_addr,
            "server_port": server[1], "ip_version": 4 if len(client[0]) == 4 else 6,
            "first_ts_ns": first_ts_ns, "last_ts_ns": first_ts_ns, "started_at_syn": started_at_syn,
            "protocol": None, "frames_to_broker": 0, "frames_to_client": 0, "bytes_to_broker": 0,
            "bytes_to_client": 0, "heartbeats": 0, "gaps": 0, "gap_bytes": 0, "retransmitted_bytes": 0,
            "framing_errors": 0, "ended_by": None,
        }
        self.finished = False

    # -- TCP --------------------------------------------------------------------------------------

    def segment(self, direction: int, seg, ts_ns: int, packet: int) -> None:
        self.ts_ns, self.packet = ts_ns, packet
        flags = seg.flags
        if seg.payload or seg.missing or flags & 0x03:  # data, SYN or FIN
            items = self.tcp[direction].segment(seg.seq, seg.payload, flags & 0x02, flags & 0x01, seg.missing)
            if items:
                self._stream(direction, items)
        if flags & 0x10:  # ACK: the peer has everything before seg.ack; what we never saw is a gap
            other = self.tcp[1 - direction]
            if other.next_seq is not None and other.next_seq != seg.ack:
                items = other.acked(seg.ack)
                if items:
                    self._stream(1 - direction, items)
        if flags & 0x04:
            self._pseudo(direction, spec.TCP_RST)
            self.finish("tcp.rst")
        elif flags & 0x01:
            self._pseudo(direction, spec.TCP_FIN)

    def resume(self, direction: int, rest: bytes, wire: bytes | None = None) -> None:
        """Go on with stream bytes the native lane stopped at (native.py): from a frame boundary, the
        rest of what reassembly delivered, already counted in bytes_to_* by the lane. Inside TLS
        (`wire` not None): `rest` is the rest of the plaintext of the record the lane stopped in, and
        `wire` the stream bytes after that record (or from the record it stopped before)."""
        facts = self.facts
        key = "bytes_to_broker" if direction == TO_BROKER else "bytes_to_client"
        if wire is None:
            facts[key] -= len(rest)
            self._stream(direction, [rest])
            return
        if rest:
            self._frames(direction, [rest], False)
        if wire:
            facts[key] -= len(wire)
            self._stream(direction, [wire])

    def continue_in(self, source: str) -> None:
        """The capture goes on in another file (pieces.py): rows from here on name it as their source.
        Rows already waiting (pending content) keep the key of the file their method came in."""
        self.source = source
        constants = self.sink.connections[self.index]
        self.index = self.sink.add_connection(constants[:2] + (source,) + constants[3:])

    def finish(self, ended_by: str = "end-of-capture") -> None:
        """The flow is over: deliver what reassembly still holds, and close out unfinished content."""
        if self.finished:
            return
        for direction in (TO_BROKER, TO_CLIENT):
            items = self.tcp[direction].finish()
            if items:
                self._stream(direction, items)
        for key in list(self.content):
            self._emit_content(key, complete=False)
        if self.facts["ended_by"] is None:
            self.facts["ended_by"] = ended_by
        self.facts["retransmitted_bytes"] = self.tcp[0].retransmitted_bytes + self.tcp[1].retransmitted_bytes
        self.facts["last_ts_ns"] = self.ts_ns
        self.finished = True

    def _stream(self, direction: int, items: list) -> None:
        """Stream items (bytes, reassembly.Gap) of one direction, as reassembly delivers them."""
        if self.tls is None and (self.framers[direction].offset or not self._tls_begins(direction, items)):
            self._frames(direction, items, True)
        else:
            self._through_tls(direction, items)

    def _tls_begins(self, direction: int, items: list) -> bool:
        """Is this a TLS flow? Asked of a direction's first bytes only: a client's ClientHello, or
        TLS records where a capture joined a connection after its handshake."""
        first, state = items[0], self.framers[direction].state
        if first.__class__ is not bytes:
            return False
        if direction == TO_BROKER and state == START and looks_like_client_hello(first):
            self.tls = TlsLayer(self.keylog)
        elif state == HUNT and not self.framers[direction].synced_once and looks_like_tls_records(first):
            self.tls = TlsLayer.joined_late(self.keylog)
        else:
            return False
        self.facts["protocol"] = "tls"  # until the plaintext shows the AMQP protocol header
        return True

    def _through_tls(self, direction: int, items: list) -> None:
        """The wire bytes and gaps are counted here; the TLS layer's plaintext and gaps go to framing."""
        facts = self.facts
        for item in items:
            if item.__class__ is bytes:
                facts["bytes_to_broker" if direction == TO_BROKER else "bytes_to_client"] += len(item)
            else:
                self._count_gap(item)
        plain = self.tls.feed(direction, items, self.ts_ns, self.packet)
        if self.tls.replay:
            self._replay_held()
        if plain:
            self._frames(direction, plain, False)

    def _replay_held(self) -> None:
        """Plaintext of records held until their key arrived, at the time and packet they came in."""
        ts_ns, packet = self.ts_ns, self.packet
        replay, self.tls.replay = self.tls.replay, []
        for direction, self.ts_ns, self.packet, plain in replay:
            self._frames(direction, plain, False)
        self.ts_ns, self.packet = ts_ns, packet

    def tls_retry(self, ts_ns: int) -> None:
        """Live: a connection holding records for its key looks again (the key log grew), or gives up
        past its bound."""
        if self.tls is not None:
            self.tls.retry(ts_ns)
            if self.tls.replay:
                self._replay_held()
                if self.finished:  # the flow ended while its records waited: close out what they opened
                    for key in list(self.content):
                        self._emit_content(key, complete=False)

    def _frames(self, direction: int, items: list, wire: bool) -> None:
        """AMQP framing of a direction's stream: the wire's (`wire`), or the plaintext of its TLS."""
        framer = self.framers[direction]
        counts, content = self.counts, self.content
        frames = headers = bodies = 0
        for item in items:
            if item.__class__ is bytes:
                if wire:
                    self.facts["bytes_to_broker" if direction == TO_BROKER else "bytes_to_client"] += len(item)
                found = framer.feed(item)
            else:
                self._gap(direction, item, wire)
                # A gap in TLS plaintext is of unknown size (records were lost whole or in part).
                found = framer.gap(item.nbytes, exact=wire)
            n = len(found)
            i = 0
            while i < n:
                frame = found[i]
                i += 1
                if frame.__class__ is not tuple:
                    if frame.__class__ is MessageRun:
                        k = self._message_run(direction, frame)
                        frames += 3 * k
                        headers += k
                        bodies += k
                    else:
                        self._stream_note(direction, frame)
                    continue
                frames += 1
                ftype, channel, payload = frame
                if ftype == FRAME_METHOD and i + 1 < n and self._whole_message(direction, channel, payload,
                                                                                found[i], found[i + 1]):
                    i += 2  # its header and body frame, taken with it
                    frames += 2
                    headers += 1
                    bodies += 1
                elif ftype == FRAME_BODY:  # the most frequent frame: handled inline
                    bodies += 1
                    pending = content.get((direction, channel))
                    if pending is not None and pending.properties is not None:
                        pending.add_body(payload)
                        if pending.received >= pending.body_size:
                            self._emit_content((direction, channel), complete=pending.received == pending.body_size)
                elif ftype == FRAME_METHOD:
                    self._method(direction, channel, payload)
                elif ftype == FRAME_HEADER:
                    headers += 1
                    self._content_header(direction, channel, payload)
                else:
                    self._count(spec.HEARTBEAT)
                    self.facts["heartbeats"] += 1
                    self._pseudo(direction, spec.HEARTBEAT, channel=channel)
        if headers:
            counts[spec.CONTENT_HEADER] = counts.get(spec.CONTENT_HEADER, 0) + headers
        if bodies:
            counts[spec.CONTENT_BODY] = counts.get(spec.CONTENT_BODY, 0) + bodies
        if frames:
            self.facts["frames_to_broker" if direction == TO_BROKER else "frames_to_client"] += frames

    def _gap(self, direction: int, gap: Gap, wire: bool = True) -> None:
        if wire:  # a TLS connection's gaps are counted on the wire, as they happen (_through_tls)
            self._count_gap(gap)
        # Content that was being assembled in this direction can no longer be completed.
        for key in [k for k in self.content if k[0] == direction]:
            self._emit_content(key, complete=False)
        self._pseudo(direction, spec.CAPTURE_GAP, {"gap_bytes": gap.nbytes, "detail": gap.reason})

    def _count_gap(self, gap: Gap) -> None:
        self.facts["gaps"] += 1
        self.facts["gap_bytes"] += gap.nbytes
        self.counts["gaps"] = self.counts.get("gaps", 0) + 1

    def _stream_note(self, direction: int, note) -> None:
        cls = note.__class__
        if cls is ProtocolHeader:
            if note.supported:
                self.facts["protocol"] = "amqp-0-9-1"
                self._pseudo(direction, spec.PROTOCOL_HEADER, {"detail": note.header.hex()})
        elif cls is Synchronised:
            if note.first and self.facts["protocol"] is None:
                self.facts["protocol"] = "amqp-0-9-1"
            if note.first:
                self._pseudo(direction, spec.CAPTURE_MIDSTREAM, {"gap_bytes": note.skipped})
        elif cls is Unsupported:
            if self.facts["protocol"] == "amqp-0-9-1":  # the broker refused the client's 0-9-1 header
                self.facts["ended_by"] = "protocol-version-rejected"
            else:
                self.facts["protocol"] = note.protocol
            for framer in self.framers:  # a foreign protocol on the port: nothing more to decode
                framer.state = "unsupported"
        elif cls is FramingError:
            self.facts["framing_errors"] += 1
            self._error(direction, f"framing error at stream offset {note.offset}: {note.reason}")

    def _error(self, direction: int, message: str) -> None:
        self.errors.append(f"{self.source}: packet {self.packet}: connection {self.id} "
                           f"{DIRECTION_NAMES[direction]}: {message}")

    # -- AMQP frames ------------------------------------------------------------------------------

    def _count(self, name: str) -> None:
        self.counts[name] = self.counts.get(name, 0) + 1

    def _method(self, direction: int, channel: int, payload: bytes) -> None:
        key = (direction, channel)
        if self.content and key in self.content:  # a new method before the last content finished: it is cut short
            self._emit_content(key, complete=False)
        mid = _METHOD_ID.unpack_from(payload)[0] if len(payload) >= 4 else 0
        ack = ACK_DECODERS.get(mid)
        content = ack is None and mid in CONTENT_DECODERS
        if ack is not None or content:
            try:
                fields = ack(payload) if ack is not None else self.memo.content_method(mid, payload)
            except Exception:  # malformed: the generic path names the problem
                fields = None
            if fields is not None:
                name = fields[0]
                self.counts[name] = self.counts.get(name, 0) + 1
                self.seq += 1
                row = (self.index, self.seq, self.ts_ns, direction, channel, name, self.packet) + fields[1:]
                if content:
                    self.content[key] = PendingContent(row)
                else:
                    self.sink.acks.append(row)
                return
        try:
            row, decoded = decode_method(payload)
        except MalformedFrame as exc:
            self._error(direction, f"channel {channel}: {exc}")
            row, decoded = {"method": spec.METHOD_NAMES.get(mid, "unknown"), "malformed": True}, None
        name = row["method"]
        self._count(name)
        if decoded is not None and name.startswith("connection."):
            self._connection_method(direction, name, decoded, row)
        self._add_dict_row(direction, channel, row)

    def _whole_message(self, direction: int, channel: int, payload: bytes, header, body) -> bool:
        """Fast path for the usual message: a content method, its header and its one body frame, all
        in this piece of the stream. Does what `_method`, `_content_header`, the body and
        `_emit_content` would do for it, without the PendingContent in between. Anything else
        (a frame missing or elsewhere, content still open on the channel, more than one body frame,
        bytes that do not decode) returns False before changing anything, for the general path."""
        if (header.__class__ is not tuple or body.__class__ is not tuple or header[0] != FRAME_HEADER
                or body[0] != FRAME_BODY or header[1] != channel or body[1] != channel
                or (self.content and (direction, channel) in self.content)):
            return False
        content = body[2]
        try:
            mid = _METHOD_ID.unpack_from(payload)[0]
            if mid not in CONTENT_DECODERS:
                return False
            name, tag, shared = self.memo.content_method(mid, payload)
            body_size, properties = self.memo.content_header(header[2])
        except Exception:  # malformed: the general path names the problem
            return False
        if body_size != len(content) or not body_size:
            return False
        counts = self.counts
        counts[name] = counts.get(name, 0) + 1
        self.seq += 1
        body_hash, identity = body_digests(content, shared, properties)
        self.sink.contents.append((
            self.index, self.seq, self.ts_ns, direction, channel, name, self.packet, tag, shared, body_size, True,
            properties, body_hash, identity))
        # The next messages are likely to look the same: let the framer cut them as a run (runs.py).
        self.framers[direction].shape = self._shape(direction, channel, mid, payload, header[2], body_size,
                                                     name, shared, properties)
        return True

    def _shape(self, direction: int, channel: int, mid: int, method: bytes, header: bytes, body_size: int,
               name: str, shared: tuple, properties: tuple) -> MessageShape:
        """The shape of a message just decoded whole, made once per distinct shape: a stream that
        alternates between a few shapes (routing keys, say) reuses them."""
        tag_at = delivery_tag_offset(mid, method)
        key = (channel, method[:tag_at] + method[tag_at + 8:] if tag_at else method, header)
        known = self.shapes[direction]
        shape = known.get(key)
        if shape is None:
            if len(known) >= MAX_SHAPES:
                known.clear()
            shape = known[key] = MessageShape(channel, method, tag_at, header, body_size, name, shared, properties)
        return shape

    def _message_run(self, direction: int, run: MessageRun) -> int:
        """Rows for a run of whole messages: what `_whole_message` does for each, in one go. Returns
        the number of messages."""
        shape = run.shape
        channel = shape.channel
        if self.content and (direction, channel) in self.content:  # what `_method` does for the first one
            self._emit_content((direction, channel), complete=False)
        bodies = run.bodies
        k = len(bodies)
        name = shape.name
        counts = self.counts
        counts[name] = counts.get(name, 0) + k
        shared, properties = shape.shared, shape.properties
        message_id, exchange, routing_key = properties[MESSAGE_ID], shared[EXCHANGE], shared[ROUTING_KEY]
        # The same body has the same hash and, in one shape, the same identity: streams that repeat
        # their body (load tests, heartbeat-like messages) need one hash per run, or per shape.
        last_body, last_hash, last_identity = shape.last_body, shape.last_hash, shape.last_identity
        if bodies.count(bodies[0]) == k:
            if bodies[0] != last_body:
                last_body = bodies[0]
                last_hash = hashlib.blake2b(last_body, digest_size=16).hexdigest()
                last_identity = message_identity(message_id, exchange, routing_key, last_hash)
            hashes, identities = [last_hash] * k, [last_identity] * k
        else:
            blake2b = hashlib.blake2b
            hashes = [blake2b(body, digest_size=16).hexdigest() for body in bodies]
            identities = message_identities(message_id, exchange, routing_key, hashes)
            last_body, last_hash, last_identity = bodies[-1], hashes[-1], identities[-1]
        if len(last_body) <= MAX_MEMO_BODY:  # a shape lives as long as its connection: keep it small
            shape.last_body, shape.last_hash, shape.last_identity = last_body, last_hash, last_identity
        tags = run.tags or (None,) * k
        first_seq = self.seq + 1
        self.seq += k
        if k == 1:
            self.sink.contents.append((
                self.index, first_seq, self.ts_ns, direction, channel, name, self.packet, tags[0], shared,
                shape.body_size, True, properties, last_hash, last_identity))
        else:
            self.sink.add_content_run(self.index, first_seq, self.ts_ns, direction, channel, name, self.packet,
                                      tags, shared, shape.body_size, properties, hashes, identities)
        return k

    def _content_header(self, direction: int, channel: int, payload: bytes) -> None:
        pending = self.content.get((direction, channel))
        if pending is None or pending.properties is not None:
            return  # content whose method the capture missed: counted, not attributable
        try:
            pending.body_size, pending.properties = self.memo.content_header(payload)
        except MalformedFrame as exc:
            self._error(direction, f"channel {channel}: {exc}")
            self._emit_content((direction, channel), complete=False)
            return
        if pending.body_size == 0:
            self._emit_content((direction, channel), complete=True)

    def _emit_content(self, key: tuple[int, int], complete: bool) -> None:
        pending = self.content.pop(key)
        properties = pending.properties or NO_PROPERTIES
        if complete:
            body_hash = pending.hasher.hexdigest()
            shared = pending.row[SHARED]
            identity = message_identity(properties[MESSAGE_ID], shared[EXCHANGE], shared[ROUTING_KEY], body_hash)
        else:
            body_hash, identity = None, incomplete_identity(properties)
        body_size = pending.body_size if pending.properties is not None else None
        self.sink.contents.append(pending.row + (body_size, complete, properties, body_hash, identity))

    def _pseudo(self, direction: int, name: str, extra: dict | None = None, channel: int = 0) -> None:
        if self.facts["protocol"] != "amqp-0-9-1":
            return  # the frames table is about AMQP 0-9-1 connections only
        row = {"method": name}
        if extra:
            row.update(extra)
        self._add_dict_row(direction, channel, row)

    def _add_dict_row(self, direction: int, channel: int, row: dict) -> None:
        self.seq += 1
        row.update(conn=self.index, seq=self.seq, ts_ns=self.ts_ns, direction=direction, channel=channel,
                   source_packet=self.packet)
        self.sink.others.append(row)

    # -- connection facts -------------------------------------------------------------------------

    def _connection_method(self, direction: int, name: str, decoded, row: dict) -> None:
        facts = self.facts
        if name == "connection.start":
            props = decoded.server_properties or {}
            facts["server_product"] = _text(props.get("product"))
            facts["server_version"] = _text(props.get("version"))
            facts["server_platform"] = _text(props.get("platform"))
            facts["cluster_name"] = _text(props.get("cluster_name"))
            facts["auth_mechanisms_offered"] = _text(decoded.mechanisms)
        elif name == "connection.start-ok":
            props = decoded.client_properties or {}
            facts["client_product"] = _text(props.get("product"))
            facts["client_version"] = _text(props.get("version"))
            facts["client_platform"] = _text(props.get("platform"))
            facts["connection_name"] = _text(props.get("connection_name"))
            facts["client_capabilities"] = to_json(props.get("capabilities") or {})
            facts["auth_mechanism"] = _text(decoded.mechanism)
            facts["user"] = sasl_user(decoded.mechanism, decoded.response)
            decoded.response = None  # the password goes no further than this line
        elif name == "connection.tune":
            facts["offered_channel_max"] = decoded.channel_max
            facts["offered_frame_max"] = decoded.frame_max
            facts["offered_heartbeat"] = decoded.heartbeat
        elif name == "connection.tune-ok":
            facts["channel_max"] = decoded.channel_max
            facts["frame_max"] = decoded.frame_max
            facts["heartbeat"] = decoded.heartbeat
            for framer in self.framers:
                framer.set_frame_max(decoded.frame_max)
        elif name == "connection.open":
            facts["vhost"] = _text(decoded.virtual_host)
        elif name == "connection.close":
            facts["close_code"] = decoded.reply_code
            facts["close_text"] = _text(decoded.reply_text)
            facts["closed_by"] = "client" if direction == TO_BROKER else "broker"
            facts["ended_by"] = "connection.close"

    # -- state as data (flow_state.py) --------------------------------------------------------------

    def snapshot(self) -> dict:
        """The open flow between two packets, as plain data (helpers/FLOW_STATE.md). The native
        lane must have handed the connection back first (native.NativeLane.finish)."""
        return {
            "version": FORMAT_VERSION, "id": self.id, "rows_source": self.source,
            "client": [address_text(self.client_end[0]), self.client_end[1]],
            "server": [address_text(self.server_end[0]), self.server_end[1]],
            "first_ts_ns": self.facts["first_ts_ns"], "started_at_syn": self.facts["started_at_syn"],
            "facts": dict(self.facts), "seq": self.seq, "ts_ns": self.ts_ns, "packet": self.packet,
            "content": [self._pending_snapshot(key, pending) for key, pending in self.content.items()],
            "tcp": [tcp.snapshot() for tcp in self.tcp], "framers": [framer.snapshot() for framer in self.framers],
            "tls": self.tls.snapshot() if self.tls is not None else None,
        }

    def _pending_snapshot(self, key: tuple[int, int], pending: PendingContent) -> dict:
        index, seq, ts_ns, direction, channel, name, packet, tag, shared = pending.row
        return {"direction": direction, "channel": channel, "seq": seq, "ts_ns": ts_ns, "method": name,
                "source": self.sink.connections[index][2], "packet": packet, "delivery_tag": tag,
                "shared": list(shared), "body_size": pending.body_size,
                "properties": None if pending.properties is None else list(pending.properties),
                "body": None if pending.body is None else encode_bytes(b"".join(pending.body))}

    @classmethod
    def restore(cls, doc, *, sink: RowSink, counts: dict, errors: list, max_frame: int,
                keylog: KeyLog | None = None) -> "AmqpConnection":
        """The flow `snapshot()` described, with a fresh key in `sink`; its rows name the file they
        named when it was saved until `continue_in` names the next. Raises flow_state.FlowStateError
        naming the first field that fails a check."""
        f = Fields(doc, "connection")
        f.int("version", FORMAT_VERSION, FORMAT_VERSION)
        source = f.str("rows_source")
        ends = [f.end("client"), f.end("server")]
        facts_in = f.obj("facts")
        facts = {}
        for name, value in facts_in.doc.items():
            if name not in CONNECTIONS.names or name in CONNECTION_TIMESTAMPS or name == "date":
                facts_in.fail(name, "not a connection fact")
            facts[name] = check_value(value, CONNECTIONS.field(name).type, f"connection.facts.{name}")
        conn = cls(client=ends[0], server=ends[1], first_ts_ns=f.int("first_ts_ns"),
                   started_at_syn=f.bool("started_at_syn"), sink=sink, counts=counts, errors=errors, source=source,
                   agent_id=facts.get("agent_id") or "", max_frame=max_frame, keylog=keylog)
        if f.str("id") != conn.id:
            f.fail("id", "not the id of these ends and first timestamp")
        missing = set(conn.facts) - set(facts)
        if missing:
            facts_in.fail(sorted(missing)[0], "missing")
        conn.facts = facts
        conn.seq, conn.ts_ns, conn.packet = f.int("seq"), f.int("ts_ns"), f.int("packet")
        conn.tcp = tuple(TcpDirection.restore(d, f"connection.tcp[{i}]")
                         for i, d in enumerate(f.list("tcp", 2, length=2)))
        conn.framers = tuple(FrameReader.restore(d, f"connection.framers[{i}]")
                             for i, d in enumerate(f.list("framers", 2, length=2)))
        if [framer.from_client for framer in conn.framers] != [True, False]:
            f.fail("framers", "not the client's reader then the broker's")
        if f.raw("tls") is not None:  # its keys derived again from the key log, never saved
            conn.tls = TlsLayer.restore(f.raw("tls"), keylog)
        for i, item in enumerate(f.list("content", 2 * 65536)):
            key, pending = conn._restored_pending(Fields(item, f"connection.content[{i}]"))
            if key in conn.content:
                f.fail("content", f"two messages pending on direction {key[0]} channel {key[1]}")
            conn.content[key] = pending
            if pending.body is None:
                conn._emit_content(key, complete=False)
        return conn

    def _restored_pending(self, f: Fields) -> tuple[tuple[int, int], PendingContent]:
        direction, channel = f.int("direction", 0, 1), f.int("channel", 0, 0xFFFF)
        seq = f.int("seq", 1, self.seq)
        ts_ns, packet = f.int("ts_ns"), f.int("packet")
        name = f.str("method", choices=CONTENT_METHODS)
        source = f.str("source")
        tag = check_value(f.raw("delivery_tag"), FRAMES.field("delivery_tag").type, f"{f.where}.delivery_tag")
        shared = f.list("shared", len(SHARED_METHOD_FIELDS), length=len(SHARED_METHOD_FIELDS))
        shared = tuple(check_value(v, FRAMES.field(n).type, f"{f.where}.shared.{n}")
                       for n, v in zip(SHARED_METHOD_FIELDS, shared))
        constants = (self.id,) + self.sink.connections[self.index][1:]
        index = self.sink.add_connection(constants[:2] + (source,) + constants[3:])
        pending = PendingContent((index, seq, ts_ns, direction, channel, name, packet, tag, shared))
        if f.raw("properties") is not None:
            values = f.list("properties", len(PROPERTY_FIELDS), length=len(PROPERTY_FIELDS))
            pending.properties = tuple(check_value(v, FRAMES.field(n).type, f"{f.where}.properties.{n}")
                                       for n, v in zip(PROPERTY_FIELDS, values))
            pending.body_size = f.int("body_size")
            if f.raw("body") is None:  # past what a snapshot keeps: no hash of it, it ends incomplete
                pending.body = None
            else:
                pending.add_body(f.bytes("body", MAX_KEPT_BODY))
                if pending.received >= pending.body_size and pending.body_size:
                    f.fail("body", "as long as the message: it would not be pending")
        return (direction, channel), pending

    def connection_row(self) -> dict:
        """This connection as a row of schema.CONNECTIONS (its derived timestamp and date columns aside)."""
        row = dict.fromkeys(CONNECTION_FIELDS)
        row.update(self.facts)
        row["last_ts_ns"] = self.ts_ns
        if self.tls is not None:
            row.update(self.tls.facts())
        if row["protocol"] is None:
            row["protocol"] = "none" if not (row["bytes_to_broker"] or row["bytes_to_client"]) else "unknown"
        return row


def _text(value) -> str | None:
    if value is None:
        return None
    if isinstance(value, (bytes, bytearray)):
        return value.decode("utf-8", "replace")
    return str(value)


def sasl_user(mechanism, response) -> str | None:
    """The user name from a SASL response, without keeping anything else of it."""
    mechanism = _text(mechanism) or ""
    if isinstance(response, str):
        response = response.encode("utf-8", "surrogateescape")
    if not response:
        return None
    try:
        if mechanism == "PLAIN":  # authzid \0 authcid \0 password (which RabbitMQ reads to the end, NULs and all)
            parts = response.split(b"\x00", 2)
            return parts[1].decode("utf-8", "replace") if len(parts) == 3 else None
        if mechanism == "AMQPLAIN":  # a field table without its length prefix
            _, table = pamqp_decode.field_table(len(response).to_bytes(4, "big") + response)
            return _text(table.get("LOGIN"))
    except Exception:  # a malformed response is the client's problem; it only costs us the user name
        return None
    return None
