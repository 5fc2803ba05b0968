"""Consumer-side kinds, one finding per channel incarnation: unacked_buildup (from Delivery
records), unbounded_prefetch (ChannelFacts and manual basic.consume frames), unknown_delivery_tag
(Violation records).

`open` deliveries were still unacked when the data ended (they age until `observed_until_ts_ns`);
`unknown` ones (a capture gap, a consumer whose ack mode the data does not show) are left out: how
long they stayed unacked cannot be known.
"""

from __future__ import annotations

from .. import folds
from ..timeline import records as r
from .common import (Firsts, Incarnation, RawFinding, Tally, column, fixed, least, most, nulls_first, seconds,
                     text)
from .context import Context, FramesByIncarnation
from .profile import Profile

# Outcomes that end a delivery's unacked time, and those only the client's own frames give.
SETTLED = frozenset((r.ACK, r.NACK, r.REJECT, r.RECOVERED, r.CHANNEL_CLOSED, r.CONNECTION_CLOSED))
SETTLED_BY_CLIENT = frozenset((r.ACK, r.NACK, r.REJECT))


def _scope_add(scope: Profile, d: r.Delivery, limit: int | None, settle_key: int | None) -> None:
    scope.limit = most(scope.limit, limit)
    scope.end_ns = most(scope.end_ns, d.observed_until_ts_ns)
    scope.add(d.seq * 2, d.ts_ns)
    if settle_key is not None:
        scope.add(settle_key, d.settle_ts_ns)


class _Buildup:
    """One incarnation's manual-ack deliveries: the oldest, those past each threshold, and the
    profile (profile.py) of each scope they count in: the channel (every manual delivery; its
    limit the global basic.qos) and each consumer with a per-consumer limit."""
    __slots__ = ("agent_id", "oldest_ns", "oldest", "by_age", "by_stall", "channel_scope", "consumer_scopes")
    ITEM_FIELDS = ("seq", "delivery_tag")  # of each item of by_age and by_stall

    def __init__(self):
        self.agent_id, self.oldest_ns, self.oldest = None, None, None
        self.by_age, self.by_stall = Tally(), Tally()
        self.channel_scope = Profile()
        self.consumer_scopes: dict[str, Profile] = {}  # "consumer TAG" -> its profile

    def add(self, d: r.Delivery, until_ns: int, age_limit_ns: int, stall_limit_ns: int) -> None:
        age = until_ns - d.ts_ns
        self.agent_id = least(self.agent_id, d.agent_id)
        if self.oldest_ns is None or age > self.oldest_ns or (age == self.oldest_ns and d.seq < self.oldest[1]):
            self.oldest_ns, self.oldest = age, (d.delivery_tag, d.seq)
        if age >= age_limit_ns or age >= stall_limit_ns:
            item = {"seq": d.seq, "delivery_tag": d.delivery_tag}
            if age >= age_limit_ns:
                self.by_age.add(None, d.ts_ns, until_ns, d.seq, item)
            if age >= stall_limit_ns:
                self.by_stall.add(None, d.ts_ns, until_ns, d.seq, item)
        # A settlement shown on its delivery's own row comes after it (odd key).
        settle_key = ((d.settle_seq if d.settle_seq is not None else d.seq) * 2 + 1) if d.outcome in SETTLED else None
        delivered = d.method == "basic.deliver"
        _scope_add(self.channel_scope, d, d.channel_prefetch if delivered else None, settle_key)
        # basic.get ignores prefetch: only basic.deliver rows belong to a consumer's scope.
        if delivered and d.consumer_prefetch is not None and d.consumer_prefetch > 0:
            name = "consumer " + (d.consumer_tag or "")
            scope = self.consumer_scopes.get(name)
            if scope is None:
                scope = self.consumer_scopes[name] = Profile()
            _scope_add(scope, d, d.consumer_prefetch, settle_key)

    def scopes(self):
        yield "channel", self.channel_scope
        yield from self.consumer_scopes.items()

    def fold(self, horizon: int | None) -> None:
        for _, scope in self.scopes():
            scope.fold(horizon)


