"""The kinds that follow one message across deliveries, channels and connections, sans-IO:
requeue_loop (one finding per message) and redelivery_after_close (one per closed channel
incarnation). The caller gathers the deliveries of each message wherever they went (the
pipeline's findings step, over Arrow: spark_jobs/cross_connection_findings.py) and hands them in here.

A message is known by `message_identity` (its message_id, else a hash of body, exchange and
routing key). Identical bodies share an identity, so a later delivery counts as the same message
coming back only when the broker says so: `redelivered` after a requeue, or a higher x-death
count after a dead-lettering. So a loop is made of the deliveries `in_loop` only: bounced ones and
those that came back. A plain delivery of an identical body (first delivered, not bounced) is
another message, wherever it falls between a bounce and its return.

    journey = Journey()                          # one message's deliveries,
    for row in rows:                             # in JOURNEY_ORDER
        journey.add(row)
    found = journey.finding(thresholds)          # (connection_id, RawFinding) or None

    for match in redelivered_after_close(rows):  # one message's deliveries, any order
        ...                                      # gathered by match.incarnation, then:
    found = after_close_finding(matches)         # (connection_id, RawFinding) of one incarnation

Rows are mappings with the schema.DELIVERIES columns in COLUMNS (and `connection_name`, the
connection's, for redelivered_after_close). What either kind reads of a table of deliveries is
picked by `candidates` (the same rule in Arrow, for whole tables: the writers flag those rows, and
spark_jobs/cross_connection_findings.py reads only them). Memory: a journey keeps running aggregates per channel
incarnation the message went through; redelivered_after_close the message's closed deliveries
and one entry per place it came back to; after_close_finding running aggregates.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from .common import MAX_EVIDENCE, Firsts, RawFinding, Tally, least, most

BOUNCED_BY = ("nack", "reject")
CLOSED = ("channel_closed", "connection_closed")

# The schema.DELIVERIES columns the kinds read.
COLUMNS = ("connection_id", "agent_id", "channel", "incarnation", "seq", "ts_ns", "delivery_tag", "message_id",
           "message_identity", "redelivered", "x_death_count", "outcome", "requeue", "settle_seq", "settle_ts_ns")
# A message's deliveries in the order they happened: across connections the capture clock; seq breaks
# ties within one.
JOURNEY_ORDER = ("ts_ns", "connection_id", "seq")

Place = tuple[str, int, int]  # (connection_id, channel, incarnation)


def came_back(d) -> bool:
    """A Delivery record (analyzer/timeline/records.py) of a known message the broker says it had
    delivered before (redelivered, or dead-lettered before): every finding of these kinds has one,
    so data without any has none (the pass counts them)."""
    return d.message_identity is not None and (d.redelivered is True or (d.x_death_count or 0) > 0)


def in_loop(d: Mapping) -> bool:
    """A delivery that can be part of a loop: a known message's bounced by the consumer, or come back."""
    return d["message_identity"] is not None and (
        d["outcome"] in BOUNCED_BY or d["redelivered"] is True or (d["x_death_count"] or 0) > 0)


def left_at_close(d: Mapping) -> bool:
    """Left unacked when its channel or connection closed: redelivery_after_close's starting point."""
    return d["outcome"] in CLOSED and d["settle_ts_ns"] is not None


def candidates(deliveries: pa.Table | pa.RecordBatch) -> pa.ChunkedArray | pa.Array:
    """Every delivery either kind reads, true or false for each row (its columns as COLUMNS'):
    `in_loop`, or a known message's `left_at_close`. The rules above, vectorised over Arrow, never
    null (tests/test_detectors.py holds the two forms to one answer over every combination of
    what they read)."""
    def known(values):
        return pc.fill_null(values, False)

    outcome = deliveries["outcome"]
    returning = pc.or_(known(pc.is_in(outcome, value_set=pa.array(BOUNCED_BY))),
                       pc.or_(known(deliveries["redelivered"]), known(pc.greater(deliveries["x_death_count"], 0))))
    closed = pc.and_(known(pc.is_in(outcome, value_set=pa.array(CLOSED))), pc.is_valid(deliveries["settle_ts_ns"]))
    return pc.and_(pc.is_valid(deliveries["message_identity"]), pc.or_(returning, closed))


