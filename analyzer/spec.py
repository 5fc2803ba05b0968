"""AMQP 0-9-1 constants: frame types, protocol headers and method names (with RabbitMQ's extensions).

Method names are written the way the spec and RabbitMQ's docs write them (``basic.get-ok``),
which is also how tshark names them, so tables and reports read like the documentation.
"""

FRAME_METHOD = 1
FRAME_HEADER = 2
FRAME_BODY = 3
FRAME_HEARTBEAT = 8
FRAME_END = 0xCE
FRAME_TYPES = frozenset((FRAME_METHOD, FRAME_HEADER, FRAME_BODY, FRAME_HEARTBEAT))

PROTOCOL_HEADER_091 = b"AMQP\x00\x00\x09\x01"

# AMQP 0-9-1, AMQP over TLS, RabbitMQ streams and streams over TLS.
DEFAULT_BROKER_PORTS = frozenset((5672, 5671, 5552, 5551))
DEFAULT_MAX_FRAME = 4 << 20   # hard ceiling before frame_max is negotiated, or when it is 0 (no limit)

# (class id, method id) -> name. Methods that carry content are listed in CONTENT_METHODS.
METHODS = {
    (10, 10): "connection.start", (10, 11): "connection.start-ok",
    (10, 20): "connection.secure", (10, 21): "connection.secure-ok",
    (10, 30): "connection.tune", (10, 31): "connection.tune-ok",
    (10, 40): "connection.open", (10, 41): "connection.open-ok",
    (10, 50): "connection.close", (10, 51): "connection.close-ok",
    (10, 60): "connection.blocked", (10, 61): "connection.unblocked",
    (10, 70): "connection.update-secret", (10, 71): "connection.update-secret-ok",
    (20, 10): "channel.open", (20, 11): "channel.open-ok",
    (20, 20): "channel.flow", (20, 21): "channel.flow-ok",
    (20, 40): "channel.close", (20, 41): "channel.close-ok",
    (30, 10): "access.request", (30, 11): "access.request-ok",
    (40, 10): "exchange.declare", (40, 11): "exchange.declare-ok",
    (40, 20): "exchange.delete", (40, 21): "exchange.delete-ok",
    (40, 30): "exchange.bind", (40, 31): "exchange.bind-ok",
    (40, 40): "exchange.unbind", (40, 51): "exchange.unbind-ok",
    (50, 10): "queue.declare", (50, 11): "queue.declare-ok",
    (50, 20): "queue.bind", (50, 21): "queue.bind-ok",
    (50, 30): "queue.purge", (50, 31): "queue.purge-ok",
    (50, 40): "queue.delete", (50, 41): "queue.delete-ok",
    (50, 50): "queue.unbind", (50, 51): "queue.unbind-ok",
    (60, 10): "basic.qos", (60, 11): "basic.qos-ok",
    (60, 20): "basic.consume", (60, 21): "basic.consume-ok",
    (60, 30): "basic.cancel", (60, 31): "basic.cancel-ok",
    (60, 40): "basic.publish", (60, 50): "basic.return",
    (60, 60): "basic.deliver", (60, 70): "basic.get",
    (60, 71): "basic.get-ok", (60, 72): "basic.get-empty",
    (60, 80): "basic.ack", (60, 90): "basic.reject",
    (60, 100): "basic.recover-async", (60, 110): "basic.recover",
    (60, 111): "basic.recover-ok", (60, 120): "basic.nack",
    (85, 10): "confirm.select", (85, 11): "confirm.select-ok",
    (90, 10): "tx.select", (90, 11): "tx.select-ok",
    (90, 20): "tx.commit", (90, 21): "tx.commit-ok",
    (90, 30): "tx.rollback", (90, 31): "tx.rollback-ok",
}

CONTENT_METHODS = frozenset(("basic.publish", "basic.return", "basic.deliver", "basic.get-ok"))

# Methods only the broker sends; used to tell the sides of a flow apart when the capture
# starts mid-connection and no protocol header or port tells us.
BROKER_METHODS = frozenset((
    "connection.start", "connection.tune", "connection.open-ok", "channel.open-ok",
    "basic.deliver", "basic.get-ok", "basic.get-empty", "basic.consume-ok", "basic.qos-ok",
    "queue.declare-ok", "exchange.declare-ok", "queue.bind-ok", "basic.return",
    "confirm.select-ok", "tx.select-ok", "tx.commit-ok", "tx.rollback-ok",
    "connection.blocked", "connection.unblocked",
))
CLIENT_METHODS = frozenset((
    "connection.start-ok", "connection.tune-ok", "connection.open", "channel.open",
    "basic.publish", "basic.consume", "basic.qos", "basic.get", "queue.declare",
    "exchange.declare", "queue.bind", "basic.reject", "confirm.select", "tx.select",
    "tx.commit", "tx.rollback", "basic.recover",
))

# Pseudo-methods: rows the analyzer adds to the frames table for what the wire showed
# outside AMQP methods, so timelines know where the capture is blind or the flow ended.
HEARTBEAT = "heartbeat"
PROTOCOL_HEADER = "amqp.protocol-header"
CAPTURE_MIDSTREAM = "capture.midstream"   # first frame of a flow seen without its start
CAPTURE_GAP = "capture.gap"               # bytes missing from the capture; framing resynchronised
TCP_FIN = "tcp.fin"
TCP_RST = "tcp.rst"

CONTENT_HEADER = "content.header"
CONTENT_BODY = "content.body"


def method_id(class_id: int, method: int) -> int:
    return (class_id << 16) | method


METHOD_NAMES = {method_id(c, m): name for (c, m), name in METHODS.items()}
METHOD_IDS = {name: mid for mid, name in METHOD_NAMES.items()}

# Saved flows continue when the next file's first packet comes at most this long after the last
# one ingested (ingest.py, pieces.py). What a ring's rotation needs is the longest silence of a
# capture that holds a live connection: RabbitMQ's default heartbeat timeout is 60 s (a heartbeat
# frame every 30 s each way), so two of them cover any capture of a live connection; a capture
# silent longer has lost its connections anyway. docs/ingest.md.
DEFAULT_CONTINUE_WITHIN_S = 120.0
