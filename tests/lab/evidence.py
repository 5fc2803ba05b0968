"""What the raw frames of a capture show of each finding kind of DESIGN.md.

Scenarios use this to prove their pathology is really on the wire before a capture is kept,
and the runner uses it to prove that what a scenario forbids is really absent. Three kinds
have no exact line (how slow is "synchronous", how long is a "buildup", how many bounces make
a "loop"); for them evidence is reported once the traffic comes near, and called `clear` only
well past any sensible threshold, so that a scenario never expects what is merely borderline
and never forbids what is.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from tests.lab.capture import Capture, Frame
from tests.lab.timeline import ChannelLife, Delivery, channel_lives

# What the `count` of each kind counts; written into every expectation as "counts".
COUNTS = {
    "lost_confirm": "confirm-mode publishes with no basic.ack/basic.nack before their channel or connection ended",
    "confirm_nack": "publishes the broker settled with basic.nack",
    "out_of_order_confirm": "single (multiple=false) confirms that arrived while an earlier publish was unconfirmed",
    "unacked_buildup": "deliveries unacked at the channel's peak",
    "requeue_loop": "deliveries of one message, each but the last bounced by basic.nack/basic.reject",
    "unknown_delivery_tag": "basic.ack/nack/reject naming a tag not outstanding on that channel",
    "redelivery_after_close": "deliveries left unacked when their channel or connection closed, later redelivered",
    "unroutable_returned": "basic.return frames",
    "unconfirmed_persistent_publish": "persistent (delivery_mode 2) publishes on a channel in neither confirm nor tx mode",
    "synchronous_confirms": "confirm-mode publishes sent only after every earlier one was confirmed",
    "unbounded_prefetch": "manual-ack basic.consume with no basic.qos prefetch limit before it",
    "flow_blocked": "connection.blocked frames (or channel.flow active=false) from the broker",
}
FINDING_KINDS = tuple(COUNTS)

# Any publisher now and then sends a publish after the previous confirm is back; a synchronous
# one does it for (nearly) every publish, throughout.
SYNCHRONOUS_NEAR = {"publishes": 10, "share": 0.5}
SYNCHRONOUS_CLEAR = {"publishes": 30, "share": 0.9}
UNACKED_SECONDS_NEAR, UNACKED_SECONDS_CLEAR, UNACKED_PEAK_CLEAR = 1.0, 1.5, 10
REQUEUE_DELIVERIES_NEAR, REQUEUE_DELIVERIES_CLEAR = 3, 10
MAX_EVIDENCE_FRAMES = 20


@dataclass(frozen=True)
class Evidence:
    kind: str
    connection_name: str | None
    channel: int
    count: int
    frames: tuple[int, ...]  # packet numbers to look at in Wireshark (the first few)
    clear: bool = True  # False: near the kind, but too little to call it
    detail: dict = field(default_factory=dict)


def all_evidence(capture: Capture) -> dict[str, list[Evidence]]:
    lives = channel_lives(capture)
    end_of_capture = capture.frames[-1].time if capture.frames else 0.0
    per_life = [
        lost_confirms, confirm_nacks, out_of_order_confirms, unknown_delivery_tags, unbounded_prefetch,
        unconfirmed_persistent_publishes, synchronous_confirms, unroutable_returns,
    ]
    found = {kind: [] for kind in FINDING_KINDS}
    for life in lives:
        for detector in per_life:
            for evidence in detector(life):
                found[evidence.kind].append(evidence)
        found["unacked_buildup"].extend(unacked_buildup(life, end_of_capture))
    found["requeue_loop"] = requeue_loops(lives)
    found["redelivery_after_close"] = redeliveries_after_close(lives)
    found["flow_blocked"] = flow_blocks(capture, lives)
    return found


def _evidence(kind: str, life: ChannelLife, frames: list[Frame], count: int | None = None, **extra) -> Evidence:
    return Evidence(kind, life.connection_name, life.channel, len(frames) if count is None else count,
                    tuple(f.number for f in frames[:MAX_EVIDENCE_FRAMES]), **extra)


def lost_confirms(life: ChannelLife) -> list[Evidence]:
    if life.end_time is None:
        return []  # still open when the capture ended: the confirms may yet come
    lost = [p.frame for p in life.publishes if p.seq is not None and p.confirm is None]
    return [_evidence("lost_confirm", life, lost)] if lost else []


def confirm_nacks(life: ChannelLife) -> list[Evidence]:
    nacked = [p.frame for p in life.publishes if p.confirm is not None and p.confirm.method == "basic.nack"]
    return [_evidence("confirm_nack", life, nacked)] if nacked else []


def out_of_order_confirms(life: ChannelLife) -> list[Evidence]:
    frames = life.overtaking_confirms
    return [_evidence("out_of_order_confirm", life, frames, detail={"tags": [f.tag for f in frames]})] if frames else []


def unknown_delivery_tags(life: ChannelLife) -> list[Evidence]:
    frames = life.bad_settlements
    if not frames:
        return []
    closes = [f for f in life.frames if f.method == "channel.close" and f.from_broker]
    detail = {"tags": [f.tag for f in frames],
              "broker_reply_code": int(closes[0].args["reply_code"]) if closes else None}
    return [_evidence("unknown_delivery_tag", life, frames, detail=detail)]


def unbounded_prefetch(life: ChannelLife) -> list[Evidence]:
    frames = life.unbounded_consumes
    return [_evidence("unbounded_prefetch", life, frames)] if frames else []


def unconfirmed_persistent_publishes(life: ChannelLife) -> list[Evidence]:
    frames = [p.frame for p in life.publishes if p.mode == "plain" and p.frame.properties.get("delivery_mode") == "2"]
    return [_evidence("unconfirmed_persistent_publish", life, frames)] if frames else []


def synchronous_confirms(life: ChannelLife) -> list[Evidence]:
    confirmed = [p for p in life.publishes if p.seq is not None]
    lockstep = [p.frame for p in confirmed if p.unconfirmed_before == 0]

    def past(threshold: dict) -> bool:
        return len(confirmed) >= threshold["publishes"] and len(lockstep) >= threshold["share"] * len(confirmed)

    if not past(SYNCHRONOUS_NEAR):
        return []
    return [_evidence("synchronous_confirms", life, lockstep, clear=past(SYNCHRONOUS_CLEAR),
                      detail={"confirm_mode_publishes": len(confirmed)})]


def unroutable_returns(life: ChannelLife) -> list[Evidence]:
    frames = [f for f in life.frames if f.method == "basic.return"]
    return [_evidence("unroutable_returned", life, frames)] if frames else []


def unacked_buildup(life: ChannelLife, end_of_capture: float) -> list[Evidence]:
    manual = [d for d in life.deliveries if d.manual_ack]
    if not manual:
        return []
    longest = max(manual, key=lambda d: _unacked_seconds(d, life, end_of_capture))
    seconds = _unacked_seconds(longest, life, end_of_capture)
    if seconds < UNACKED_SECONDS_NEAR:
        return []
    clear = seconds >= UNACKED_SECONDS_CLEAR and life.peak_unacked >= UNACKED_PEAK_CLEAR
    return [_evidence("unacked_buildup", life, [longest.frame], count=life.peak_unacked, clear=clear,
                      detail={"longest_unacked_seconds": round(seconds, 2)})]


def _unacked_seconds(delivery: Delivery, life: ChannelLife, end_of_capture: float) -> float:
    if delivery.settlement is not None:
        until = delivery.settlement.time
    else:
        until = life.end_time if life.end_time is not None else end_of_capture
    return until - delivery.frame.time


def requeue_loops(lives: list[ChannelLife]) -> list[Evidence]:
    """A message that keeps coming back because its consumer nacks or rejects it: with
    requeue=true it returns redelivered, with requeue=false through a dead-letter exchange."""
    by_message: dict[str, list[tuple[Delivery, ChannelLife]]] = {}
    for life in lives:
        for delivery in life.deliveries:
            if delivery.frame.message_id is not None:
                by_message.setdefault(delivery.frame.message_id, []).append((delivery, life))
    found = []
    for message_id, deliveries in by_message.items():
        deliveries.sort(key=lambda pair: pair[0].frame.number)
        bounced = [(d, life) for d, life in deliveries[:-1]
                   if d.settlement is not None and d.settlement.method in ("basic.nack", "basic.reject")]
        count = len(bounced) + 1
        if count < REQUEUE_DELIVERIES_NEAR:
            continue
        (connection, channel), _ = Counter((life.connection_name, life.channel) for _, life in bounced).most_common(1)[0]
        frames = [d.frame for d, _ in deliveries]
        found.append(Evidence("requeue_loop", connection, channel, count,
                              tuple(f.number for f in frames[:MAX_EVIDENCE_FRAMES]),
                              clear=count >= REQUEUE_DELIVERIES_CLEAR, detail={"message_id": message_id}))
    return found


def redeliveries_after_close(lives: list[ChannelLife]) -> list[Evidence]:
    later_redelivered: dict[str, list[tuple[Frame, ChannelLife]]] = {}
    for life in lives:
        for delivery in life.deliveries:
            if delivery.frame.flag("redelivered") and delivery.frame.message_id is not None:
                later_redelivered.setdefault(delivery.frame.message_id, []).append((delivery.frame, life))
    found = []
    for life in lives:
        if life.end_time is None:
            continue
        redelivered_on = set()
        frames = []
        for delivery in life.unsettled():
            again = [(f, other) for f, other in later_redelivered.get(delivery.frame.message_id, [])
                     if f.time > life.end_time]
            if again:
                frames.append(delivery.frame)
                redelivered_on.update((other.connection_name, other.channel) for _, other in again)
        if frames:
            found.append(_evidence("redelivery_after_close", life, frames,
                                   detail={"redelivered_on": sorted(redelivered_on, key=str)}))
    return found


def flow_blocks(capture: Capture, lives: list[ChannelLife]) -> list[Evidence]:
    found = []
    for stream in capture.streams.values():
        blocked = [f for f in capture.frames if f.stream == stream.number and f.method == "connection.blocked"]
        if blocked:
            found.append(Evidence("flow_blocked", stream.connection_name, 0, len(blocked),
                                  tuple(f.number for f in blocked[:MAX_EVIDENCE_FRAMES])))
    for life in lives:
        paused = [f for f in life.frames if f.method == "channel.flow" and f.from_broker and not f.flag("active")]
        if paused:
            found.append(_evidence("flow_blocked", life, paused))
    return found
