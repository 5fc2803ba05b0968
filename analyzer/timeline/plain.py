"""The machine's plain frames in C: what nearly every frame of a busy connection is (a delivery, the
client's ack of outstanding deliveries, a publish, the broker's confirm of numbered publishes), on
a channel incarnation in its ordinary state, done by _plain.c as the Python transitions do them.

Why: these few transitions are most of the machine's time per frame, and most of that is the
interpreter's work on a handful of fields (the dispatch, two dicts, a counter or two, and a record
of 30 fields). _plain.c does exactly what connection.py, consumer.py and publisher.py do for such a
row, or nothing: any other row, and any of these in a state it does not take (a transaction, an
early ack or confirm, a gap, an ended or refusing channel, ...), goes the Python way, which stays
the one statement of the rules. tests/test_plain.py holds the two to the same records and the same
state after every row, on the examples, the lab captures and hypothesis traffic.

Built by `pip install` (setup.py; optional); ACKSCOPE_PURE_PYTHON=1 leaves it out.
"""

from __future__ import annotations

from .. import pure_python
from . import records as r
from .channel import TO_BROKER, TO_CLIENT, ChannelLife
from .consumer import ConsumerSide, _Delivery
from .publisher import PublisherSide, _Publish

try:
    from . import _plain
except ImportError:  # not compiled
    _plain = None
try:  # the frame rows the pass makes of its Arrow batches (analyzer/_row.h): read in place here
    from .._columns import Row
except ImportError:  # not compiled: the rows are dicts
    Row = None

# The constants _plain.c compares and stores, by the names it knows them by.
STRINGS = {"to_broker": TO_BROKER, "to_client": TO_CLIENT, "basic_deliver": "basic.deliver", "basic_ack": "basic.ack",
           "basic_nack": "basic.nack", "basic_reject": "basic.reject", "basic_publish": "basic.publish",
           "ack": r.ACK, "nack": r.NACK, "reject": r.REJECT, "auto_": r.AUTO, "unknown": r.UNKNOWN,
           "acked": r.ACKED, "nacked": r.NACKED, "untracked": r.UNTRACKED, "confirm": r.CONFIRM, "tx": r.TX,
           "none": r.NONE}


def feeds_for(timeline_class: type):
    """(`feed(timeline, row) -> bool`, `feed_rows(timeline, rows, start, stop) -> int`), the C
    module configured once with the machine's classes, or (None, None) where it is not built or is
    off. `feed`: True, the row was a plain frame and is done; False, nothing changed and the Python
    transition takes it. `feed_rows`: `feed` on rows[start], rows[start + 1], ... while it takes
    them and they are the timeline's connection's, up to `stop`; the index of the first row it did
    not take."""
    if _plain is None or pure_python():
        return None, None
    classes = {cls.__name__: cls for cls in (timeline_class, ChannelLife, ConsumerSide, PublisherSide, _Delivery,
                                             _Publish, r.Delivery, r.Publish)}
    _plain.configure({**classes, "Row": Row}, STRINGS)
    return _plain.feed, _plain.feed_rows
