"""The detectors' state as data, for the connection's checkpoint: an incremental run resumes them
as it resumes the state machine, instead of reading the connection's stored history again.

The state is that of the detectors fed the connection's FINAL records (and its frames) only: the
open ones of a run change in the next, so each run feeds them to the state after taking it (see
connection_analysis.py). It is a JSON document of plain values written with the timeline state's
encoding (timeline/state.py), with this package's own classes and version: reading builds fresh
instances of exactly the classes below, setting exactly their fields. Besides the detectors it
names the thresholds they were fed under (unacked_buildup lists the deliveries past them as they
come): state of other thresholds, of another version, damaged or forged is refused with a
`StateError` saying why, and the caller analyses the connection whole.
"""

from __future__ import annotations

import json
from dataclasses import asdict

from ..timeline.state import StateError, Vocabulary, from_doc, to_doc
from . import ConnectionDetectors
from .common import Firsts, Tally
from .consumer import UnackedBuildup, UnboundedPrefetch, UnknownDeliveryTag, _Buildup
from .context import FramesByIncarnation
from .flow import FlowBlocked
from .profile import Profile
from .publisher import (ConfirmNack, LostConfirm, OutOfOrderConfirm, SynchronousConfirms,
                        UnconfirmedPersistentPublish, UnroutableReturned, _Lockstep)

DETECTORS_VERSION = 2  # 2: the unacked profile's waiting events as two lists, its closed bands kept compact
# Every stored field of every class the state holds. Change one and the encoder refuses until this
# table says so, and tests/test_detector_state.py until the version is bumped.
FIELDS = {
    LostConfirm: ("tallies",), ConfirmNack: ("tallies",), UnconfirmedPersistentPublish: ("tallies",),
    OutOfOrderConfirm: ("tallies", "most_overtaken"),
    SynchronousConfirms: ("channels",),
    _Lockstep: _Lockstep.__slots__,
    UnroutableReturned: ("frames",), UnboundedPrefetch: ("consumes",),
    FramesByIncarnation: ("rows",),
    UnackedBuildup: ("age_limit_ns", "stall_limit_ns", "channels", "proven", "waiting"),
    _Buildup: _Buildup.__slots__,
    Profile: Profile.__slots__,
    UnknownDeliveryTag: ("tallies",),
    FlowBlocked: ("connection_signals", "channel_flows"),
    Tally: Tally.__slots__,
    Firsts: Firsts.__slots__,
}
# The thresholds are the run's, set again on reading (and checked against those stored by name).
NOT_STORED = {UnackedBuildup: ("thresholds",)}
VOCABULARY = Vocabulary("ackscope.detectors.state", DETECTORS_VERSION, FIELDS, NOT_STORED)
# ConnectionDetectors' attributes that are state (the rest it builds from these).
PARTS = ("lost", "nacked", "out_of_order", "persistent", "synchronous", "returned", "buildup", "unbounded",
         "violations", "flow")
CHANNELS = "channels"        # the context's ChannelFacts of ended incarnations
THRESHOLDS = "thresholds"


def to_state(detectors: ConnectionDetectors) -> dict:
    """The document of `detectors`' state (JSON-ready)."""
    top = {part: getattr(detectors, part) for part in PARTS}
    top[CHANNELS] = detectors.context.channels
    top[THRESHOLDS] = thresholds_text(detectors.context.thresholds)
    return to_doc(top, VOCABULARY)


def from_state(doc, connection: dict, thresholds) -> ConnectionDetectors:
    """Detectors resumed from a document `to_state` wrote under these thresholds; StateError otherwise."""
    parts = from_doc(doc, (*PARTS, CHANNELS, THRESHOLDS), VOCABULARY)
    if parts[THRESHOLDS] != thresholds_text(thresholds):
        raise StateError("the detectors' state was built under other thresholds")
    detectors = ConnectionDetectors(connection, thresholds)
    for part in PARTS:
        fresh = getattr(detectors, part)
        if type(parts[part]) is not type(fresh):
            raise StateError(f"detectors' state {part} is not a {type(fresh).__name__}")
        setattr(detectors, part, parts[part])
    detectors.buildup.thresholds = thresholds
    if not isinstance(parts[CHANNELS], dict):
        raise StateError("detectors' state channels is not a dict")
    detectors.context.channels = parts[CHANNELS]
    detectors.rewired()
    return detectors


def thresholds_text(thresholds) -> str:
    return json.dumps(asdict(thresholds), sort_keys=True)