class UnackedBuildup:
    """A channel whose oldest manual-ack delivery stayed unacked past `unacked_age_seconds`, or
    that sat at its prefetch limit with no ack for `prefetch_stall_seconds`. Count: the most
    deliveries unacked at once on the channel."""

    __slots__ = ("thresholds", "age_limit_ns", "stall_limit_ns", "channels", "proven", "waiting")

    def __init__(self, thresholds):
        self.thresholds = thresholds
        self.age_limit_ns = int(thresholds.unacked_age_seconds * 1e9)
        self.stall_limit_ns = int(thresholds.prefetch_stall_seconds * 1e9)
        self.channels: dict[Incarnation, _Buildup] = {}
        # A consumer whose basic.consume the data lacks (no_ack null) counts as manual once the
        # client acked, nacked or rejected one of its tags (an auto-ack delivery cannot be acked):
        # its deliveries wait here until then, or are dropped at the end.
        self.proven: set[tuple] = set()
        self.waiting: dict[tuple, list[r.Delivery]] = {}

    def add(self, d: r.Delivery) -> None:
        """In C where _folds.c takes the delivery (analyzer/folds.py), else `python_add`."""
        if _add_in_c is None or not _add_in_c(self, d):
            self.python_add(d)

    def python_add(self, d: r.Delivery) -> None:
        """One delivery, the rules' one statement (the C twin is held to it)."""
        if d.outcome not in SETTLED and d.outcome != r.OPEN:
            return
        if d.no_ack is None:
            consumer = (d.channel, d.incarnation, d.consumer_tag)
            if consumer not in self.proven:
                if d.outcome not in SETTLED_BY_CLIENT:
                    self.waiting.setdefault(consumer, []).append(d)
                    return
                self.proven.add(consumer)
                for earlier in self.waiting.pop(consumer, ()):
                    self._manual(earlier)
        elif d.no_ack is not False:
            return
        self._manual(d)

    def _manual(self, d: r.Delivery) -> None:
        until = d.settle_ts_ns if d.outcome in SETTLED else d.observed_until_ts_ns
        if until is None:
            return
        buildup = self.channels.get((d.channel, d.incarnation))
        if buildup is None:
            buildup = self.channels[(d.channel, d.incarnation)] = _Buildup()
        buildup.add(d, until, self.age_limit_ns, self.stall_limit_ns)

    def fold(self, delivery_horizon: int | None) -> None:
        """No delivery record to come has a seq below `delivery_horizon` (None: none is to come):
        fold each incarnation's profile events up to there, or up to its first delivery still
        waiting to be proven manual."""
        waiting: dict[Incarnation, int] = {}
        for (channel, incarnation, _), held in self.waiting.items():
            first = min(d.seq for d in held)
            waiting[(channel, incarnation)] = min(first, waiting.get((channel, incarnation), first))
        for where, b in self.channels.items():
            seqs = [s for s in (delivery_horizon, waiting.get(where)) if s is not None]
            if seqs or delivery_horizon is None:
                b.fold(2 * min(seqs) if seqs else None)

    def findings(self, context: Context) -> list[RawFinding]:
        out = []
        for (channel, incarnation), b in self.channels.items():
            computed_peak, stall_ns, stall_limit = None, None, None
            b.fold(None)
            for name, scope in b.scopes():
                peak, stall = scope.result()
                if name == "channel":
                    computed_peak = peak
                if stall is not None and (stall_ns is None or stall > stall_ns):
                    stall_ns, stall_limit = stall, scope.limit
            by_age = b.oldest_ns >= self.age_limit_ns
            by_stall = stall_ns is not None and stall_ns >= self.stall_limit_ns
            if not (by_age or by_stall):
                continue
            facts = context.channels.get((channel, incarnation))
            peak = max(facts.peak_unacked if facts is not None and facts.peak_unacked is not None else 0,
                       computed_peak or 0)
            # List what the threshold that fired takes in; if both fired, the lower one's (it takes in more).
            listed = b.by_stall if not by_age or (by_stall and self.stall_limit_ns < self.age_limit_ns) else b.by_age
            items = listed.items.listed()
            oldest_s, stall_s = seconds(b.oldest_ns), seconds(stall_ns)
            stall_phrase = f"; it sat at its prefetch limit of {text(stall_limit)} for {fixed(stall_s, 1)} s" \
                if by_stall else ""
            out.append(RawFinding(
                "unacked_buildup", b.agent_id, channel, incarnation, listed.first_ns, listed.last_ns, peak,
                value=oldest_s if by_age else stall_s,
                threshold=self.thresholds.unacked_age_seconds if by_age else self.thresholds.prefetch_stall_seconds,
                summary=f"Channel {channel} held up to {peak} deliveries unacked; the oldest stayed unacked "
                        f"{fixed(oldest_s, 1)} s{stall_phrase}: the consumer is stuck or slower than its queue",
                evidence=dict(seqs=column(items, "seq"), tags=column(items, "delivery_tag"),
                              oldest_tag=b.oldest[0], oldest_seq=b.oldest[1], oldest_age_seconds=oldest_s,
                              stall_seconds=stall_s, prefetch_limit=stall_limit, peak_unacked=peak)))
        return out


