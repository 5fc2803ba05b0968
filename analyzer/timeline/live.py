"""What is open right now, read from the state machine without changing it: the live agent's gauges.

The records (records.py) say what happened to each item once it is final; an operator also needs
what is pending now: how many deliveries a consumer sits on and since when, how many publishes
await their confirm. These are read from the same state the rules keep, so the live gauges and the
batch tables cannot disagree. Sans-IO: `now_ns` is the caller's clock (the capture's last packet
time), never read here.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from .connection import ConnectionTimeline, Timelines


@dataclass(frozen=True, slots=True)
class OpenChannel:
    connection_id: str
    channel: int
    incarnation: int
    unacked: int                        # manual-ack deliveries outstanding
    oldest_unacked_ts_ns: int | None    # delivery time of the oldest of them
    auto_or_unknown: int                # outstanding deliveries whose ack mode is not known
    unconfirmed: int                    # confirm-mode publishes awaiting basic.ack/nack
    oldest_unconfirmed_ts_ns: int | None
    consumer_prefetch: int | None       # basic.qos in force; 0 unlimited; None unknown
    channel_prefetch: int | None
    consumers: int                      # registered (consume-ok or nowait) and not cancelled
    confirm_mode: bool | None
    tx_mode: bool | None


@dataclass(frozen=True, slots=True)
class OpenConnection:
    connection_id: str
    blocked_since_ns: int | None        # connection.blocked not yet followed by connection.unblocked
    last_ts_ns: int | None
    channels: tuple[OpenChannel, ...]


def open_channels(timeline: ConnectionTimeline) -> Iterator[OpenChannel]:
    """The channel incarnations of one connection that have not ended, in channel order."""
    for number in sorted(timeline.lives):
        life = timeline.lives[number]
        if life.ended:
            continue
        consumer, publisher = life.consumer, life.publisher
        oldest_unacked = next((d.row["ts_ns"] for d in consumer.outstanding.values() if d.no_ack is False), None)
        oldest_unconfirmed = next(iter(publisher.pending.values()), None)
        yield OpenChannel(
            connection_id=timeline.id, channel=number, incarnation=life.incarnation,
            unacked=consumer.unacked, oldest_unacked_ts_ns=oldest_unacked,
            auto_or_unknown=len(consumer.outstanding) - consumer.unacked,
            unconfirmed=len(publisher.pending),
            oldest_unconfirmed_ts_ns=oldest_unconfirmed.row["ts_ns"] if oldest_unconfirmed is not None else None,
            consumer_prefetch=consumer.consumer_prefetch, channel_prefetch=consumer.channel_prefetch,
            consumers=len(set(consumer.consumers) - consumer.cancelled),
            confirm_mode=publisher.confirm, tx_mode=publisher.tx)


def open_connections(timelines: Timelines | Iterable[ConnectionTimeline]) -> Iterator[OpenConnection]:
    """Every connection the timelines still follow, with its open channels."""
    items = timelines.connections.values() if isinstance(timelines, Timelines) else timelines
    for timeline in items:
        if timeline.finished:
            continue
        yield OpenConnection(connection_id=timeline.id, blocked_since_ns=timeline.blocked_since_ns,
                             last_ts_ns=timeline.last_ts_ns, channels=tuple(open_channels(timeline)))
