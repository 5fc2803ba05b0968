"""Replays each channel incarnation of a capture with the protocol rules of DESIGN.md, as the
lab's own, deliberately plain, second opinion: which publishes were confirmed and how, which
deliveries were settled and when, which settlements named a tag that was not outstanding.

What a capture cannot tell stays unknown instead of guessed: a channel opened before the
capture began has unknown publish numbering and unknown consumers, so it yields no publisher
facts and no unknown-tag facts; a channel still open when the capture ends has no end.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tests.lab.capture import Capture, Frame


@dataclass
class Publish:
    frame: Frame
    mode: str  # "confirm", "tx", "plain", or "unknown" (channel opened before the capture)
    seq: int | None  # its confirm-mode number; None outside confirm mode
    unconfirmed_before: int  # how many earlier publishes still waited for a confirm
    confirm: Frame | None = None  # the basic.ack or basic.nack that settled it, before the end


@dataclass
class Delivery:
    frame: Frame
    manual_ack: bool | None  # None: the consumer or get was set up before the capture
    settlement: Frame | None = None  # the client's basic.ack, basic.nack or basic.reject


@dataclass
class ChannelLife:
    """One incarnation of a channel number on one connection: from channel.open to its close."""

    stream: int
    channel: int
    connection_name: str | None
    opened_in_capture: bool
    end_time: float | None = None  # None: still open when the capture ended
    confirm_mode: bool = False
    tx_mode: bool = False
    frames: list[Frame] = field(default_factory=list)
    publishes: list[Publish] = field(default_factory=list)
    deliveries: list[Delivery] = field(default_factory=list)
    bad_settlements: list[Frame] = field(default_factory=list)  # tags that were not outstanding
    overtaking_confirms: list[Frame] = field(default_factory=list)  # single confirms past an older publish
    unbounded_consumes: list[Frame] = field(default_factory=list)  # manual ack, no prefetch limit
    peak_unacked: int = 0

    def ended_before(self, frame: Frame) -> bool:
        return self.end_time is not None and frame.time > self.end_time

    def unsettled(self) -> list[Delivery]:
        return [d for d in self.deliveries if d.manual_ack and d.settlement is None]


def channel_lives(capture: Capture) -> list[ChannelLife]:
    lives: list[ChannelLife] = []
    current: dict[tuple[int, int], ChannelLife] = {}
    for frame in capture.frames:
        if frame.channel == 0:
            if frame.method == "connection.close":
                for life in current.values():
                    if life.stream == frame.stream and life.end_time is None:
                        life.end_time = frame.time
            continue
        key = (frame.stream, frame.channel)
        if frame.method == "channel.open" or key not in current:
            current[key] = ChannelLife(frame.stream, frame.channel, capture.connection_name(frame),
                                       opened_in_capture=frame.method == "channel.open")
            lives.append(current[key])
        life = current[key]
        life.frames.append(frame)
        if frame.method == "channel.close" and life.end_time is None:
            life.end_time = frame.time
    for life in lives:
        stream = capture.streams[life.stream]
        if life.end_time is None and stream.ended:
            life.end_time = stream.end_time
        _replay(life)
    return lives


def _replay(life: ChannelLife) -> None:
    unconfirmed: dict[int, Publish] = {}
    outstanding: dict[int, Delivery] = {}
    settled_in_tx: list[Delivery] = []
    consumer_manual_ack: dict[str, bool] = {}
    pending_consumes: list[bool] = []  # manual_ack of consumes whose consume-ok names the tag
    pending_gets: list[bool] = []
    prefetch_limited = False
    confirm_count = 0  # both sides number publishes from 1 after confirm.select
    for frame in life.frames:
        method, late = frame.method, life.ended_before(frame)
        if not frame.from_broker:
            if method == "confirm.select":
                life.confirm_mode = True
            elif method == "tx.select":
                life.tx_mode = True
            elif method == "tx.commit":
                settled_in_tx.clear()
            elif method == "tx.rollback":
                # A rollback undoes the transaction's acks: those deliveries are unacked again.
                for delivery in settled_in_tx:
                    delivery.settlement = None
                    outstanding[delivery.frame.tag] = delivery
                settled_in_tx.clear()
            elif method == "basic.qos":
                prefetch_limited = int(frame.args["prefetch_count"]) > 0
            elif method == "basic.consume":
                manual_ack = not frame.flag("no_ack")
                pending_consumes.append(manual_ack)
                if manual_ack and life.opened_in_capture and not prefetch_limited:
                    life.unbounded_consumes.append(frame)
            elif method == "basic.get":
                pending_gets.append(not frame.flag("no_ack"))
            elif method == "basic.publish":
                seq, mode = None, _publishing_mode(life)
                if mode == "confirm":
                    confirm_count += 1
                    seq = confirm_count
                publish = Publish(frame, mode, seq, unconfirmed_before=len(unconfirmed))
                life.publishes.append(publish)
                if seq is not None:
                    unconfirmed[seq] = publish
            elif method in ("basic.ack", "basic.nack", "basic.reject") and not late:
                settled = _settle(frame, outstanding, life)
                if life.tx_mode:
                    settled_in_tx.extend(settled)
        else:
            if method == "basic.consume-ok" and pending_consumes:
                consumer_manual_ack[frame.args["consumer_tag"]] = pending_consumes.pop(0)
            elif method in ("basic.deliver", "basic.get-ok"):
                if method == "basic.deliver":
                    manual_ack = consumer_manual_ack.get(frame.args["consumer_tag"])
                else:
                    manual_ack = pending_gets.pop(0) if pending_gets else None
                delivery = Delivery(frame, manual_ack)
                life.deliveries.append(delivery)
                if manual_ack:
                    outstanding[frame.tag] = delivery
                    life.peak_unacked = max(life.peak_unacked, len(outstanding))
            elif method == "basic.get-empty" and pending_gets:
                pending_gets.pop(0)
            elif method in ("basic.ack", "basic.nack") and life.confirm_mode and not late:
                _confirm(frame, unconfirmed, life)


def _publishing_mode(life: ChannelLife) -> str:
    if not life.opened_in_capture:
        return "unknown"
    return "confirm" if life.confirm_mode else "tx" if life.tx_mode else "plain"


def _settle(frame: Frame, outstanding: dict[int, Delivery], life: ChannelLife) -> list[Delivery]:
    tag, multiple = frame.tag, frame.flag("multiple")
    if tag not in outstanding and not (multiple and tag == 0):
        # Unknown only if the channel's deliveries are all in the capture.
        if life.opened_in_capture:
            life.bad_settlements.append(frame)
        return []
    tags = [t for t in outstanding if t <= tag or tag == 0] if multiple else [tag]
    settled = [outstanding.pop(t) for t in sorted(tags)]
    for delivery in settled:
        delivery.settlement = frame
    return settled


def _confirm(frame: Frame, unconfirmed: dict[int, Publish], life: ChannelLife) -> None:
    tag, multiple = frame.tag, frame.flag("multiple")
    if not multiple and any(seq < tag for seq in unconfirmed):
        life.overtaking_confirms.append(frame)
    for seq in [s for s in unconfirmed if s <= tag] if multiple else [tag]:
        if seq in unconfirmed:
            unconfirmed.pop(seq).confirm = frame
