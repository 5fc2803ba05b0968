"""The consumer side of a channel incarnation: deliveries and the client's acks, nacks and rejects.

Tags rise by one per delivery within an incarnation, so `outstanding` (tag -> delivery) stays in
tag order and "delivered here" means 1 <= tag <= max_tag on an incarnation seen whole.

What it shares with the rest of its incarnation it reads through `life` (channel.ChannelLife):
whether the incarnation ended or saw a gap, its transaction mode (`life.publisher.tx`), and `out`,
where its records go.
"""

from __future__ import annotations

from functools import partial
from itertools import takewhile
from operator import ge

from . import records as r

SETTLE_OUTCOMES = {"basic.ack": r.ACK, "basic.nack": r.NACK, "basic.reject": r.REJECT}


def up_to(by_number: dict, number: int) -> list[int]:
    """Keys up to `number` of a dict kept in ascending key order."""
    return list(takewhile(partial(ge, number), by_number))  # number >= key, without a Python call per key


def settle_point(item_row, at, timed: bool):
    """(settle_seq, settle_ts_ns): the row `at`, or the item's own row if that came later (a frame
    in flight when its channel ended, or an ack the capture showed before its delivery)."""
    if at is None:
        return None, None
    row = at if at["seq"] >= item_row["seq"] else item_row
    return row["seq"], (row["ts_ns"] if timed else None)


class _Delivery:
    __slots__ = ("row", "tag", "consumer_tag", "queue", "no_ack", "consumer_prefetch", "channel_prefetch")

    def __init__(self, row, tag, consumer_tag, queue, no_ack, consumer_prefetch, channel_prefetch):
        self.row, self.tag = row, tag
        self.consumer_tag, self.queue, self.no_ack = consumer_tag, queue, no_ack
        self.consumer_prefetch, self.channel_prefetch = consumer_prefetch, channel_prefetch


_new_delivery = r.maker(_Delivery, _Delivery.__slots__)  # one per delivery: made in C where built


class _EarlyAck:
    """An ack naming a tag not delivered yet. Captures reorder the two directions (the decoder
    tolerates ACKs ahead of data), so it waits for its delivery; if the broker instead closes the
    channel with 406, it was a violation."""
    __slots__ = ("row", "tag", "multiple", "kind", "where")

    def __init__(self, row, tag, multiple, kind, where):
        self.row, self.tag, self.multiple, self.kind, self.where = row, tag, multiple, kind, where