def place_name(connection_id: str, channel: int) -> str:
    return f"{connection_id}#{channel}"


# -- requeue_loop ---------------------------------------------------------------------------------

class _Stay:
    """A message's deliveries on one channel incarnation."""
    __slots__ = ("agent_id", "n", "bounced", "x_death", "first_ns", "last_ns", "message_id", "items")

    def __init__(self):
        self.agent_id = self.x_death = self.first_ns = self.last_ns = self.message_id = None
        self.n = self.bounced = 0
        self.items = Firsts()   # (seq, delivery_tag) of the first MAX_EVIDENCE by seq

    def add(self, d: Mapping, bounced: bool) -> None:
        self.agent_id = least(self.agent_id, d["agent_id"])
        self.n += 1
        self.bounced += bounced
        self.x_death = most(self.x_death, d["x_death_count"])
        self.first_ns = least(self.first_ns, d["ts_ns"])
        settled = d["settle_ts_ns"]
        self.last_ns = most(self.last_ns, settled if settled is not None else d["ts_ns"])
        self.message_id = least(self.message_id, d["message_id"])
        self.items.add(d["seq"], (d["seq"], d["delivery_tag"]))

    def pin_key(self, place: Place) -> tuple:
        """Pinned to the place that bounced it most, then the highest x-death, then the first."""
        return (-self.bounced, 0 if self.x_death is not None else 1, -(self.x_death or 0), self.first_ns, *place)


class Journey:
    """One message's deliveries, fed in JOURNEY_ORDER; only those `in_loop` count. A bounce counts
    when the message came back after it: the next delivery in the loop is redelivered after a
    requeue, or has a higher x-death count."""
    __slots__ = ("identity", "stays", "_pending")

    def __init__(self):
        self.identity: str | None = None
        self.stays: dict[Place, _Stay] = {}
        self._pending: Mapping | None = None   # the last delivery: whether it bounced waits on the next

    def add(self, d: Mapping) -> None:
        if not in_loop(d):
            return
        if self._pending is not None:
            self._settle(self._pending, d)
        self.identity = d["message_identity"]
        self._pending = d

    def _settle(self, d: Mapping, following: Mapping | None) -> None:
        bounced = following is not None and d["outcome"] in BOUNCED_BY and (
            (d["requeue"] is True and following["redelivered"] is True)
            or (following["x_death_count"] or 0) > (d["x_death_count"] or 0))
        place = (d["connection_id"], d["channel"], d["incarnation"])
        stay = self.stays.get(place)
        if stay is None:
            stay = self.stays[place] = _Stay()
        stay.add(d, bounced)

    def finding(self, thresholds) -> tuple[str, RawFinding] | None:
        """The message's requeue_loop finding, if it is one: `requeue_loop_deliveries` deliveries in
        the loop, or an x-death count of `dead_letter_loop_count` (a dead-letter cycle whose earlier
        turns predate the data)."""
        if self._pending is not None:
            self._settle(self._pending, None)
            self._pending = None
        stays = self.stays
        n = sum(stay.n for stay in stays.values())
        x_death = None
        for stay in stays.values():
            x_death = most(x_death, stay.x_death)
        # Only a message delivered more than once, or dead-lettered before, can be in a loop.
        if not (n > 1 or (x_death or 0) > 0):
            return None
        bounces = sum(stay.bounced for stay in stays.values())
        loop = bounces + 1 if bounces > 0 else n
        by_deliveries = bounces > 0 and loop >= thresholds.requeue_loop_deliveries
        if not (by_deliveries or (x_death is not None and x_death >= thresholds.dead_letter_loop_count)):
            return None
        pinned = min(stays, key=lambda place: stays[place].pin_key(place))
        connection_id, channel, incarnation = pinned
        here = stays[pinned]
        message_id = None
        for stay in stays.values():
            message_id = least(message_id, stay.message_id)
        items = here.items.listed()
        dead = f" (dead-lettered {x_death} times)" if (x_death or 0) > 0 else ""
        summary = (f"Message {message_id if message_id is not None else self.identity} was delivered {loop} times "
                   f"and bounced back by basic.nack/basic.reject {bounces} times{dead}, most often on channel "
                   f"{channel}: a poison message in a loop; dead-letter it for good or limit its deliveries")
        places = sorted({place_name(c, ch) for c, ch, _ in stays})
        return connection_id, RawFinding(
            "requeue_loop", here.agent_id, channel, incarnation,
            first_ts_ns=min(stay.first_ns for stay in stays.values()),
            last_ts_ns=max(stay.last_ns for stay in stays.values()), count=loop, summary=summary,
            # Frame seqs only mean something within their connection: the pinned place's.
            evidence={"seqs": [seq for seq, _ in items], "tags": [tag for _, tag in items], "message_id": message_id,
                      "deliveries": n, "bounces": bounces, "x_death_max": x_death,
                      "channels": places[:MAX_EVIDENCE]},
            # The measure that fired: deliveries in the loop, else the x-death count of a dead-letter cycle.
            value=float(loop if by_deliveries else x_death),
            threshold=float(thresholds.requeue_loop_deliveries if by_deliveries
                            else thresholds.dead_letter_loop_count),
            message_identity=self.identity)


