"""One channel incarnation: its two parts, the consumer side (consumer.py) and the publisher side
(publisher.py), and what touches both: transactions, the capture's blind spots, and the ways an
incarnation ends.

The incarnation owns its parts; each part keeps its own state and reads what it shares through its
`life` (this object): whether it ended or saw a gap, the other part's state it depends on, and
`out`, where records go. A frame row's transition is a method of one part or of the incarnation;
`ConnectionTimeline` picks it from its table. Records become final here and go out through
`connection.emit`. Nothing is guessed: what the capture cannot show (history before it,
bytes lost in a gap) ends as `unknown`.
"""

from __future__ import annotations

import re
from dataclasses import replace

from . import records as r
from .consumer import SETTLE_OUTCOMES, ConsumerSide
from .publisher import CLOSED_PUBLISH, OPEN_PUBLISH, PublisherSide

TO_BROKER, TO_CLIENT = "to_broker", "to_client"
UNKNOWN_TAG_TEXT = re.compile(r"unknown delivery tag (\d+)")


class ChannelLife:
    __slots__ = ("connection", "channel", "incarnation", "open_row", "history_known", "gap_seen", "gap_since_end",
                 "ended", "end_facts", "holding", "held", "tx_unanswered", "consumer", "publisher")

    def __init__(self, connection, channel: int, incarnation: int, row: dict, history_known: bool):
        self.connection = connection
        self.channel, self.incarnation = channel, incarnation
        self.open_row = row
        self.history_known = history_known  # opened in the capture with both directions in view
        self.gap_seen = False
        self.gap_since_end = False
        self.ended = None                   # (row, delivery outcome) once ended; late frames settle against it
        self.end_facts: dict = {}
        # After an AMQP close, records wait for the peer's close-ok: until then a gap in the peer's
        # direction (noticed late: reassembly holds what follows a hole) may hide what settled them.
        self.holding: str | None = None     # the peer's direction
        self.held: list = []
        self.tx_unanswered = 0              # tx.commit / tx.rollback awaiting their -ok
        self.consumer = ConsumerSide(self, history_known)
        self.publisher = PublisherSide(self, history_known)

    # -- transactions -------------------------------------------------------------------------------

    def tx_commit(self, row) -> None:
        consumer, publisher = self.consumer, self.publisher
        if self.ended or consumer.refusing or publisher.confirm or publisher.tx is False:
            return
        publisher.tx, publisher.confirm = True, False
        self.tx_unanswered += row["direction"] == TO_BROKER
        publisher.commit(row)
        consumer.commit(row)

    def tx_rollback(self, row) -> None:
        consumer, publisher = self.consumer, self.publisher
        if self.ended or consumer.refusing or publisher.confirm or publisher.tx is False:
            return
        publisher.tx, publisher.confirm = True, False
        self.tx_unanswered += row["direction"] == TO_BROKER
        publisher.roll_back(row)
        consumer.roll_back()

    def tx_reply(self, row) -> None:
        """tx.commit-ok / tx.rollback-ok. One with no commit or rollback in the data answers one
        lost in a gap not reported yet: it took effect."""
        if self.tx_unanswered:
            self.tx_unanswered -= 1
        elif row["method"] == "tx.commit-ok":
            self.tx_commit(row)
        else:
            self.tx_rollback(row)

    # -- the capture's blind spots ------------------------------------------------------------------

    def gap(self, row, direction: str) -> None:
        """Bytes of one direction are missing: whatever they could have changed becomes unknown."""
        self.gap_seen = True
        if self.ended:
            self.gap_since_end = True  # it may hide this life's close-ok and the next one's open
            if direction == self.holding:
                self.held = [self._unsettled_by_gap(x, direction) for x in self.held]
            return
        if direction == TO_BROKER:  # acks, commits, publishes, selects, qos may be in the gap
            self.consumer.client_gap(row)
            self.publisher.client_gap(row)
        else:  # confirms, returns, consume-ok, get-ok, deliveries may be in the gap
            self.consumer.broker_gap()
            self.publisher.broker_gap(row)

    # -- ends ---------------------------------------------------------------------------------------

    def close(self, row, delivery_outcome: str, ended_by: str, closed_by: str | None = None,
              peer: str | None = None) -> None:
        """The channel (or its connection) ended at `row`: unacked deliveries go back to their
        queue; unconfirmed and uncommitted publishes are lost. `peer`: the direction whose
        close-ok makes that final (None: final now)."""
        if self.ended:
            return
        self.ended = (row, delivery_outcome)
        self.holding = peer
        self.end_facts = dict(end_seq=row["seq"], end_ts_ns=row["ts_ns"], ended_by=ended_by, closed_by=closed_by)
        if closed_by is not None:
            self.end_facts.update(close_code=row.get("reply_code"), close_text=row.get("reply_text"),
                                  failing_method=row.get("failing_method"))
        if closed_by == "broker" and row.get("reply_code") == 406 and row.get("failing_method") in SETTLE_OUTCOMES:
            match = UNKNOWN_TAG_TEXT.search(row.get("reply_text") or "")
            self.consumer.broker_refused(row, int(match.group(1)) if match else None)
        self.consumer.end_deliveries(delivery_outcome, row)
        self.publisher.end_publishes(CLOSED_PUBLISH, row)
        self._done()

    def abandon(self, row, ended_by: str) -> None:
        """The data shows a new life of this channel number without this one's end."""
        if not self.ended:
            self.end_facts = dict(end_seq=row["seq"], end_ts_ns=row["ts_ns"], ended_by=ended_by)
            self.ended = (row, r.UNKNOWN)
            self.consumer.end_deliveries(r.UNKNOWN, row)
            self.publisher.end_publishes(None, row)
            self._done()

    def end_of_data(self, last_ts_ns: int) -> None:
        """The data ends with this channel open: nothing is lost, everything waiting stays open."""
        if not self.ended:
            self.end_facts = dict(ended_by="end_of_data", observed_until_ts_ns=last_ts_ns)
            self.ended = (None, r.OPEN)
            self.consumer.end_deliveries(r.OPEN, None, observed_until=last_ts_ns)
            self.publisher.end_publishes(OPEN_PUBLISH, None, observed_until=last_ts_ns)
            self._done()

    def _done(self) -> None:
        self.consumer.outstanding, self.consumer.early = {}, []
        self.publisher.flush_held()

    def release(self) -> None:
        """The peer's close-ok (or the end of the data): what the close decided is final."""
        held, self.held, self.holding = self.held, [], None
        for record in held:
            self.connection.emit(record)

    def out(self, record) -> None:
        """Where both parts send their final records: held while a close waits for its close-ok."""
        if self.holding is not None:
            self.held.append(record)
        else:
            self.connection.emit(record)

    @staticmethod
    def _unsettled_by_gap(record, direction: str):
        """A close's outcome the missing bytes could have changed: confirms (broker's direction)
        for lost publishes; acks and commits (client's direction) for requeued deliveries and
        uncommitted publishes."""
        if isinstance(record, r.Publish):
            hidden = record.outcome == r.LOST and (direction == TO_CLIENT or record.mode == r.TX)
        else:
            hidden = direction == TO_BROKER and record.outcome in (r.CHANNEL_CLOSED, r.CONNECTION_CLOSED)
        return replace(record, outcome=r.UNKNOWN, settle_ts_ns=None, settle_latency_ns=None) if hidden else record

    # -- what it leaves behind ----------------------------------------------------------------------

    def facts(self) -> r.ChannelFacts:
        end, c = self.end_facts, self.connection
        consumer, publisher = self.consumer, self.publisher
        return r.ChannelFacts.new(
            connection_id=c.id, agent_id=c.agent_id, channel=self.channel, incarnation=self.incarnation,
            open_seq=self.open_row["seq"], open_ts_ns=self.open_row["ts_ns"], history_known=self.history_known,
            gap_seen=self.gap_seen, end_seq=end.get("end_seq"), end_ts_ns=end.get("end_ts_ns"),
            ended_by=end.get("ended_by", "end_of_data"), closed_by=end.get("closed_by"),
            close_code=end.get("close_code"), close_text=end.get("close_text"),
            failing_method=end.get("failing_method"), confirm_mode=publisher.confirm, tx_mode=publisher.tx,
            consumer_prefetch=consumer.consumer_prefetch, channel_prefetch=consumer.channel_prefetch,
            consumes=consumer.consumes, unbounded_manual_consumes=consumer.unbounded_manual_consumes,
            deliveries=consumer.deliveries, publishes=publisher.publishes, peak_unacked=consumer.peak_unacked,
            observed_until_ts_ns=end.get("observed_until_ts_ns"))

    def violation_records(self) -> list[r.Violation]:
        c = self.connection
        return [r.Violation.new(connection_id=c.id, agent_id=c.agent_id, channel=self.channel,
                            incarnation=self.incarnation, **v) for v in self.consumer.violations]
