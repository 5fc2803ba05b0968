"""Per-channel timelines: the reference state machine for DESIGN.md's protocol rules.

Frame rows (schema.FRAMES columns, as dicts) go in, in (connection_id, seq) order per
connection; frozen records come out: one `Delivery` per basic.deliver / basic.get-ok, one
`Publish` per basic.publish, one `ChannelFacts` per channel incarnation and one `Violation` per
bad basic.ack/nack/reject. Sans-IO: no files, sockets, clocks or globals. The live agent runs it;
the Spark timeline job must produce equal tables (`tables.to_tables`).

Modules: connection.py (dispatch table, connection-level rows), channel.py (an incarnation:
transactions, gaps, ends), consumer.py and publisher.py (the two sides an incarnation owns),
records.py, tables.py.

Rules decided here where DESIGN.md is silent (tests/test_timeline.py has a case for each):
- Incarnations. A channel.open starts one; so does a channel.open-ok, or a delivery whose tag does
  not rise, when the data lacks the open (history unknown). Seen whole ("history known") means
  opened inside the data with both directions in view (after both capture.midstream rows).
- Ends. A channel ends at the first channel.close of either side and a connection at
  connection.close: the closer discards what it receives afterwards, so frames already in flight
  settle at their own row, client acks after a close change nothing and confirms after the
  client's close are lost. TCP FIN/RST without connection.close ends the connection too, applied
  when the data ends (reassembly may release frames after the FIN row). The data ending leaves
  things `open`, never `lost`.
- A close's outcomes wait for the peer's close-ok (for a close-ok without its close: the next row
  of the closer's direction): the decoder reports a hole only when the bytes after it arrive, and
  a capture.gap there turns what the missing bytes could have settled into `unknown`.
- Acks follow RabbitMQ's collect_acks: the named tag must be outstanding even with multiple=true;
  tag 0 with multiple settles everything outstanding (also nothing, without error).
- An ack naming a tag not yet delivered waits for that delivery (captures reorder the two
  directions); likewise a confirm naming a publish not yet seen. It is a violation only if the
  broker closes the channel with 406 over it. A double ack (or an ack of an auto-ack delivery) on
  an incarnation seen whole, with no gap, is one at once. After a violation the broker ignores the
  client until it closes the channel. Elsewhere the broker's 406 is the only evidence.
- Capture gaps. In the client's direction: outstanding deliveries and uncommitted work become
  unknown, confirm numbering and the channel's modes and prefetch become unknown. In the broker's
  direction: publishes awaiting a confirm become unknown. Mid-stream: the confirm numbering is
  unknown (publishes `unknown`), and so is the ack mode of consumers whose basic.consume was not
  seen: their unsettled deliveries end `unknown`, and a multiple ack covers them only if the
  client acked one of that consumer's tags exactly (an auto-ack tag cannot be acked).
- Replies show what the data lacks: confirm.select-ok and tx.select-ok set the mode; a
  tx.commit-ok / tx.rollback-ok with no commit or rollback in the data applies one.
- Known blind spot: a transaction begun before the capture (or in a gap whose select-ok is also
  missing) is not known to be one; acks before its first commit or rollback are taken at face value.
- A basic.return names the earliest mandatory publish of its incarnation not yet confirmed or
  returned with the same message identity (or exchange and routing key when identity is missing).
"""

from .connection import Timelines, TimelineInputError, replay
from .records import ChannelFacts, Delivery, Publish, Violation
from .tables import CHANNELS, INPUT_COLUMNS, VIOLATIONS, replay_frames, to_tables

__all__ = ["Timelines", "TimelineInputError", "replay", "Delivery", "Publish", "ChannelFacts", "Violation",
           "CHANNELS", "INPUT_COLUMNS", "VIOLATIONS", "replay_frames", "to_tables"]
