"""Publisher-side kinds, one finding per channel incarnation: lost_confirm, confirm_nack,
out_of_order_confirm, unconfirmed_persistent_publish, synchronous_confirms (from Publish records)
and unroutable_returned (from basic.return frames).

The timeline has already decided each publish's mode and outcome, and marks `unknown` whatever a
mid-stream start or a capture gap hides, so a test of an explicit outcome or mode never turns the
unknown into a finding. All keep running aggregates only; synchronous_confirms its idle times as a histogram.
"""

from __future__ import annotations

from bisect import bisect_left

from ..timeline import records as r
from .common import (MAX_EVIDENCE, Firsts, Incarnation, RawFinding, Tally, column, fixed, least, most, seconds,
                     text)
from . import quantiles
from .context import Context, FramesByIncarnation


class _PerIncarnation:
    """A Tally of the matching publishes of each incarnation, listing `fields` (seq first)."""
    fields: tuple[str, ...] = ()

    def __init__(self):
        self.tallies: dict[Incarnation, Tally] = {}

    def matches(self, p: r.Publish) -> bool:
        raise NotImplementedError

    def add(self, p: r.Publish) -> None:
        if self.matches(p):
            tally = self.tallies.get((p.channel, p.incarnation))
            if tally is None:
                tally = self.tallies[(p.channel, p.incarnation)] = Tally()
            last = p.settle_ts_ns if p.settle_ts_ns is not None else p.ts_ns
            tally.add(p.agent_id, p.ts_ns, last, p.seq, {name: getattr(p, name) for name in ("seq", *self.fields)})
            self.also(tally, p)

    def also(self, tally: Tally, p: r.Publish) -> None:
        """Anything more a kind keeps per incarnation."""


class LostConfirm(_PerIncarnation):
    """Confirm-mode publishes whose channel or connection ended before their confirm. Tx publishes
    left uncommitted are the application's own rollback, not a confirm it was promised."""
    fields = ("confirm_seq", "message_identity")

    def matches(self, p):
        return p.outcome == r.LOST and p.mode == r.CONFIRM

    def findings(self, context: Context) -> list[RawFinding]:
        out = []
        for (channel, incarnation), t in self.tallies.items():
            ends = context.channels.get((channel, incarnation))
            ended_by = ends.ended_by if ends is not None else None
            items = t.items.listed()
            out.append(RawFinding(
                "lost_confirm", t.agent_id, channel, incarnation, t.first_ns, t.last_ns, t.n,
                summary=f"{t.n} confirm-mode publishes on channel {channel} were never confirmed: the channel ended "
                        f"({ended_by if ended_by is not None else 'closed'}) first, so the publisher must republish them",
                evidence=dict(seqs=column(items, "seq"), confirm_seqs=column(items, "confirm_seq"),
                              message_identities=column(items, "message_identity"), ended_by=ended_by,
                              end_seq=ends and ends.end_seq, close_code=ends and ends.close_code,
                              close_text=ends and ends.close_text)))
        return out


class ConfirmNack(_PerIncarnation):
    """Publishes the broker settled with basic.nack: it refused responsibility for them."""
    fields = ("confirm_tag", "confirm_seq", "message_identity")

    def matches(self, p):
        return p.outcome == r.NACKED

    def findings(self, context: Context) -> list[RawFinding]:
        out = []
        for (channel, incarnation), t in self.tallies.items():
            items = t.items.listed()
            out.append(RawFinding(
                "confirm_nack", t.agent_id, channel, incarnation, t.first_ns, t.last_ns, t.n,
                summary=f"{t.n} publishes on channel {channel} were refused by the broker (basic.nack): it took no "
                        f"responsibility for them",
                evidence=dict(seqs=column(items, "seq"), tags=column(items, "confirm_tag"),
                              confirm_seqs=column(items, "confirm_seq"),
                              message_identities=column(items, "message_identity"))))
        return out


