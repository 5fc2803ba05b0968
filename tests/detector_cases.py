"""Hand-built timeline rows for the detectors: one connection per case, on both sides of every
threshold, and the findings each must give. Used by test_detectors.py (every kind, the
cross-connection ones through the findings step) and test_detectors_python.py (the Python detectors alone).

Everything runs with the lab-scale thresholds of tests/findings_check.py."""

from __future__ import annotations

import itertools

from analyzer import schema
from analyzer.timeline import CHANNELS, VIOLATIONS
from analyzer.timeline.tables import CHANNEL_TIMESTAMPS, TS_ONLY

from .findings_check import LAB_THRESHOLDS as LAB

T0 = 1_795_000_000_000_000_000  # 2026-11-18 UTC, in ns
S = 1_000_000_000

# table -> (schema, timestamp columns derived from _ns ones, the column `date` comes from)
TABLES = {
    "deliveries": (schema.DELIVERIES, schema.DELIVERY_TIMESTAMPS, schema.DELIVERY_DATE_FROM),
    "publishes": (schema.PUBLISHES, schema.PUBLISH_TIMESTAMPS, schema.PUBLISH_DATE_FROM),
    "channels": (CHANNELS, CHANNEL_TIMESTAMPS, "open_ts_ns"),
    "violations": (VIOLATIONS, TS_ONLY, "ts_ns"),
    "frames": (schema.FRAMES, {"ts": "ts_ns"}, "ts_ns"),
    "connections": (schema.CONNECTIONS, schema.CONNECTION_TIMESTAMPS, schema.CONNECTION_DATE_FROM),
}

_ports = itertools.count(41000)


class Case:
    """One hand-built connection, `unit-NAME`, and its rows in every table the detectors read.
    Times are seconds after T0; a channel row (channel 1, incarnation 1) unless told otherwise."""

    def __init__(self, name: str, client_addr: str = "10.1.0.1", last_s: float = 600):
        self.name, self.port = f"unit-{name}", next(_ports)
        self.id = f"{client_addr}:{self.port}>10.1.0.254:5672@{T0}"
        self.rows = {table: [] for table in TABLES}
        self.rows["connections"].append(dict(
            connection_id=self.id, agent_id="unit", source=f"unit/{name}.pcapng", client_addr=client_addr,
            client_port=self.port, server_addr="10.1.0.254", server_port=5672, connection_name=self.name,
            first_ts_ns=T0, last_ts_ns=T0 + int(last_s * S), protocol="amqp-0-9-1"))

    def _where(self, fields: dict) -> dict:
        return {"connection_id": self.id, "agent_id": "unit", "channel": 1, "incarnation": 1, **fields}

    def channel(self, **facts) -> Case:
        defaults = dict(open_seq=1, open_ts_ns=T0, history_known=True, gap_seen=False, end_seq=10_000,
                        end_ts_ns=T0 + 600 * S, ended_by="channel.close", closed_by="client", confirm_mode=False,
                        tx_mode=False, consumer_prefetch=0, channel_prefetch=0, consumes=0,
                        unbounded_manual_consumes=0, deliveries=0, publishes=0, peak_unacked=0)
        self.rows["channels"].append(self._where({**defaults, **facts}))
        return self

    def publish(self, seq: int, at: float, **fields) -> Case:
        defaults = dict(channel_open_seq=1, exchange="", routing_key="q", mode="confirm", persistent=True,
                        message_identity=f"id:{self.name}-{seq}", outcome="acked")
        self.rows["publishes"].append(self._where({**defaults, "seq": seq, "ts_ns": T0 + int(at * S), **fields}))
        return self

    def delivery(self, seq: int, at: float, **fields) -> Case:
        defaults = dict(channel_open_seq=1, method="basic.deliver", delivery_tag=seq, consumer_tag="ctag", queue="q",
                        exchange="", routing_key="q", message_identity=f"id:{self.name}-{seq}", redelivered=False,
                        no_ack=False, consumer_prefetch=0, channel_prefetch=0, outcome="ack")
        self.rows["deliveries"].append(self._where({**defaults, "seq": seq, "ts_ns": T0 + int(at * S), **fields}))
        return self

    def violation(self, seq: int, at: float, **fields) -> Case:
        defaults = dict(kind="unknown_tag", evidence="capture", method="basic.ack", delivery_tag=99, multiple=False,
                        broker_close_seq=seq + 1, broker_reply_code=406,
                        broker_reply_text="PRECONDITION_FAILED - unknown delivery tag 99")
        self.rows["violations"].append(self._where({**defaults, "seq": seq, "ts_ns": T0 + int(at * S), **fields}))
        return self

    def frame(self, seq: int, at: float, method: str, direction: str = "to_client", **fields) -> Case:
        self.rows["frames"].append(self._where({
            "channel": 0 if method.startswith("connection.") else 1, "incarnation": None, "seq": seq,
            "ts_ns": T0 + int(at * S), "method": method, "direction": direction,
            "source": f"unit/{self.name}.pcapng", "source_packet": 100 + seq, **fields}))
        return self