# `UnackedBuildup.add` in C, for the deliveries it takes (None: not built, or switched off).
_add_in_c = folds.buildup_fold(UnackedBuildup, _Buildup, Profile)


class Consumes(FramesByIncarnation):
    """Manual basic.consume rows, each with fields (seq, queue)."""


class UnboundedPrefetch:
    """Manual-ack consumers started with no prefetch limit in force: the broker pushes them the
    whole queue. The timeline counts them (ChannelFacts.unbounded_manual_consumes); the evidence
    lists the incarnation's manual-ack basic.consume frames."""

    def __init__(self):
        self.consumes = Consumes()

    @staticmethod
    def wants(row) -> bool:
        return row["method"] == "basic.consume" and row["direction"] == "to_broker" and row.get("no_ack") is False

    def frame(self, row) -> None:
        self.consumes.add(row["channel"], row["seq"], row["ts_ns"], row.get("agent_id"), (row["seq"], row.get("queue")))

    def findings(self, context: Context) -> list[RawFinding]:
        consumes = self.consumes.by_incarnation(context, keep_unplaced=False)
        out = []
        for (channel, incarnation), facts in context.channels.items():
            if not facts.unbounded_manual_consumes > 0:
                continue
            group = consumes.get((channel, incarnation))
            items = sorted(group.fields) if group is not None else None
            end = facts.end_ts_ns if facts.end_ts_ns is not None else facts.observed_until_ts_ns
            out.append(RawFinding(
                "unbounded_prefetch", facts.agent_id, channel, incarnation, facts.open_ts_ns,
                end if end is not None else facts.open_ts_ns, facts.unbounded_manual_consumes,
                summary=f"{facts.unbounded_manual_consumes} manual-ack consumers on channel {channel} have no prefetch "
                        f"limit (no basic.qos, or 0): the broker pushes them the whole queue, unacked, into client "
                        f"memory",
                evidence=dict(seqs=None if items is None else [seq for seq, _ in items],
                              queues=None if items is None else [queue for _, queue in items],
                              peak_unacked=facts.peak_unacked)))
        return out


_VIOLATION_FIELDS = ("seq", "kind", "delivery_tag", "method", "evidence", "delivered_channel", "broker_close_seq",
                     "broker_reply_code", "broker_reply_text")


class ViolationFirsts(Firsts):
    """Firsts of violations, keyed by all their fields (nulls_first): a class of its own so that a
    checkpoint's keys are read as this key (detectors/state.py), not as a seq."""
    __slots__ = ()


class ViolationTally(Tally):
    __slots__ = ()

    def __init__(self):
        super().__init__()
        self.items = ViolationFirsts()


class UnknownDeliveryTag:
    """basic.ack/nack/reject naming a tag not outstanding on its channel (a double ack, a tag
    never delivered, a tag of another channel): RabbitMQ closes the channel with 406. The
    timeline's Violation records say which and how known."""

    def __init__(self):
        self.tallies: dict[Incarnation, Tally] = {}

    def add(self, v: r.Violation) -> None:
        tally = self.tallies.get((v.channel, v.incarnation))
        if tally is None:
            tally = self.tallies[(v.channel, v.incarnation)] = ViolationTally()
        values = tuple(getattr(v, name) for name in _VIOLATION_FIELDS)
        tally.add(v.agent_id, v.ts_ns, v.ts_ns, nulls_first(values), dict(zip(_VIOLATION_FIELDS, values)))

    def findings(self, context: Context) -> list[RawFinding]:
        out = []
        for (channel, incarnation), t in self.tallies.items():
            items = t.items.listed()
            # The offending frames and the broker's closes that answered them, for Wireshark.
            seen = sorted({s for s in column(items, "seq") + column(items, "broker_close_seq") if s is not None})
            kinds = list(dict.fromkeys(column(items, "kind")))
            out.append(RawFinding(
                "unknown_delivery_tag", t.agent_id, channel, incarnation, t.first_ns, t.last_ns, t.n,
                summary=f"{t.n} basic.ack/nack/reject on channel {channel} named a delivery tag not outstanding there "
                        f"({', '.join(k for k in kinds if k is not None)}): the broker closes the channel with 406 "
                        f"PRECONDITION_FAILED",
                evidence=dict(seqs=seen, tags=column(items, "delivery_tag"), violations=column(items, "kind"),
                              methods=column(items, "method"), evidence_from=column(items, "evidence"),
                              delivered_on_channels=column(items, "delivered_channel"),
                              reply_code=items[0]["broker_reply_code"], reply_text=items[0]["broker_reply_text"])))
        return out