class OutOfOrderConfirm(_PerIncarnation):
    """Single confirms that overtook an earlier publish still unconfirmed: allowed by the protocol
    (transient messages confirmed before persistent ones wait for fsync), so information only.
    A multiple confirm settles a range and says nothing about order."""
    fields = ("confirm_tag", "confirm_seq", "message_identity")

    def __init__(self):
        super().__init__()
        self.most_overtaken: dict[Incarnation, int | None] = {}

    def matches(self, p):
        return p.out_of_order is True and p.confirm_multiple is False

    def also(self, tally, p):
        key = (p.channel, p.incarnation)
        self.most_overtaken[key] = most(self.most_overtaken.get(key), p.out_of_order_by)

    def findings(self, context: Context) -> list[RawFinding]:
        out = []
        for (channel, incarnation), t in self.tallies.items():
            items, by = t.items.listed(), self.most_overtaken[(channel, incarnation)]
            out.append(RawFinding(
                "out_of_order_confirm", t.agent_id, channel, incarnation, t.first_ns, t.last_ns, t.n,
                value=by,
                summary=f"{t.n} confirms on channel {channel} arrived while earlier publishes were still unconfirmed "
                        f"(up to {text(by)} numbers ahead of the oldest): allowed by the protocol, a problem only for "
                        f"a client that relies on confirm order",
                evidence=dict(seqs=column(items, "seq"), tags=column(items, "confirm_tag"),
                              confirm_seqs=column(items, "confirm_seq"),
                              message_identities=column(items, "message_identity"), out_of_order_by_max=by)))
        return out


class UnconfirmedPersistentPublish(_PerIncarnation):
    """Persistent publishes on a channel in neither confirm nor tx mode. Mode `unknown` (the
    channel's history is not in the data) is not `none`."""
    fields = ("exchange", "routing_key", "message_identity")

    def matches(self, p):
        return p.persistent is True and p.mode == r.NONE

    def findings(self, context: Context) -> list[RawFinding]:
        out = []
        for (channel, incarnation), t in self.tallies.items():
            items = t.items.listed()
            out.append(RawFinding(
                "unconfirmed_persistent_publish", t.agent_id, channel, incarnation, t.first_ns, t.last_ns, t.n,
                summary=f"{t.n} persistent publishes on channel {channel} were sent without publisher confirms or a "
                        f"transaction: the publisher cannot know the broker stored them",
                evidence=dict(seqs=column(items, "seq"), exchanges=column(items, "exchange"),
                              routing_keys=column(items, "routing_key"),
                              message_identities=column(items, "message_identity"))))
        return out


class _Lockstep:
    """One incarnation's confirm-mode publishes whose pending count is known: running aggregates,
    and the idle times of the lockstep ones in a histogram (quantiles.py). A lockstep publish's
    idle time runs from the latest confirm of the publishes before it in seq order, and records
    arrive in settlement order, not seq order: (seq, ts_ns, settle_ts_ns, lockstep) of each waits
    in `pending` until every publish below it is in (`fold`)."""
    __slots__ = ("agent_id", "n", "lockstep", "first_ns", "last_ns", "items", "pending", "latest_confirm_ns",
                 "idle_ns")
    ITEM_FIELDS = ("seq", "confirm_seq", "message_identity")  # of each item in `items` (also _folds.c's)

    def __init__(self):
        self.agent_id, self.n, self.lockstep, self.first_ns, self.last_ns = None, 0, 0, None, None
        self.items = Firsts()
        self.pending: list = []
        self.latest_confirm_ns: int | None = None   # of the publishes folded so far
        self.idle_ns: dict[int, int] = {}           # quantiles.py histogram

    def add(self, p: r.Publish) -> None:
        lockstep = p.pending_before == 0
        self.agent_id = least(self.agent_id, p.agent_id)
        self.n += 1
        self.lockstep += lockstep
        self.first_ns = least(self.first_ns, p.ts_ns)
        self.last_ns = most(self.last_ns, p.settle_ts_ns if p.settle_ts_ns is not None else p.ts_ns)
        if lockstep:
            self.items.add(p.seq, {"seq": p.seq, "confirm_seq": p.confirm_seq,
                                   "message_identity": p.message_identity})
        self.pending.append((p.seq, p.ts_ns, p.settle_ts_ns, lockstep))

    def fold(self, horizon: int | None) -> None:
        """Fold the publishes of seq below `horizon` (None: all): no publish below it is still to come."""
        self.pending.sort()
        cut = len(self.pending) if horizon is None else bisect_left(self.pending, (horizon,))
        for _, ts_ns, settle_ns, lockstep in self.pending[:cut]:
            if lockstep and self.latest_confirm_ns is not None:
                quantiles.add(self.idle_ns, ts_ns - self.latest_confirm_ns)
            self.latest_confirm_ns = most(self.latest_confirm_ns, settle_ns)
        del self.pending[:cut]

    def median_idle_ns(self) -> float | None:
        """The lower median of the times from the latest earlier confirm to each lockstep publish,
        within quantiles.RELATIVE_ERROR; every publish folded first."""
        self.fold(None)
        n = sum(self.idle_ns.values())
        return quantiles.ranked(self.idle_ns, lower_median_index(n)) if n else None


