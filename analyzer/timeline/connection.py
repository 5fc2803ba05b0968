"""Connections: frame rows in, in (connection_id, seq) order; channel incarnations and their
records out.

The transitions live in two tables: `CHANNEL_TRANSITIONS` for frames on a channel, by
(direction, method), and `ConnectionTimeline.feed` for the connection-level rows (connection
close, TCP ends, capture gaps and mid-stream starts).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from . import plain
from . import records as r
from .channel import TO_BROKER, TO_CLIENT, ChannelLife
from .consumer import ConsumerSide
from .publisher import PublisherSide

# (direction, method) -> (the part of the incarnation that takes the row, its transition): the
# consumer side, the publisher side, or (None) the incarnation itself.
CONSUMER, PUBLISHER = "consumer", "publisher"
CHANNEL_TRANSITIONS = {
    (TO_BROKER, "basic.publish"): (PUBLISHER, PublisherSide.publish),
    (TO_BROKER, "basic.ack"): (CONSUMER, ConsumerSide.client_settle),
    (TO_BROKER, "basic.nack"): (CONSUMER, ConsumerSide.client_settle),
    (TO_BROKER, "basic.reject"): (CONSUMER, ConsumerSide.client_settle),
    (TO_BROKER, "basic.qos"): (CONSUMER, ConsumerSide.qos),
    (TO_BROKER, "basic.consume"): (CONSUMER, ConsumerSide.consume),
    (TO_BROKER, "basic.get"): (CONSUMER, ConsumerSide.get),
    (TO_BROKER, "basic.recover"): (CONSUMER, ConsumerSide.recover),
    (TO_BROKER, "basic.recover-async"): (CONSUMER, ConsumerSide.recover),
    (TO_BROKER, "confirm.select"): (PUBLISHER, PublisherSide.confirm_select),
    (TO_BROKER, "tx.select"): (PUBLISHER, PublisherSide.tx_select),
    (TO_BROKER, "tx.commit"): (None, ChannelLife.tx_commit),
    (TO_BROKER, "tx.rollback"): (None, ChannelLife.tx_rollback),
    (TO_CLIENT, "basic.ack"): (PUBLISHER, PublisherSide.broker_confirm),
    (TO_CLIENT, "basic.nack"): (PUBLISHER, PublisherSide.broker_confirm),
    (TO_CLIENT, "basic.deliver"): (CONSUMER, ConsumerSide.deliver),
    (TO_CLIENT, "basic.get-ok"): (CONSUMER, ConsumerSide.deliver),
    (TO_CLIENT, "basic.get-empty"): (CONSUMER, ConsumerSide.get_empty),
    (TO_CLIENT, "basic.consume-ok"): (CONSUMER, ConsumerSide.consume_ok),
    (TO_CLIENT, "basic.return"): (PUBLISHER, PublisherSide.returned),
    (TO_CLIENT, "confirm.select-ok"): (PUBLISHER, PublisherSide.select_ok),
    (TO_CLIENT, "tx.select-ok"): (PUBLISHER, PublisherSide.select_ok),
    (TO_CLIENT, "tx.commit-ok"): (None, ChannelLife.tx_reply),
    (TO_CLIENT, "tx.rollback-ok"): (None, ChannelLife.tx_reply),
}
# Consumers ending: kept out of CHANNEL_TRANSITIONS because they change no record, only the live
# view (live.py), so they must not start an incarnation where the data lacks the channel's open.
CANCELS = frozenset(("basic.cancel", "basic.cancel-ok"))
CONNECTION_ENDS = frozenset(("connection.close", "connection.close-ok"))
TRANSPORT_ENDS = frozenset(("tcp.fin", "tcp.rst"))
DELIVERING = frozenset(("basic.deliver", "basic.get-ok"))
OTHER = {TO_BROKER: TO_CLIENT, TO_CLIENT: TO_BROKER}


class TimelineInputError(ValueError):
    """The caller fed rows out of order or without the columns the timelines need (the caller's fault)."""


class ConnectionTimeline:
    # Slotted, as its channel incarnations and their sides are: the C transitions (plain.py) read
    # these fields at fixed offsets. state.FIELDS lists what a checkpoint stores of them.
    __slots__ = ("id", "agent_id", "overdue_ns", "lives", "incarnations", "synchronised", "closed", "transport_end",
                 "blocked_since_ns", "last_seq", "last_ts_ns", "finished", "awaiting_next", "emit")

    def __init__(self, connection_id: str, agent_id: str | None, emit, overdue_ns: int = r.DEFAULT_OVERDUE_NS):
        self.id, self.agent_id, self.emit = connection_id, agent_id, emit
        self.overdue_ns = overdue_ns
        self.lives: dict[int, ChannelLife] = {}   # the current incarnation of each channel number
        self.incarnations: dict[int, int] = {}
        self.synchronised: set[str] = set()       # directions that joined mid-stream
        self.closed = None                        # the connection.close (or close-ok) row
        self.transport_end = None                 # the first tcp.fin / tcp.rst row
        self.blocked_since_ns = None              # ts of a connection.blocked not yet unblocked
        self.last_seq = None
        self.last_ts_ns = None
        self.finished = False
        # Closed lives whose outcomes wait for the next row of a direction (a close-ok whose close the
        # data lacks, a channel number reused before the close-ok): a capture.gap there reopens them.
        self.awaiting_next: list[tuple[ChannelLife, bool]] = []  # (life, retire when released)

    def feed(self, row: Mapping) -> None:
        """The next frame row of this connection (seq order). A plain frame is done in C, exactly as
        `python_feed` would do it (plain.py); every other one there."""
        if _plain_feed is None or not _plain_feed(self, row):
            self.python_feed(row)

    def feed_plain(self, rows: list, start: int, stop: int, since_ns: int | None = None) -> int:
        """rows[start:stop] fed in turn while each is a plain frame of this connection (no row of
        another connection is fed) with an int ts_ns not below `since_ns` (if given): the index of
        the first row not fed. Exactly `feed` on each of those rows, with no Python call per row;
        `start` where the C module is not built."""
        return start if _plain_feed_rows is None else _plain_feed_rows(self, rows, start, stop, since_ns)

    def python_feed(self, row: Mapping) -> None:
        """Every transition, in Python: the rules' one statement."""
        seq, method, direction = row.get("seq"), row.get("method"), row.get("direction")
        if seq is None or row.get("ts_ns") is None or method is None or direction not in (TO_BROKER, TO_CLIENT):
            raise TimelineInputError(f"connection {self.id}: row {row!r} lacks seq, ts_ns, method or direction")
        if self.last_seq is not None and seq <= self.last_seq:
            raise TimelineInputError(f"connection {self.id}: row seq {seq} after seq {self.last_seq}; "
                                     f"feed rows in (connection_id, seq) order")
        if self.finished:
            raise TimelineInputError(f"connection {self.id}: row seq {seq} after the connection was ended")
        self.last_seq, self.last_ts_ns = seq, row["ts_ns"]
        channel = row.get("channel") or 0
        gap = bool(row.get("malformed")) or method == "capture.gap"
        if self.awaiting_next:
            self._next_row(row, direction, gap)
        if gap:
            for life in self.lives.values():  # whatever the lost bytes held is unknown now
                life.gap(row, direction)
        elif method == "capture.midstream":
            self.synchronised.add(direction)
        elif channel == 0:
            if method in CONNECTION_ENDS and self.closed is None:
                self.closed = row
                hidden = method == "connection.close-ok"  # the close itself is not in the data
                for life in self.lives.values():
                    life.close(row, r.CONNECTION_CLOSED, ended_by="connection.close", peer=OTHER[direction])
                    if hidden:
                        self.awaiting_next.append((life, False))
            elif method == "connection.close-ok":
                for life in self.lives.values():
                    if life.holding == direction:
                        life.release()
            elif method == "connection.blocked" and direction == TO_CLIENT:
                if self.blocked_since_ns is None:
                    self.blocked_since_ns = row["ts_ns"]
            elif method == "connection.unblocked" and direction == TO_CLIENT:
                self.blocked_since_ns = None
            elif method in TRANSPORT_ENDS and self.transport_end is None:
                self.transport_end = row  # frames still in flight may follow: it ends at the end of the data
        elif method == "channel.open" and direction == TO_BROKER:
            self._new_life(channel, row, ended_by="reopened")
        elif method == "channel.open-ok" and direction == TO_CLIENT:
            life = self.lives.get(channel)
            if life is None or life.end_facts.get("ended_by") == "channel.close":
                self._new_life(channel, row, ended_by="reopened")  # its channel.open is not in the data
        elif method == "channel.close":
            life = self.lives.get(channel)
            if life is not None:  # none: its close-ok came first (the capture reordered them)
                life.close(row, r.CHANNEL_CLOSED, ended_by="channel.close",
                           closed_by="client" if direction == TO_BROKER else "broker", peer=OTHER[direction])
        elif method == "channel.close-ok":
            life = self.lives.pop(channel, None)
            if life is not None:
                if not life.ended:  # its close is not in the data: the peer of this close-ok sent it
                    life.close(row, r.CHANNEL_CLOSED, ended_by="channel.close",
                               closed_by="broker" if direction == TO_BROKER else "client", peer=OTHER[direction])
                self._retire_after(life, row)
        elif method in CANCELS and direction == TO_CLIENT:
            life = self.lives.get(channel)
            if life is not None:
                life.consumer.cancelled_consumer(row)
        else:
            found = CHANNEL_TRANSITIONS.get((direction, method))
            if found is None:
                return
            if method in DELIVERING and row.get("delivery_tag") is None:
                return  # content cut short before its tag: not attributable
            life = self._life(channel, row)
            if life.gap_since_end:  # a gap since its close may hide a new life's open
                life = self._new_life(channel, row, ended_by="reopened", history_known=False)
            elif method in DELIVERING and row["delivery_tag"] <= life.consumer.max_tag:
                # Tags only rise within an incarnation: this is a new life whose open the data lacks.
                life = self._new_life(channel, row, ended_by="tag_restart", history_known=False)
            part, transition = found
            transition(life if part is None else getattr(life, part), row)

    def end(self) -> None:
        """The data ends. A connection that saw FIN or RST without connection.close ended there;
        any other still-open channel stays open."""
        if self.finished:
            return
        self.finished = True
        for channel in sorted(self.lives):
            life = self.lives[channel]
            if self.transport_end is not None:
                life.close(self.transport_end, r.CONNECTION_CLOSED, ended_by=self.transport_end["method"])
            else:
                life.end_of_data(self.last_ts_ns)
            self._retire(life)
        for life, retire in self.awaiting_next:
            if retire:
                self._retire(life)
        self.lives, self.awaiting_next = {}, []

    def _next_row(self, row, direction: str, gap: bool) -> None:
        waiting = []
        for life, retire in self.awaiting_next:
            if life.holding != direction:
                waiting.append((life, retire))
                continue
            if gap:
                life.gap(row, direction)
            if retire:
                self._retire(life)
            else:
                life.release()
        self.awaiting_next = waiting

    def outstanding_elsewhere(self, tag: int, asking: ChannelLife) -> ChannelLife | None:
        """The other channel incarnation (lowest number) on which `tag` is an unacked delivery."""
        for channel in sorted(self.lives):
            life = self.lives[channel]
            if life is not asking and not life.ended and tag in life.consumer.outstanding:
                return life
        return None

    def _life(self, channel: int, row) -> ChannelLife:
        life = self.lives.get(channel)
        return life if life is not None else self._new_life(channel, row, ended_by="reopened", history_known=False)

    def _new_life(self, channel: int, row, ended_by: str, history_known: bool | None = None) -> ChannelLife:
        old = self.lives.get(channel)
        if old is not None:
            old.abandon(row, ended_by)  # a no-op if it was closed but its close-ok is not in the data
            self._retire_after(old, row)
        if history_known is None:
            # Seen whole only if opened here with both directions in view from the start.
            history_known = (row["method"] == "channel.open" and self.closed is None
                             and (not self.synchronised or len(self.synchronised) == 2))
        self.incarnations[channel] = number = self.incarnations.get(channel, 0) + 1
        life = ChannelLife(self, channel, number, row, history_known)
        self.lives[channel] = life
        if self.closed is not None:  # frames still arriving on a connection already closed
            life.close(self.closed, r.CONNECTION_CLOSED, ended_by="connection.close")
        return life

    def _retire_after(self, life: ChannelLife, row) -> None:
        """Retire a life now, unless it holds its close's outcomes for a direction other than this
        row's: then at the next row of that direction (a capture.gap there reopens them)."""
        if life.holding is None or life.holding == row["direction"]:
            self._retire(life)
        else:
            self.awaiting_next.append((life, True))

    def _retire(self, life: ChannelLife) -> None:
        life.release()
        self.emit(life.facts())
        for violation in life.violation_records():
            self.emit(violation)


# After the class: the C transitions are configured with it.
_plain_feed, _plain_feed_rows = plain.feeds_for(ConnectionTimeline)


class Timelines:
    """Frame rows of any number of connections in; finished records out, as they become final.

    `feed` and `end_connection` / `end_of_data` return the records they completed: a delivery
    once settled, a publish once confirmed (or lost, ...) and past any basic.return, a channel's
    facts and violations once it ends. Records of open items come out at the end of the data."""

    def __init__(self, overdue_ns: int = r.DEFAULT_OVERDUE_NS):
        self.overdue_ns = overdue_ns  # a publish waiting longer than this when the data ends is overdue
        self.connections: dict[str, ConnectionTimeline] = {}
        self._out: list = []

    def feed(self, row: Mapping) -> list:
        connection_id = row.get("connection_id")
        if connection_id is None:
            raise TimelineInputError(f"row {row!r} has no connection_id")
        timeline = self.connections.get(connection_id)
        if timeline is None:
            timeline = self.connections[connection_id] = ConnectionTimeline(
                connection_id, row.get("agent_id"), self._emit, self.overdue_ns)
        timeline.feed(row)
        return self._take()

    def end_connection(self, connection_id: str) -> list:
        timeline = self.connections.pop(connection_id, None)
        if timeline is not None:
            timeline.end()
        return self._take()

    def end_of_data(self) -> list:
        for connection_id in sorted(self.connections):
            self.connections[connection_id].end()
        self.connections = {}
        return self._take()

    def _emit(self, record) -> None:
        self._out.append(record)

    def _take(self) -> list:
        out, self._out = self._out, []
        return out


def replay(rows: Iterable[Mapping], overdue_ns: int = r.DEFAULT_OVERDUE_NS) -> list:
    """Every record for `rows` (sorted by connection_id, seq), through to the end of the data."""
    timelines = Timelines(overdue_ns)
    out = []
    for row in rows:
        out += timelines.feed(row)
    return out + timelines.end_of_data()