def settled(at: float, after: float, outcome: str = "ack", **fields) -> dict:
    """The settlement columns of a delivery or publish made at `at`, settled `after` seconds later."""
    ts, settle = T0 + int(at * S), T0 + int((at + after) * S)
    return dict(settle_ts_ns=settle, settle_latency_ns=settle - ts, outcome=outcome, **fields)


def still_open(at: float, observed: float) -> dict:
    """A delivery made at `at`, still unacked when the data ended `observed` seconds later."""
    return dict(outcome="open", observed_until_ts_ns=T0 + int((at + observed) * S))


def lockstep_publisher(case: Case, publishes: int, idle: float = 0.001, lockstep: int | None = None) -> Case:
    """Confirm-mode publishes each confirmed 1 ms after it went out; the next goes out `idle` after
    that confirm. The first `lockstep` (default all) had nothing pending; the rest had one."""
    lockstep = publishes if lockstep is None else lockstep
    at = 0.0
    for n in range(publishes):
        case.publish(10 + n, at, confirm_seq=n + 1, pending_before=0 if n < lockstep else 1, confirm_tag=n + 1,
                     confirm_multiple=False, out_of_order=False, out_of_order_by=0, **settled(at, 0.001, "acked"))
        at += 0.001 + idle
    return case


def hand_built_cases() -> list[Case]:
    age, stall = LAB.unacked_age_seconds, LAB.prefetch_stall_seconds
    loop = LAB.requeue_loop_deliveries
    cases = []
    add = cases.append

    # lost_confirm: lost confirm-mode publishes count; open, unknown and tx ones never do.
    case = Case("lost").channel(ended_by="tcp.rst", confirm_mode=True)
    for n in range(3):
        case.publish(10 + n, 1 + n, confirm_seq=n + 1, outcome="lost", settle_seq=20, **{
            "settle_ts_ns": T0 + 5 * S}).frame(10 + n, 1 + n, "basic.publish", "to_broker")
    add(case.publish(13, 4, confirm_seq=4, **settled(4, 0.1, "acked")))
    add(Case("not-lost").channel(ended_by="end_of_data")
        .publish(10, 1, outcome="open", observed_until_ts_ns=T0 + 9 * S)
        .publish(11, 1, mode="unknown", outcome="unknown")
        .publish(12, 1, mode="tx", outcome="lost"))

    # confirm_nack and out_of_order_confirm
    add(Case("nacked").channel(confirm_mode=True).publish(10, 1, **settled(1, 0.1, "nacked"))
        .publish(11, 1, **settled(1, 0.1, "nacked")).publish(12, 1, **settled(1, 0.1, "acked")))
    add(Case("ooo").channel(confirm_mode=True)
        .publish(10, 1, out_of_order=False, confirm_multiple=False, **settled(1, 0.5, "acked"))
        .publish(11, 1, out_of_order=True, out_of_order_by=1, confirm_multiple=False, **settled(1, 0.1, "acked"))
        .publish(12, 1, out_of_order=True, out_of_order_by=2, confirm_multiple=False, **settled(1, 0.1, "acked"))
        .publish(13, 1, out_of_order=None, **settled(1, 0.1, "unknown")))

    # unacked_buildup by age: just past the threshold, just under it.
    add(Case("old-unacked").channel(peak_unacked=3, ended_by="end_of_data")
        .delivery(10, 0, **still_open(0, age + 0.1)).delivery(11, 0.15, **still_open(0.15, age - 0.05))
        .delivery(12, 0.1, **settled(0.1, 0.01)))
    add(Case("young-unacked").channel(peak_unacked=1, ended_by="end_of_data")
        .delivery(10, 0, **still_open(0, age - 0.1)))
    # by a stall at the prefetch limit (2), with no delivery as old as the age threshold
    add(Case("stalled").channel(consumer_prefetch=2, peak_unacked=2)
        .delivery(10, 0, consumer_prefetch=2, settle_seq=13, **settled(0, 0.01 + stall + 0.1))
        .delivery(11, 0.01, consumer_prefetch=2, settle_seq=13, **settled(0.01, stall + 0.1)))
    add(Case("not-stalled").channel(consumer_prefetch=2, peak_unacked=2)
        .delivery(10, 0, consumer_prefetch=2, settle_seq=13, **settled(0, 0.01 + stall - 0.1))
        .delivery(11, 0.01, consumer_prefetch=2, settle_seq=13, **settled(0.01, stall - 0.1)))
    # auto-ack and unknown outcomes never age
    add(Case("autoack").channel().delivery(10, 0, no_ack=True, **settled(0, 0, "auto"))
        .delivery(11, 0, outcome="unknown"))
    # mid-stream: the basic.consume is not in the data (no_ack null); an ack of one of the
    # consumer's tags shows it is manual, and then its open delivery ages.
    add(Case("midstream-manual").channel(history_known=False, ended_by="end_of_data", consumer_prefetch=None)
        .delivery(10, 0, no_ack=None, consumer_prefetch=None, **settled(0, 0.01))
        .delivery(11, 0, no_ack=None, consumer_prefetch=None, **still_open(0, age + 1)))
    add(Case("midstream-unknown-mode").channel(history_known=False, ended_by="end_of_data", consumer_prefetch=None)
        .delivery(10, 0, no_ack=None, consumer_prefetch=None, **still_open(0, age + 1)))

    # requeue_loop: `loop` deliveries of one message, each but the last nacked back; one fewer
    # is no loop; a high x-death count is one even when seen once; identical bodies rejected
    # without coming back (not redelivered, no x-death) are different messages.
    case = Case("loop").channel(consumer_prefetch=1)
    for n in range(loop):
        last = n == loop - 1
        case.delivery(10 + n, n, message_id="poison", message_identity="id:poison", redelivered=n > 0,
                      requeue=None if last else True, **settled(n, 0.01, "ack" if last else "nack"))
    add(case)
    case = Case("short-loop").channel(consumer_prefetch=1)
    for n in range(loop - 1):
        last = n == loop - 2
        case.delivery(10 + n, n, message_identity="id:almost", redelivered=n > 0,
                      requeue=None if last else True, **settled(n, 0.01, "ack" if last else "reject"))
    add(case)
    add(Case("dead-letter").channel().delivery(10, 0, message_identity="id:dlx", x_death_count=LAB.dead_letter_loop_count,
                                               **settled(0, 0.01)))
    add(Case("shallow-dead-letter").channel()
        .delivery(10, 0, message_identity="id:dlx-2", x_death_count=LAB.dead_letter_loop_count - 1, **settled(0, 0.01)))
    case = Case("same-body").channel()
    for n in range(loop + 2):
        case.delivery(10 + n, n, message_identity="h:same", requeue=False, **settled(n, 0.01, "reject"))
    add(case)
    # a loop whose every bounce is followed, before its return, by a plain delivery of an identical
    # body on another consumer: those are other messages (not redelivered), and not in the loop
    case = Case("echo").channel(consumer_prefetch=1)
    plain = Case("echo-plain").channel()
    for n in range(loop):
        last = n == loop - 1
        case.delivery(10 + n, n, message_identity="h:echo", redelivered=n > 0,
                      requeue=None if last else True, **settled(n, 0.01, "ack" if last else "nack"))
        plain.delivery(10 + n, n + 0.5, message_identity="h:echo", **settled(n + 0.5, 0.01))
    cases += [case, plain]
    # one message bounced twice on one connection, then three times on another: pinned to the second
    wanderer = dict(message_identity="id:wanderer", message_id="wanderer")
    first = Case("wander-a").channel()
    for n in range(2):
        first.delivery(10 + n, n, redelivered=n > 0, requeue=True, **wanderer, **settled(n, 0.01, "nack"))
    second = Case("wander-b").channel()
    for n in range(4):
        last = n == 3
        second.delivery(10 + n, 2 + n, redelivered=True, requeue=None if last else True, **wanderer,
                        **settled(2 + n, 0.01, "ack" if last else "nack"))
    cases += [first, second]

    # unknown_delivery_tag
    add(Case("violations").channel(channel=3, ended_by="channel.close", closed_by="broker", close_code=406)
        .violation(20, 1, channel=3, kind="double_ack", delivery_tag=1)
        .violation(22, 2, channel=3, kind="wrong_channel", delivery_tag=2, delivered_channel=4,
                   delivered_incarnation=1))

    # redelivery_after_close: r1 comes back redelivered after the close (counted); r2's identity
    # comes again but not redelivered (another message); r4 "comes back" before its close (not).
    add(Case("closer").channel()
        .delivery(10, 0, message_identity="id:r1", settle_seq=20, **settled(0, 1, "channel_closed"))
        .delivery(11, 0, message_identity="id:r2", settle_seq=20, **settled(0, 1, "channel_closed"))
        .delivery(12, 0, message_identity="id:r3", **settled(0, 0.1)))
    add(Case("closer-late").channel()
        .delivery(10, 0, message_identity="id:r4", settle_seq=20, **settled(0, 1, "connection_closed")))
    add(Case("taker").channel()
        .delivery(10, 2, message_identity="id:r1", redelivered=True, **settled(2, 0.1))
        .delivery(11, 2, message_identity="id:r2", redelivered=False, **settled(2, 0.1))
        .delivery(12, 0.5, message_identity="id:r4", redelivered=True, **settled(0.5, 0.1)))

    # unroutable_returned, unconfirmed_persistent_publish
    add(Case("returns").channel(confirm_mode=True)
        .frame(20, 1, "basic.return", reply_code=312, reply_text="NO_ROUTE", exchange="x", routing_key="nowhere")
        .frame(22, 2, "basic.return", reply_code=312, reply_text="NO_ROUTE", exchange="x", routing_key="nowhere"))
    add(Case("plain").channel()
        .publish(10, 1, mode="none", outcome="untracked").publish(11, 1, mode="none", outcome="untracked")
        .publish(12, 1, mode="none", persistent=False, outcome="untracked")
        .publish(13, 1, mode="unknown", outcome="unknown"))

    # synchronous_confirms: enough lockstep publishes, then one too few, too low a share, too idle
    n = LAB.synchronous_min_publishes
    add(lockstep_publisher(Case("sync").channel(confirm_mode=True), n))
    add(lockstep_publisher(Case("sync-few").channel(confirm_mode=True), n - 1))
    share_under = int(n * LAB.synchronous_min_share) - 1
    add(lockstep_publisher(Case("sync-share").channel(confirm_mode=True), n, lockstep=share_under))
    add(lockstep_publisher(Case("sync-idle").channel(confirm_mode=True), n, idle=LAB.synchronous_max_idle_seconds * 4))

    # unbounded_prefetch
    add(Case("unbounded").channel(consumes=1, unbounded_manual_consumes=1)
        .frame(5, 0.5, "basic.consume", "to_broker", queue="work", no_ack=False))
    add(Case("bounded").channel(consumes=1, consumer_prefetch=50)
        .frame(5, 0.5, "basic.consume", "to_broker", queue="work", no_ack=False))

    # flow_blocked: blocked and released (IPv6 client), blocked to the end, a channel paused by
    # the broker (the client's own channel.flow does not count)
    add(Case("blocked", client_addr="fd00::7")
        .frame(10, 1, "connection.blocked", detail="low on memory").frame(11, 3, "connection.unblocked"))
    add(Case("still-blocked", last_s=10).frame(10, 1, "connection.blocked", detail="low on disk"))
    add(Case("paused").channel()
        .frame(10, 1, "channel.flow", active=False).frame(11, 1.5, "channel.flow", active=True)
        .frame(12, 2, "channel.flow", "to_broker", active=False))
    return cases


