"""The publisher side of a channel incarnation: publishes, confirm numbering and confirms, returns.

After confirm.select both sides number the client's publishes from 1; the broker answers each
with one basic.ack or basic.nack (multiple: every number up to the tag; tag 0: all). The numbering
is used only when the capture saw the select with the channel's mode known before it ("aligned").

The channel's modes (`confirm`, `tx`) live here; the consumer side and the incarnation read them.
What it shares with the rest of its incarnation it reads through `life` (channel.ChannelLife):
whether the incarnation ended or saw a gap, whether the broker is refusing the client after a
violation (`life.consumer.refusing`), and `out`, where its records go.
"""

from __future__ import annotations

from . import records as r
from .consumer import settle_point, up_to

CONFIRM_OUTCOMES = {"basic.ack": r.ACKED, "basic.nack": r.NACKED}
# What a publish still waiting for its confirm or commit becomes when its channel ends, or the data does.
CLOSED_PUBLISH = {r.CONFIRM: r.LOST, r.TX: r.LOST, r.NONE: r.UNTRACKED, r.UNKNOWN: r.UNKNOWN}
OPEN_PUBLISH = {r.CONFIRM: r.OPEN, r.TX: r.OPEN, r.NONE: r.UNTRACKED, r.UNKNOWN: r.UNKNOWN}


class _Publish:
    __slots__ = ("row", "mode", "confirm_seq", "pending_before", "outcome", "settle", "confirm",
                 "out_of_order_by", "returned", "observed_until")

    def __init__(self, row, mode):
        self.row, self.mode = row, mode
        self.confirm_seq = self.pending_before = self.outcome = self.settle = None
        self.confirm = self.out_of_order_by = self.returned = self.observed_until = None