class ConsumerSide:
    __slots__ = ("life", "consumers", "cancelled", "pending_consume", "pending_get", "outstanding", "tx_settled",
                 "early", "proven_manual", "first_tag", "max_tag", "consumer_prefetch", "channel_prefetch", "unacked",
                 "peak_unacked", "consumes", "unbounded_manual_consumes", "deliveries", "violations", "refusing",
                 "refused")

    def __init__(self, life, history_known: bool) -> None:
        self.life = life
        self.consumers: dict[str, tuple] = {}  # consumer tag -> (queue, no_ack, consumer prefetch)
        # Cancelled consumers stay in `consumers`: deliveries in flight still name them.
        self.cancelled: set[str] = set()
        # Consume (without nowait) and get are synchronous: at most one awaits its reply.
        self.pending_consume: tuple | None = None
        self.pending_get: tuple | None = None
        self.outstanding: dict = {}             # tag -> _Delivery, in tag order
        self.tx_settled: list[tuple] = []       # (delivery, outcome, frame row, multiple, requeue)
        self.early: list[_EarlyAck] = []
        self.proven_manual: set[str] = set()    # consumers whose exact tags the client acked
        self.first_tag = self.max_tag = 0
        known = 0 if history_known else None
        self.consumer_prefetch = self.channel_prefetch = known
        self.unacked = self.peak_unacked = 0
        self.consumes = self.unbounded_manual_consumes = self.deliveries = 0
        self.violations: list[dict] = []
        self.refusing = False  # a violation was sent: the broker ignores the client until it closes
        self.refused = False   # the broker closed the channel over a bad ack

    def qos(self, row) -> None:
        count = row.get("prefetch_count")
        if count is None or self.life.ended:
            return
        if row.get("prefetch_global"):
            self.channel_prefetch = count
        else:
            self.consumer_prefetch = count

    def consume(self, row) -> None:
        life = self.life
        if life.ended:
            return
        no_ack = bool(row.get("no_ack"))
        self.consumes += 1
        if (not no_ack and life.history_known and not life.gap_seen
                and self.consumer_prefetch == 0 and self.channel_prefetch == 0):
            self.unbounded_manual_consumes += 1
        consumer = (row.get("queue"), no_ack, self.consumer_prefetch)
        if row.get("nowait") and row.get("consumer_tag"):
            self.consumers[row["consumer_tag"]] = consumer
        else:
            self.pending_consume = consumer

    def consume_ok(self, row) -> None:
        if self.pending_consume is not None and row.get("consumer_tag") is not None:
            self.consumers[row["consumer_tag"]], self.pending_consume = self.pending_consume, None

    def cancelled_consumer(self, row) -> None:
        """basic.cancel-ok, or the broker's basic.cancel (queue deleted): no more deliveries for it."""
        if row.get("consumer_tag") is not None:
            self.cancelled.add(row["consumer_tag"])

    def get(self, row) -> None:
        if not self.life.ended:
            self.pending_get = (row.get("queue"), bool(row.get("no_ack")))

    def get_empty(self, row) -> None:
        self.pending_get = None

    def deliver(self, row) -> None:
        """basic.deliver / basic.get-ok: a new delivery with the next tag."""
        tag = row["delivery_tag"]
        if row["method"] == "basic.get-ok":
            queue, no_ack = self.pending_get or (None, None)
            self.pending_get = None
            d = _new_delivery(row, tag, None, queue, no_ack, None, None)
        else:
            consumer_tag = row.get("consumer_tag")
            queue, no_ack, prefetch = self.consumers.get(consumer_tag, (None, None, None))
            d = _new_delivery(row, tag, consumer_tag, queue, no_ack, prefetch, self.channel_prefetch)
        self.deliveries += 1
        self.first_tag = self.first_tag or tag
        self.max_tag = tag
        ended = self.life.ended
        if ended:
            self._settle(d, r.AUTO if d.no_ack else self._fate(d, ended[1]), row if d.no_ack else ended[0])
            return
        if d.no_ack:
            self._settle(d, r.AUTO, row)
        else:
            self._put(d)
        if self.early:
            self._early_acks_for(tag)

    def client_settle(self, row) -> None:
        """basic.ack / basic.nack / basic.reject from the client, as RabbitMQ's collect_acks: the
        named tag must be outstanding, even with multiple=true; tag 0 with multiple is everything."""
        life = self.life
        if life.ended or self.refusing:
            return  # the broker discards them
        method, tag = row["method"], row.get("delivery_tag")
        if tag is None:
            return
        multiple = bool(row.get("multiple")) and method != "basic.reject"
        if multiple and tag == 0:
            self._apply(row, True, list(self.outstanding))
        elif tag in self.outstanding:
            exact = self.outstanding[tag]
            if exact.consumer_tag is not None:
                self.proven_manual.add(exact.consumer_tag)
            self._apply(row, multiple, up_to(self.outstanding, tag) if multiple else [tag])
        elif tag > self.max_tag:
            where = life.connection.outstanding_elsewhere(tag, life)
            self.early.append(_EarlyAck(row, tag, multiple, r.WRONG_CHANNEL if where else r.UNKNOWN_TAG, where))
            if multiple:  # whatever it covers that was delivered already goes now
                self._apply(row, True, list(self.outstanding))
        elif life.history_known and not life.gap_seen and (tag >= 1 or not multiple):
            self._violation(row, r.DOUBLE_ACK if tag >= 1 else r.UNKNOWN_TAG, None)
            self.refusing = True
        elif multiple:  # the tag may predate the capture or hide in a gap: what we saw up to it goes
            self._apply(row, True, up_to(self.outstanding, tag))

    def _apply(self, row, multiple: bool, tags: list[int]) -> None:
        method, named = row["method"], row.get("delivery_tag")
        outcome, requeue = SETTLE_OUTCOMES[method], (row.get("requeue") if method != "basic.ack" else None)
        in_tx = self.life.publisher.tx
        for t in tags:
            d = self._take(t)
            if d.no_ack is None and t != named and d.consumer_tag not in self.proven_manual:
                # Its consumer's ack mode is not known: if auto-ack, a multiple ack never covered it.
                self._settle(d, r.UNKNOWN, row, frame=row, by_multiple=multiple, requeue=requeue)
            elif in_tx:
                self.tx_settled.append((d, outcome, row, multiple, requeue))
            else:
                self._settle(d, outcome, row, frame=row, by_multiple=multiple, requeue=requeue, in_tx=False)

    def _early_acks_for(self, tag: int) -> None:
        """A delivery arrived: early acks naming it (or, with multiple, a higher tag) settle it;
        early acks naming a lower tag never will (tags only rise) and are dropped."""
        held = []
        seen_whole = self.life.history_known and not self.life.gap_seen
        for e in self.early:
            if e.tag < tag or self.refusing:
                continue
            d = self.outstanding.get(tag)
            if d is None and e.tag == tag and seen_whole:
                self._violation(e.row, r.DOUBLE_ACK, None)  # it named an auto-ack delivery: settled on send
                self.refusing = True
            elif d is not None and (e.tag == tag or e.multiple):
                if e.tag == tag and d.consumer_tag is not None:
                    self.proven_manual.add(d.consumer_tag)
                self._apply(e.row, e.multiple, [tag])
            if e.tag > tag:
                held.append(e)
        self.early = [] if self.refusing else held

    def recover(self, row) -> None:
        """basic.recover / recover-async: the broker re-sends every unacked delivery (new tags)."""
        if self.life.ended or self.refusing:
            return
        for t in list(self.outstanding):
            d = self._take(t)
            self._settle(d, self._fate(d, r.RECOVERED), row, frame=row, requeue=row.get("requeue"))

    # -- the incarnation's transactions and gaps (channel.py) ---------------------------------------

    def commit(self, row) -> None:
        """tx.commit: the acks the transaction held take effect."""
        for d, outcome, frame, by_multiple, requeue in self.tx_settled:
            self._settle(d, outcome, row, frame=frame, by_multiple=by_multiple, requeue=requeue, in_tx=True)
        self.tx_settled = []

    def roll_back(self) -> None:
        """tx.rollback: the acks are undone, their deliveries unacked again."""
        for d, *_ in self.tx_settled:
            self._put(d)
        self.outstanding = dict(sorted(self.outstanding.items()))
        self.tx_settled = []

    def client_gap(self, row) -> None:
        """Acks, qos and consumes may be in the client's missing bytes."""
        self.end_deliveries(r.UNKNOWN, row)
        self.consumer_prefetch = self.channel_prefetch = None
        self.pending_consume = self.pending_get = None

    def broker_gap(self) -> None:
        """A consume-ok or get-ok may be in the broker's missing bytes."""
        self.pending_consume = self.pending_get = None

    # -- violations ---------------------------------------------------------------------------------

    def _violation(self, frame, kind: str, where, close=None) -> None:
        """A violation seen in the capture: `frame` is the client's bad ack, nack or reject."""
        method = frame["method"]
        self._record_violation(frame, kind, r.FROM_CAPTURE, method, frame.get("delivery_tag"),
                               bool(frame.get("multiple")) and method != "basic.reject", where, close)

    def _record_violation(self, at, kind, evidence, method, tag, multiple, where, close) -> None:
        self.violations.append(dict(
            seq=at["seq"], ts_ns=at["ts_ns"], kind=kind, evidence=evidence, method=method, delivery_tag=tag,
            multiple=multiple, delivered_channel=where and where.channel,
            delivered_incarnation=where and where.incarnation, broker_close_seq=close and close["seq"],
            broker_reply_code=close and close.get("reply_code"), broker_reply_text=close and close.get("reply_text")))

    def broker_refused(self, close, tag_in_text: int | None) -> None:
        """The broker closed the channel with 406 over an ack: it answers the violation we saw, or
        an early ack that never met its delivery, or it is the only evidence there is."""
        self.refused = True
        life = self.life
        for v in self.violations:
            if v["broker_close_seq"] is None:
                v.update(broker_close_seq=close["seq"], broker_reply_code=close.get("reply_code"),
                         broker_reply_text=close.get("reply_text"))
                return
        if self.early and life.history_known and not life.gap_seen:
            named = [e for e in self.early if e.tag == tag_in_text]
            e = (named or self.early)[0]
            self._violation(e.row, e.kind, e.where, close=close)
            return
        if tag_in_text is not None and self.first_tag and self.first_tag <= tag_in_text <= self.max_tag \
                and not life.gap_seen:
            kind, where = r.DOUBLE_ACK, None
        else:
            where = life.connection.outstanding_elsewhere(tag_in_text, life) if tag_in_text is not None else None
            kind = r.WRONG_CHANNEL if where else r.UNKNOWN_TAG
        self._record_violation(close, kind, r.FROM_BROKER, close.get("failing_method"), tag_in_text, None, where,
                               close)

    # -- helpers ------------------------------------------------------------------------------------

    def _fate(self, d: _Delivery, outcome: str) -> str:
        """An unsettled delivery's outcome when its channel ends, recovers or the data ends. If its
        consumer's ack mode was never captured it may have been auto-acked: unknown, unless the
        client acked one of that consumer's exact tags (an auto-ack tag cannot be acked)."""
        if d.no_ack is None and (d.consumer_tag not in self.proven_manual or self.refused):
            return r.UNKNOWN
        return outcome

    def _take(self, tag: int) -> _Delivery:
        d = self.outstanding.pop(tag)
        if d.no_ack is False:
            self.unacked -= 1
        return d

    def _put(self, d: _Delivery) -> None:
        self.outstanding[d.tag] = d
        if d.no_ack is False:
            self.unacked += 1
            self.peak_unacked = max(self.peak_unacked, self.unacked)

    def end_deliveries(self, outcome: str, at, observed_until=None) -> None:
        """Everything unsettled (outstanding, or acked in an uncommitted transaction) ends as `outcome`."""
        for t in list(self.outstanding):
            d = self._take(t)
            self._settle(d, outcome if outcome == r.UNKNOWN else self._fate(d, outcome), at,
                         observed_until=observed_until)
        for d, *_ in self.tx_settled:
            self._settle(d, outcome if outcome == r.UNKNOWN else self._fate(d, outcome), at,
                         observed_until=observed_until)
        self.tx_settled = []

    def _settle(self, d: _Delivery, outcome: str, at, *, frame=None, by_multiple=None, requeue=None,
                in_tx=None, observed_until=None) -> None:
        row, life = d.row, self.life
        c = life.connection
        settle_seq, settle_ts = settle_point(row, at, outcome not in (r.OPEN, r.UNKNOWN))
        by_ack = frame is not None and frame["method"] in SETTLE_OUTCOMES
        life.out(r.Delivery.new(
            connection_id=c.id, agent_id=c.agent_id, channel=life.channel, incarnation=life.incarnation,
            channel_open_seq=life.open_row["seq"], seq=row["seq"], ts_ns=row["ts_ns"], method=row["method"],
            delivery_tag=d.tag, consumer_tag=d.consumer_tag, queue=d.queue, exchange=row.get("exchange"),
            routing_key=row.get("routing_key"), message_id=row.get("message_id"),
            message_identity=row.get("message_identity"), redelivered=row.get("redelivered"),
            x_death_count=row.get("x_death_count"), no_ack=d.no_ack, consumer_prefetch=d.consumer_prefetch,
            channel_prefetch=d.channel_prefetch, outcome=outcome,
            settled_by_multiple=by_multiple if by_ack else None,
            settle_tag=frame.get("delivery_tag") if by_ack else None,
            requeue=requeue, in_tx=in_tx, settle_frame_seq=frame["seq"] if frame is not None else None,
            settle_seq=settle_seq, settle_ts_ns=settle_ts,
            settle_latency_ns=None if settle_ts is None else settle_ts - row["ts_ns"],
            observed_until_ts_ns=observed_until if outcome == r.OPEN else None))