# What each hand-built case must give, all of it: {kind: count}.
UNIT_EXPECTED = {
    "lost": {"lost_confirm": 3}, "not-lost": {},
    "nacked": {"confirm_nack": 2}, "ooo": {"out_of_order_confirm": 2},
    "old-unacked": {"unacked_buildup": 3}, "young-unacked": {},
    "stalled": {"unacked_buildup": 2}, "not-stalled": {}, "autoack": {},
    "midstream-manual": {"unacked_buildup": 1}, "midstream-unknown-mode": {},
    "loop": {"requeue_loop": LAB.requeue_loop_deliveries}, "short-loop": {},
    "dead-letter": {"requeue_loop": 1}, "shallow-dead-letter": {}, "same-body": {},
    "echo": {"requeue_loop": LAB.requeue_loop_deliveries}, "echo-plain": {},
    "wander-a": {}, "wander-b": {"requeue_loop": 6},
    "violations": {"unknown_delivery_tag": 2},
    "closer": {"redelivery_after_close": 1}, "closer-late": {}, "taker": {},
    "returns": {"unroutable_returned": 2}, "plain": {"unconfirmed_persistent_publish": 2},
    "sync": {"synchronous_confirms": LAB.synchronous_min_publishes}, "sync-few": {}, "sync-share": {}, "sync-idle": {},
    "unbounded": {"unbounded_prefetch": 1}, "bounded": {},
    "blocked": {"flow_blocked": 1}, "still-blocked": {"flow_blocked": 1}, "paused": {"flow_blocked": 1},
}