class PublisherSide:
    __slots__ = ("life", "confirm", "tx", "aligned", "next_confirm", "pending", "tx_publishes", "discarded",
                 "awaiting_return", "early_confirms", "early_multiple", "answered_select", "publishes")

    def __init__(self, life, history_known: bool) -> None:
        self.life = life
        self.confirm = self.tx = (False if history_known else None)  # None: not known
        self.aligned = False
        self.next_confirm = 0
        self.pending: dict[int, _Publish] = {}          # confirm_seq -> publish, in publish order
        self.tx_publishes: list[_Publish] = []
        self.discarded: list[_Publish] = []             # sent after a violation: the broker drops them
        self.awaiting_return: dict[int, _Publish] = {}  # row seq -> mandatory publish a return may still name
        # Confirms the capture showed before their publish (it reorders the two directions).
        self.early_confirms: dict[int, dict] = {}       # confirm number -> single basic.ack/nack row
        self.early_multiple: tuple | None = None        # (tag, row) of a multiple confirm past the last publish
        self.answered_select: bool | None = None        # a confirm.select-ok without its select: was the mode known?
        self.publishes = 0

    @property
    def mode(self) -> str:
        if self.tx:
            return r.TX
        if self.confirm:
            return r.CONFIRM
        if self.tx is False and self.confirm is False:
            return r.NONE
        return r.UNKNOWN

    def confirm_select(self, row) -> None:
        if self.answered_select is not None:  # its select-ok came first (the capture reordered them)
            self.aligned, self.answered_select = self.answered_select, None
            return
        if self.tx or self.confirm or self.life.ended:
            return  # on a tx channel the broker refuses; selecting twice keeps the count going
        self.aligned = self.confirm is False and self.tx is False
        self.confirm, self.tx, self.next_confirm = True, False, 0

    def tx_select(self, row) -> None:
        if self.confirm or self.life.ended:
            return  # not allowed on a confirm-mode channel: the broker closes it
        self.tx, self.confirm = True, False

    def select_ok(self, row) -> None:
        """confirm.select-ok / tx.select-ok: the broker's reply shows the mode even when the select
        itself is not in the data (before the capture, or in a gap not reported yet)."""
        if self.life.ended or self.tx or self.confirm:
            return
        if row["method"] == "tx.select-ok":
            self.tx, self.confirm = True, False
        else:  # numbering unknown: publishes since the select may be unseen, unless the select shows up next
            self.answered_select = self.confirm is False and self.tx is False
            self.confirm, self.tx, self.aligned, self.next_confirm = True, False, False, 0

    def publish(self, row) -> None:
        p = _Publish(row, self.mode)
        self.publishes += 1
        self.answered_select = None
        life = self.life
        if life.ended:
            self._finish(p, CLOSED_PUBLISH[p.mode], life.ended[0])
            return
        if row.get("mandatory"):  # held until a basic.return names it or no return can come
            self.awaiting_return[row["seq"]] = p
        if life.consumer.refusing:
            self.discarded.append(p)
        elif p.mode == r.CONFIRM and self.aligned:
            self.next_confirm += 1
            p.confirm_seq = self.next_confirm
            p.pending_before = None if life.gap_seen else len(self.pending)
            self.pending[p.confirm_seq] = p
            self._early_confirm_for(p.confirm_seq)
        elif p.mode == r.TX:
            self.tx_publishes.append(p)
        else:
            self._finish(p, r.UNTRACKED if p.mode == r.NONE else r.UNKNOWN, None)

    def broker_confirm(self, row) -> None:
        if self.life.ended:
            return  # after the client's close it discards them
        if self.confirm is None and not self.tx:
            self.confirm, self.tx = True, False  # only a confirm-mode channel gets these
        tag = row.get("delivery_tag")
        if not self.confirm or tag is None:
            return
        multiple = bool(row.get("multiple"))
        if multiple:
            done = list(self.pending) if tag == 0 else up_to(self.pending, tag)
            if self.aligned and tag > self.next_confirm:
                self.early_multiple = (tag, row)
        elif tag in self.pending:
            done = [tag]
        else:
            done = []
            if self.aligned and tag > self.next_confirm:
                self.early_confirms[tag] = row
        for number in done:
            self._confirmed(number, row, multiple)

    def _early_confirm_for(self, number: int) -> None:
        row, multiple = self.early_confirms.pop(number, None), False
        if row is None and self.early_multiple is not None and number <= self.early_multiple[0]:
            row, multiple = self.early_multiple[1], True
        if self.early_multiple is not None and number >= self.early_multiple[0]:
            self.early_multiple = None
        if row is not None:
            self._confirmed(number, row, multiple)

    def _confirmed(self, number: int, row, multiple: bool) -> None:
        p = self.pending.pop(number)
        # How far ahead of the oldest publish still waiting it was confirmed, in confirm numbers: a
        # distance, not a count of what overtook it, so the Spark job can compute it without a self-join.
        oldest = next(iter(self.pending), None)
        p.out_of_order_by = number - oldest if oldest is not None and oldest < number and not multiple else 0
        p.confirm = (row["delivery_tag"], multiple)
        self.awaiting_return.pop(p.row["seq"], None)  # a return always comes before the confirm
        self._finish(p, CONFIRM_OUTCOMES[row["method"]], row)

    def returned(self, row) -> None:
        """basic.return: the earliest mandatory publish not yet confirmed or returned with the same
        message identity (or exchange and routing key when an identity is missing)."""
        if self.life.ended:
            return
        identity = row.get("message_identity")
        for seq, p in self.awaiting_return.items():
            sent = p.row
            if (identity == sent.get("message_identity") if identity and sent.get("message_identity")
                    else (row.get("exchange"), row.get("routing_key")) == (sent.get("exchange"), sent.get("routing_key"))):
                p.returned = row
                del self.awaiting_return[seq]
                if p.outcome is not None:
                    self._emit_publish(p)
                return

    # -- the incarnation's transactions and gaps (channel.py) ---------------------------------------

    def commit(self, row) -> None:
        for p in self.tx_publishes:
            self._finish(p, r.COMMITTED, row)
        self.tx_publishes = []

    def roll_back(self, row) -> None:
        for p in self.tx_publishes:
            self.awaiting_return.pop(p.row["seq"], None)  # never routed: nothing to return
            self._finish(p, r.ROLLED_BACK, row)
        self.tx_publishes = []

    def client_gap(self, row) -> None:
        """Publishes, commits and selects may be in the client's missing bytes."""
        for p in self.tx_publishes + self.discarded:
            self._finish(p, r.UNKNOWN, row, timed=False)
        self.tx_publishes, self.discarded = [], []
        self.aligned = False  # a publish in the gap would shift every later number
        self.early_confirms, self.early_multiple, self.answered_select = {}, None, None
        self.confirm = self.confirm or None
        self.tx = self.tx or None

    def broker_gap(self, row) -> None:
        """Confirms and returns may be in the broker's missing bytes."""
        for p in self.pending.values():
            self.awaiting_return.pop(p.row["seq"], None)
            self._finish(p, r.UNKNOWN, row, timed=False)
        self.pending = {}

    def end_publishes(self, outcomes: dict | None, at, observed_until=None) -> None:
        """Everything still waiting for a confirm or commit ends (`outcomes` by mode; None: unknown)."""
        overdue_ns = self.life.connection.overdue_ns
        for p in list(self.pending.values()) + self.tx_publishes + self.discarded:
            outcome = r.UNKNOWN if outcomes is None else outcomes[p.mode]
            if p.mode == r.CONFIRM and p.confirm_seq is None and outcome == r.OPEN:
                outcome = r.UNKNOWN  # dropped after a violation, but the data ends before the close
            if outcome == r.OPEN and observed_until - p.row["ts_ns"] > overdue_ns:
                outcome = r.OVERDUE
            p.observed_until = observed_until if outcome in (r.OPEN, r.OVERDUE) else None
            self._finish(p, outcome, at, timed=outcomes is not None)
        self.pending, self.tx_publishes, self.discarded = {}, [], []
        self.early_confirms, self.early_multiple = {}, None

    def flush_held(self) -> None:
        held, self.awaiting_return = self.awaiting_return, {}
        for p in held.values():
            if p.outcome is not None:
                self._emit_publish(p)

    def _finish(self, p: _Publish, outcome: str, at, timed: bool = True) -> None:
        p.outcome = outcome
        p.settle = settle_point(p.row, at, timed and outcome not in (r.OPEN, r.OVERDUE, r.UNKNOWN, r.UNTRACKED))
        if p.row["seq"] not in self.awaiting_return:
            self._emit_publish(p)

    def _emit_publish(self, p: _Publish) -> None:
        row, life = p.row, self.life
        c = life.connection
        settle_seq, settle_ts = p.settle or (None, None)
        confirm_tag, confirm_multiple = p.confirm or (None, None)
        delivery_mode = row.get("delivery_mode")
        persistent = (delivery_mode == 2) if delivery_mode is not None else (
            None if row.get("body_size") is None else False)
        ret = p.returned or {}
        life.out(r.Publish.new(
            connection_id=c.id, agent_id=c.agent_id, channel=life.channel, incarnation=life.incarnation,
            channel_open_seq=life.open_row["seq"], seq=row["seq"], ts_ns=row["ts_ns"],
            exchange=row.get("exchange"), routing_key=row.get("routing_key"), mandatory=row.get("mandatory"),
            persistent=persistent, message_id=row.get("message_id"), message_identity=row.get("message_identity"),
            mode=p.mode, confirm_seq=p.confirm_seq, pending_before=p.pending_before, outcome=p.outcome,
            confirm_tag=confirm_tag, confirm_multiple=confirm_multiple,
            out_of_order=None if p.out_of_order_by is None else p.out_of_order_by > 0,
            out_of_order_by=p.out_of_order_by, return_code=ret.get("reply_code"), return_text=ret.get("reply_text"),
            return_seq=ret.get("seq"), settle_seq=settle_seq, settle_ts_ns=settle_ts,
            settle_latency_ns=None if settle_ts is None else settle_ts - row["ts_ns"],
            observed_until_ts_ns=p.observed_until))
