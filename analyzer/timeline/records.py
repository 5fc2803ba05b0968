"""What the timelines produce: frozen records, one per delivery, publish, channel incarnation and
protocol violation. Field names are the table columns (schema.DELIVERIES, schema.PUBLISHES and
tables.CHANNELS / tables.VIOLATIONS) minus `date` and the timestamp columns derived from `_ns`.
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, fields

from .. import pure_python

try:
    from . import _records
except ImportError:  # not compiled (setup.py marks it optional): `Record.new` is the class itself
    _records = None

# Delivery outcomes.
ACK, NACK, REJECT, AUTO = "ack", "nack", "reject", "auto"
RECOVERED, CHANNEL_CLOSED, CONNECTION_CLOSED = "recovered", "channel_closed", "connection_closed"
OPEN, UNKNOWN = "open", "unknown"
DELIVERY_OUTCOMES = (ACK, NACK, REJECT, AUTO, RECOVERED, CHANNEL_CLOSED, CONNECTION_CLOSED, OPEN, UNKNOWN)

# Publish outcomes and modes.
ACKED, NACKED, COMMITTED, ROLLED_BACK, LOST, UNTRACKED = "acked", "nacked", "committed", "rolled_back", "lost", "untracked"
# Still waiting for its confirm or commit when the data ends, and older than the overdue timeout then.
OVERDUE = "overdue"
PUBLISH_OUTCOMES = (ACKED, NACKED, COMMITTED, ROLLED_BACK, LOST, OPEN, OVERDUE, UNKNOWN, UNTRACKED)
# Persistent messages under load take hundreds of milliseconds to confirm; a minute is not normal.
DEFAULT_OVERDUE_NS = 60 * 1_000_000_000
CONFIRM, TX, NONE = "confirm", "tx", "none"
PUBLISH_MODES = (CONFIRM, TX, NONE, UNKNOWN)

# Protocol violations: the client's fault; RabbitMQ answers each with channel.close 406.
DOUBLE_ACK, UNKNOWN_TAG, WRONG_CHANNEL = "double_ack", "unknown_tag", "wrong_channel"
VIOLATION_KINDS = (DOUBLE_ACK, UNKNOWN_TAG, WRONG_CHANNEL)
# Where a violation is known from: the frames the capture holds, or only the broker's 406 reply.
FROM_CAPTURE, FROM_BROKER = "capture", "broker"


def record(cls):
    """`cls` as a frozen slotted dataclass (immutable, equal only to its own type with equal fields,
    hashable, `dataclasses.fields`/`asdict`/`replace` as usual) with a cheaper `__init__`.

    Why: the machine builds a record for most frames, and a frozen dataclass's own `__init__` sets
    each field through `object.__setattr__` (its `__setattr__` refuses): ~3.3 us for a Delivery
    where plain assignments take ~0.9 us. This `__init__` moves the half-built instance to a twin
    class with the same slots and no `__setattr__` of its own, assigns the fields there and moves
    it back (~1.2 us; calling each slot's descriptor `__set__` instead measured ~1.9 us). Nothing
    else sees the record before it is back in its class; it binds arguments as the dataclass's
    `__init__` did (the same parameters, keyword or positional, all required). `cls.new` makes the
    same record cheaper still, in C where it is built (`maker` below): what the machine calls.
    """
    cls = dataclass(frozen=True, slots=True)(cls)
    names = tuple(f.name for f in fields(cls))
    if cls.__slots__ != names or any(f.default is not MISSING or f.default_factory is not MISSING or not f.init
                                     for f in fields(cls)):
        raise TypeError(f"{cls.__name__}: a record's fields are all required and are its slots")
    twin = type(f"_Mutable{cls.__name__}", (), {"__slots__": names, "__module__": cls.__module__})
    assignments = "".join(f"    self.{name} = {name}\n" for name in names)
    source = (f"def __init__(self, {', '.join(names)}):\n"
              f"    _set_class(self, '__class__', _twin)\n{assignments}"
              f"    _set_class(self, '__class__', _record)\n")
    namespace = {"_set_class": object.__setattr__, "_twin": twin, "_record": cls}
    exec(source, namespace)
    init = namespace["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__module__ = cls.__module__
    cls.__init__ = init
    cls.new = maker(cls, names)
    return cls


def maker(cls, names: tuple):
    """A callable making instances of the slotted class `cls` from the values of its slots `names`
    (positional or keyword, all required), as `cls(...)` does when its `__init__` just assigns
    them: made in C where it is built (_records.c), else the class itself.

    Why: a class call runs its `__init__` in Python, and one with many keywords packs them into a
    dict first (~1.7 µs for a Delivery's 30 fields against ~0.9 µs from C with the dict, ~0.1 µs
    with positional values). `Record.new` is this for each record; the machine makes its records
    and its per-delivery state with it. ACKSCOPE_PURE_PYTHON=1 makes it the class itself."""
    if _records is None or pure_python():
        return cls
    return _records.maker(cls, names)


@record
class Delivery:
    connection_id: str
    agent_id: str | None
    channel: int
    incarnation: int
    channel_open_seq: int
    seq: int
    ts_ns: int
    method: str
    delivery_tag: int
    consumer_tag: str | None
    queue: str | None
    exchange: str | None
    routing_key: str | None
    message_id: str | None
    message_identity: str | None
    redelivered: bool | None
    x_death_count: int | None
    no_ack: bool | None
    consumer_prefetch: int | None
    channel_prefetch: int | None
    outcome: str
    settled_by_multiple: bool | None
    settle_tag: int | None
    requeue: bool | None
    in_tx: bool | None
    settle_frame_seq: int | None
    settle_seq: int | None
    settle_ts_ns: int | None
    settle_latency_ns: int | None
    observed_until_ts_ns: int | None


@record
class Publish:
    connection_id: str
    agent_id: str | None
    channel: int
    incarnation: int
    channel_open_seq: int
    seq: int
    ts_ns: int
    exchange: str | None
    routing_key: str | None
    mandatory: bool | None
    persistent: bool | None
    message_id: str | None
    message_identity: str | None
    mode: str
    confirm_seq: int | None
    pending_before: int | None
    outcome: str
    confirm_tag: int | None
    confirm_multiple: bool | None
    out_of_order: bool | None
    out_of_order_by: int | None
    return_code: int | None
    return_text: str | None
    return_seq: int | None
    settle_seq: int | None
    settle_ts_ns: int | None
    settle_latency_ns: int | None
    observed_until_ts_ns: int | None


@record
class ChannelFacts:
    """One channel incarnation, from its open to its end."""
    connection_id: str
    agent_id: str | None
    channel: int
    incarnation: int
    open_seq: int
    open_ts_ns: int
    history_known: bool         # opened inside the capture, with both directions in view
    gap_seen: bool              # a capture gap (or malformed frame) happened during its life
    end_seq: int | None
    end_ts_ns: int | None
    ended_by: str               # channel.close, connection.close, tcp.fin, tcp.rst, end_of_data, reopened, tag_restart
    closed_by: str | None       # client or broker (AMQP closes only)
    close_code: int | None
    close_text: str | None
    failing_method: str | None
    confirm_mode: bool | None   # null: unknown (opened before the capture, or after a gap)
    tx_mode: bool | None
    consumer_prefetch: int | None  # last basic.qos global=false in force at the end; 0 unlimited
    channel_prefetch: int | None   # last basic.qos global=true in force at the end; 0 unlimited
    consumes: int
    unbounded_manual_consumes: int  # manual-ack basic.consume with neither prefetch limit in force
    deliveries: int
    publishes: int
    peak_unacked: int           # most manual-ack deliveries outstanding at once
    observed_until_ts_ns: int | None  # ended_by end_of_data only: ts of the connection's last row


@record
class Violation:
    """A basic.ack/nack/reject naming a tag that is not outstanding on its channel incarnation."""
    connection_id: str
    agent_id: str | None
    channel: int
    incarnation: int
    seq: int                    # the offending frame (for broker evidence: the broker's channel.close)
    ts_ns: int
    kind: str                   # double_ack, unknown_tag, wrong_channel
    evidence: str               # capture or broker
    method: str | None
    delivery_tag: int | None
    multiple: bool | None
    delivered_channel: int | None      # wrong_channel: where that tag is outstanding
    delivered_incarnation: int | None
    broker_close_seq: int | None       # the broker's channel.close 406 that answered it
    broker_reply_code: int | None
    broker_reply_text: str | None
