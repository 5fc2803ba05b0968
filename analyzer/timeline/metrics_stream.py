"""channel_metrics while a connection streams through the state machine, rows out as they become
final: memory follows what the machine still holds, not the connection's length.

metrics.ChannelMetrics returns a bucket's row once told that nothing fed later falls before a
horizon. This module reads that horizon off the machine (a read-only look at its state, as
live.py does): the machine emits a record only when it is final, so what it still holds bounds
what can come. The horizon is the last frame's time (later frames are assumed not to go back in
time: a capture whose timestamps do makes ChannelMetrics raise HorizonError rather than return a
wrong row), and, for an incarnation, the earliest of that and
- the arrival of every item the machine holds back (deliveries not settled, publishes awaiting a
  confirm, a commit or a possible basic.return, records held until a close-ok),
- the end of every incarnation that ended but whose ChannelFacts are not out yet, and the TCP FIN
  or RST that will end the open ones when the data ends.
An incarnation still open would hold the horizon at its open for its whole life, so its open is
announced instead (ChannelMetrics.opened).

What it costs: an incarnation's buckets from its horizon on stay in memory with their level
changes, so one item held for long (a delivery nobody acks) holds every later bucket of its own
incarnation (not its neighbours'): about 60 bytes per item behind it (bench/README.md).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping

from . import records as r
from .connection import ConnectionTimeline, Timelines
from .metrics import ChannelMetrics


def _lives(timeline: ConnectionTimeline):
    yield from timeline.lives.values()
    for life, _retire in timeline.awaiting_next:
        yield life


def _held_rows(life) -> Iterator[Mapping]:
    """The frame rows of the items a life has not emitted a record for yet."""
    consumer, publisher = life.consumer, life.publisher
    for d in consumer.outstanding.values():
        yield d.row
    for d, *_ in consumer.tx_settled:
        yield d.row
    for publishes in (publisher.pending.values(), publisher.tx_publishes, publisher.discarded,
                      publisher.awaiting_return.values()):
        for p in publishes:
            yield p.row


def horizons(timeline: ConnectionTimeline) -> tuple[int | None, dict[tuple[int, int], int]]:
    """Nothing the timeline emits from now on has an event before the first value (None: no frame
    yet), nor, for an incarnation the second maps by (channel, incarnation), before its value."""
    last = timeline.last_ts_ns
    held: dict[tuple[int, int], int] = {}
    if last is None:
        return None, held
    for life in _lives(timeline):
        earliest = last
        if life.ended is not None and life.ended[0] is not None:
            earliest = min(earliest, life.ended[0]["ts_ns"])
        elif life.ended is None and timeline.transport_end is not None:
            earliest = min(earliest, timeline.transport_end["ts_ns"])
        for row in _held_rows(life):
            earliest = min(earliest, row["ts_ns"])
        for record in life.held:
            earliest = min(earliest, record.ts_ns)
        if earliest < last:
            key = (life.channel, life.incarnation)
            held[key] = min(earliest, held.get(key, earliest))
    return last, held


def item_horizons(timeline: ConnectionTimeline) -> tuple[int | None, int | None]:
    """(delivery seq, publish seq): no Delivery (Publish) record the timeline emits from now on has
    a seq below it. An item's record carries the seq of its own frame, and the machine holds every
    item it saw and has not emitted; the items still unseen come after the last frame. None: no
    frame yet."""
    if timeline.last_seq is None:
        return None, None
    deliveries = publishes = timeline.last_seq + 1
    for life in _lives(timeline):
        consumer, publisher = life.consumer, life.publisher
        for d in consumer.outstanding.values():
            deliveries = min(deliveries, d.row["seq"])
        for d, *_ in consumer.tx_settled:
            deliveries = min(deliveries, d.row["seq"])
        for held in (publisher.pending.values(), publisher.tx_publishes, publisher.discarded,
                     publisher.awaiting_return.values()):
            for p in held:
                publishes = min(publishes, p.row["seq"])
        for record in life.held:
            if isinstance(record, r.Delivery):
                deliveries = min(deliveries, record.seq)
            elif isinstance(record, r.Publish):
                publishes = min(publishes, record.seq)
    return deliveries, publishes


def announce_opens(metrics: ChannelMetrics, timeline: ConnectionTimeline) -> None:
    for life in _lives(timeline):
        metrics.opened(timeline.id, timeline.agent_id, life.channel, life.incarnation,
                       life.open_row["ts_ns"], life.open_row["seq"])


def stream_metrics(rows: Iterable[Mapping], bucket_seconds: int = 10, overdue_ns: int = r.DEFAULT_OVERDUE_NS,
                   advance_every: int = 4096, records: list | None = None) -> Iterator[dict]:
    """channel_metrics rows of one connection's frame rows (seq order), as they become final.
    The horizon is taken every `advance_every` rows (reading it walks what the machine holds).
    `records`, if given, receives every record the machine emits."""
    timelines = Timelines(overdue_ns)
    metrics = ChannelMetrics(bucket_seconds)
    timeline = None
    for count, row in enumerate(rows, start=1):
        emitted = timelines.feed(row)
        metrics.feed(emitted)
        if records is not None:
            records += emitted
        if count % advance_every == 0:
            timeline = timeline or timelines.connections[row["connection_id"]]
            announce_opens(metrics, timeline)
            yield from metrics.advance(*horizons(timeline))
    emitted = timelines.end_of_data()
    metrics.feed(emitted)
    if records is not None:
        records += emitted
    yield from metrics.finish()