def lower_median_index(n: int) -> int:
    """0-based index of the value of rank ceil(n / 2): what Spark's percentile_approx(x, 0.5)
    returns while its summary is exact (measured: every n up to 6,000; at 10,000 values and more it
    approximates, and its answer depends on how the rows were partitioned)."""
    return -(-n // 2) - 1


class SynchronousConfirms:
    """A confirm-mode publisher that sends each publish only once every earlier one is confirmed
    (pending_before == 0), nearly always, and at once: one message per round trip and fsync."""
    __slots__ = ("channels",)   # read by _folds.c's twin of `add`

    def __init__(self):
        self.channels: dict[Incarnation, _Lockstep] = {}

    def add(self, p: r.Publish) -> None:
        if p.mode == r.CONFIRM and p.pending_before is not None:
            lockstep = self.channels.get((p.channel, p.incarnation))
            if lockstep is None:
                lockstep = self.channels[(p.channel, p.incarnation)] = _Lockstep()
            lockstep.add(p)

    def fold(self, publish_horizon: int | None) -> None:
        for lockstep in self.channels.values():
            lockstep.fold(publish_horizon)

    def findings(self, context: Context) -> list[RawFinding]:
        t = context.thresholds
        out = []
        for (channel, incarnation), c in self.channels.items():
            share = c.lockstep / c.n
            if c.n < t.synchronous_min_publishes or share < t.synchronous_min_share:
                continue
            median_ns = c.median_idle_ns()
            if median_ns is None or not seconds(median_ns) <= t.synchronous_max_idle_seconds:
                continue
            items = c.items.listed()
            span = seconds(c.last_ns - c.first_ns)
            out.append(RawFinding(
                "synchronous_confirms", c.agent_id, channel, incarnation, c.first_ns, c.last_ns, c.lockstep,
                value=share, threshold=t.synchronous_min_share,
                summary=f"{c.lockstep} of {c.n} confirm-mode publishes on channel {channel} ({fixed(share * 100, 0)}%) "
                        f"waited for every earlier confirm: lockstep publishing caps throughput at one message per "
                        f"round trip; keep a window of publishes in flight",
                evidence=dict(seqs=column(items, "seq"), confirm_seqs=column(items, "confirm_seq"),
                              message_identities=column(items, "message_identity"),
                              confirm_mode_publishes=c.n, lockstep_publishes=c.lockstep,
                              median_idle_seconds=seconds(median_ns),
                              publishes_per_second=c.n / span if span > 0 else None)))
        return out


class Returns(FramesByIncarnation):
    """basic.return rows, each with fields UnroutableReturned.FIELDS."""


class UnroutableReturned:
    """basic.return frames: a mandatory publish no queue took. Counted from the frames, not from
    the publishes they were matched to, so a return whose publish the capture missed counts too."""
    FIELDS = ("seq", "reply_code", "reply_text", "exchange", "routing_key", "message_identity")

    def __init__(self):
        self.frames = Returns()

    @staticmethod
    def wants(row) -> bool:
        return row["method"] == "basic.return" and row["direction"] == "to_client"

    def frame(self, row) -> None:
        self.frames.add(row["channel"], row["seq"], row["ts_ns"], row.get("agent_id"),
                        tuple(row.get(name) for name in self.FIELDS))

    def findings(self, context: Context) -> list[RawFinding]:
        out = []
        for (channel, incarnation), group in self.frames.by_incarnation(context, keep_unplaced=True).items():
            items = [dict(zip(self.FIELDS, fields)) for fields in sorted(group.fields[:MAX_EVIDENCE])]
            first = items[0]
            first_reply = " ".join(text(x) for x in (first["reply_code"], first["reply_text"]) if x is not None)
            out.append(RawFinding(
                "unroutable_returned", group.agent_id, channel, incarnation, group.first_ns, group.last_ns, group.n,
                summary=f"{group.n} mandatory publishes on channel {channel} came back unroutable (basic.return "
                        f"{first_reply}): no queue was bound for their routing key",
                evidence=dict(seqs=column(items, "seq"), return_codes=column(items, "reply_code"),
                              reply_code=first["reply_code"], reply_text=first["reply_text"],
                              exchanges=column(items, "exchange"), routing_keys=column(items, "routing_key"),
                              message_identities=column(items, "message_identity"))))
        return out