# -- redelivery_after_close -----------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Redelivered:
    """A delivery left unacked at a close whose message was delivered again (redelivered) elsewhere
    afterwards: one item of its incarnation's redelivery_after_close finding."""
    connection_id: str
    channel: int
    incarnation: int
    seq: int
    agent_id: str | None
    ts_ns: int
    close_ns: int              # when the close settled it
    close_seq: int | None
    outcome: str               # channel_closed or connection_closed
    delivery_tag: int
    message_identity: str
    on: Sequence[str]          # connection_name (else connection_id) of each place it came back to, sorted
    places: Sequence[str]      # those places as connection_id#channel, sorted


def redelivered_after_close(deliveries: Iterable[Mapping]) -> list[Redelivered]:
    """Of one message's deliveries (any order): each left at a close that came back (redelivered)
    on another channel incarnation at or after the close."""
    closed, again = [], {}   # again: place -> (last ts_ns redelivered there, its connection's name)
    for d in deliveries:
        if left_at_close(d):
            closed.append(d)
        if d["redelivered"] is True:
            place = (d["connection_id"], d["channel"], d["incarnation"])
            last = again.get(place)
            name = d.get("connection_name")
            again[place] = (most(last[0] if last else None, d["ts_ns"]), name if name is not None else place[0])
    found = []
    for d in closed:
        here = (d["connection_id"], d["channel"], d["incarnation"])
        back = [(place, name) for place, (last_ns, name) in again.items()
                if place != here and last_ns is not None and last_ns >= d["settle_ts_ns"]]
        if back:
            found.append(Redelivered(
                *here, d["seq"], d["agent_id"], d["ts_ns"], d["settle_ts_ns"], d["settle_seq"], d["outcome"],
                d["delivery_tag"], d["message_identity"], tuple(sorted({name for _, name in back})),
                tuple(sorted({place_name(c, ch) for (c, ch, _), _ in back}))))
    return found


def after_close_finding(matches: Iterable[Redelivered]) -> tuple[str, RawFinding] | None:
    """The redelivery_after_close finding of one channel incarnation, from its Redelivered items:
    whatever the first consumer did with them may happen twice."""
    tally, on, places = Tally(), set(), set()
    outcome = close_seq = where = None
    for m in matches:
        where = (m.connection_id, m.channel, m.incarnation)
        tally.add(m.agent_id, m.ts_ns, m.close_ns, m.seq, (m.seq, m.delivery_tag, m.message_identity))
        outcome, close_seq = least(outcome, m.outcome), most(close_seq, m.close_seq)
        on.update(m.on)
        places.update(m.places)
    if where is None:
        return None
    on, items = sorted(on), tally.items.listed()
    ended = outcome.removesuffix("_closed")
    summary = (f"{tally.n} deliveries left unacked on channel {where[1]} when its {ended} closed were delivered "
               f"again (redelivered) on {', '.join(on[:5])}: work done on them before the close may be done twice")
    return where[0], RawFinding(
        "redelivery_after_close", tally.agent_id, where[1], where[2], tally.first_ns, tally.last_ns, tally.n,
        summary, {"seqs": [i[0] for i in items], "tags": [i[1] for i in items],
                  "message_identities": [i[2] for i in items], "ended_by": outcome, "end_seq": close_seq,
                  "redelivered_on": on[:MAX_EVIDENCE], "redelivered_on_channels": sorted(places)[:MAX_EVIDENCE]})
