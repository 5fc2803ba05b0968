"""Every table ackscope writes, defined once as Arrow schemas.

The agent writes `frames` and `connections`; the Spark jobs import these same definitions
(converted to Spark types) for the tables they read and write. `date` (UTC day of the first
timestamp) is the partition column of every table.
"""

import pyarrow as pa

PARTITION_BY = ["date"]

_str, _i32, _i64, _bool = pa.string(), pa.int32(), pa.int64(), pa.bool_()
_ts = pa.timestamp("us", tz="UTC")

# Column -> type for every field a frame row can carry. `ts` and `date` are derived from `ts_ns`.
FRAMES = pa.schema([
    ("date", _str), ("ts", _ts), ("ts_ns", _i64),
    ("connection_id", _str), ("agent_id", _str), ("seq", _i64),
    ("direction", _str), ("channel", _i32), ("method", _str),
    ("client_addr", _str), ("client_port", _i32), ("server_addr", _str), ("server_port", _i32),
    # basic.* acknowledgement and delivery fields
    ("delivery_tag", _i64), ("multiple", _bool), ("requeue", _bool), ("redelivered", _bool),
    ("exchange", _str), ("routing_key", _str), ("queue", _str), ("consumer_tag", _str),
    ("mandatory", _bool), ("immediate", _bool), ("no_ack", _bool), ("no_local", _bool),
    ("exclusive", _bool), ("nowait", _bool),
    ("prefetch_count", _i32), ("prefetch_size", _i64), ("prefetch_global", _bool),
    # closes, flow control, declarations
    ("reply_code", _i32), ("reply_text", _str), ("failing_method", _str),
    ("message_count", _i64), ("consumer_count", _i64), ("active", _bool), ("detail", _str),
    ("durable", _bool), ("auto_delete", _bool), ("passive", _bool), ("internal", _bool),
    ("exchange_type", _str), ("source_exchange", _str), ("destination", _str),
    ("if_unused", _bool), ("if_empty", _bool), ("vhost", _str), ("arguments", _str),
    ("channel_max", _i32), ("frame_max", _i64), ("heartbeat", _i32), ("auth_mechanism", _str),
    # content: header properties and message identity (bodies are never stored)
    ("body_size", _i64), ("content_complete", _bool),
    ("content_type", _str), ("content_encoding", _str), ("headers", _str),
    ("delivery_mode", _i32), ("priority", _i32), ("correlation_id", _str), ("reply_to", _str),
    ("expiration", _str), ("message_id", _str), ("message_timestamp", _i64), ("message_type", _str),
    ("user_id", _str), ("app_id", _str), ("x_death_count", _i64),
    ("body_hash", _str), ("message_identity", _str),
    # capture facts
    ("gap_bytes", _i64), ("malformed", _bool),
    ("source", _str), ("source_packet", _i64),
])

CONNECTIONS = pa.schema([
    ("date", _str), ("first_ts", _ts), ("last_ts", _ts), ("first_ts_ns", _i64), ("last_ts_ns", _i64),
    ("connection_id", _str), ("agent_id", _str), ("source", _str),
    ("client_addr", _str), ("client_port", _i32), ("server_addr", _str), ("server_port", _i32),
    ("ip_version", _i32), ("protocol", _str), ("started_at_syn", _bool),
    ("client_product", _str), ("client_version", _str), ("client_platform", _str),
    ("connection_name", _str), ("client_capabilities", _str),
    ("server_product", _str), ("server_version", _str), ("server_platform", _str), ("cluster_name", _str),
    ("auth_mechanisms_offered", _str), ("auth_mechanism", _str), ("user", _str), ("vhost", _str),
    ("offered_channel_max", _i32), ("offered_frame_max", _i64), ("offered_heartbeat", _i32),
    ("channel_max", _i32), ("frame_max", _i64), ("heartbeat", _i32),
    ("close_code", _i32), ("close_text", _str), ("closed_by", _str), ("ended_by", _str),
    ("frames_to_broker", _i64), ("frames_to_client", _i64), ("bytes_to_broker", _i64),
    ("bytes_to_client", _i64), ("heartbeats", _i64), ("gaps", _i64), ("gap_bytes", _i64),
    ("retransmitted_bytes", _i64), ("framing_errors", _i64),
])

# Connections: timestamp columns derived from nanosecond ones, and where the date partition comes from.
CONNECTION_TIMESTAMPS = {"first_ts": "first_ts_ns", "last_ts": "last_ts_ns"}
CONNECTION_DATE_FROM = "first_ts_ns"

# -- Per-channel timelines -------------------------------------------------------------------------
# Written by the reference state machine (analyzer/timeline) and, row for row the same, by the Spark
# timeline job (rules: analyzer/timeline/__init__.py). A channel *incarnation* is (connection_id,
# channel, incarnation): a channel number starts a new one at each channel.open (or where the data
# shows one began unseen). `ts`/`settle_ts` derive from the `_ns` columns and `date` (the partition)
# from `ts_ns`, as in `frames`.

DELIVERIES = pa.schema([
    ("date", _str),                   # UTC day of ts
    ("connection_id", _str),          # frames.connection_id
    ("agent_id", _str),               # frames.agent_id
    ("channel", _i32),                # channel number
    ("incarnation", _i32),            # 1, 2, ...: which life of this channel number on the connection
    ("channel_open_seq", _i64),       # seq of that life's channel.open (its first row if the open was not captured)
    ("seq", _i64),                    # seq of the basic.deliver / basic.get-ok row
    ("ts", _ts), ("ts_ns", _i64),     # when it was delivered
    ("method", _str),                 # basic.deliver or basic.get-ok
    ("delivery_tag", _i64),           # 1, 2, ... per incarnation; up to 2**63-1
    ("consumer_tag", _str),           # basic.deliver only
    ("queue", _str),                  # from the basic.consume / basic.get; null if that was not captured
    ("exchange", _str), ("routing_key", _str),
    ("message_id", _str),             # message property
    ("message_identity", _str),       # message_id, else hash of body, exchange and routing key
    ("redelivered", _bool),           # broker's flag: delivered before (requeued, or its channel closed)
    ("x_death_count", _i64),          # dead-letter count from the x-death header
    ("no_ack", _bool),                # auto-ack consume / get; null if the consume or get was not captured
    ("consumer_prefetch", _i32),      # basic.qos global=false count in force at the basic.consume; 0 unlimited; null for get-ok or unknown
    ("channel_prefetch", _i32),       # basic.qos global=true count in force at delivery; 0 unlimited; null for get-ok or unknown
    ("outcome", _str),                # ack, nack, reject, auto, recovered, channel_closed, connection_closed, open, unknown
    ("settled_by_multiple", _bool),   # the ack/nack that settled it had multiple=true
    ("settle_tag", _i64),             # the tag that ack/nack/reject named
    ("requeue", _bool),               # the nack's / reject's / basic.recover's requeue flag
    ("in_tx", _bool),                 # settled by an ack/nack/reject: true if inside a transaction (took effect at tx.commit)
    ("settle_frame_seq", _i64),       # seq of the client's basic.ack/nack/reject/recover that settled it
    ("settle_seq", _i64),             # row the outcome took effect at: the ack (tx.commit in a transaction), the close,
                                      # FIN/RST, or the capture.gap / new open that made it unknown; its own row if later
    ("settle_ts", _ts), ("settle_ts_ns", _i64),  # when it took effect; null for open and unknown
    ("settle_latency_ns", _i64),      # settle_ts_ns - ts_ns
    ("observed_until_ts_ns", _i64),   # open rows only: ts of the connection's last row in the data
])
DELIVERY_TIMESTAMPS = {"ts": "ts_ns", "settle_ts": "settle_ts_ns"}
DELIVERY_DATE_FROM = "ts_ns"

PUBLISHES = pa.schema([
    ("date", _str),                   # UTC day of ts
    ("connection_id", _str), ("agent_id", _str),
    ("channel", _i32), ("incarnation", _i32), ("channel_open_seq", _i64),  # as in deliveries
    ("seq", _i64),                    # seq of the basic.publish row
    ("ts", _ts), ("ts_ns", _i64),     # when it was published
    ("exchange", _str), ("routing_key", _str),
    ("mandatory", _bool),
    ("persistent", _bool),            # delivery_mode 2; null if the content header was not captured
    ("message_id", _str), ("message_identity", _str),
    ("mode", _str),                   # channel mode at publish: confirm, tx, none, unknown (history not captured)
    ("confirm_seq", _i64),            # confirm-mode number (1, 2, ... from confirm.select); null if it cannot be aligned
    ("pending_before", _i64),         # earlier publishes of the incarnation still unconfirmed when this was sent; null if not exactly known
    ("outcome", _str),                # acked, nacked, committed, rolled_back, open, unknown, untracked (mode none), lost
                                      # (channel or connection closed - FIN/RST too - before its confirm or commit)
    ("confirm_tag", _i64),            # tag of the basic.ack/nack that confirmed it
    ("confirm_multiple", _bool),      # that confirm had multiple=true
    ("out_of_order", _bool),          # confirmed while an earlier publish was still unconfirmed; null unless acked/nacked
    ("out_of_order_by", _i64),        # how many earlier publishes were still unconfirmed then (0: in order)
    ("return_code", _i32), ("return_text", _str),  # basic.return that brought it back (mandatory, unroutable)
    ("return_seq", _i64),             # seq of that basic.return
    ("settle_seq", _i64),             # row the outcome took effect at: confirm, tx.commit/rollback, close, FIN/RST,
                                      # capture.gap; its own row if later (a confirm shown before its publish)
    ("settle_ts", _ts), ("settle_ts_ns", _i64),  # when; null for open, unknown and untracked
    ("settle_latency_ns", _i64),      # settle_ts_ns - ts_ns: confirm (or commit) latency
    ("observed_until_ts_ns", _i64),   # open rows only: ts of the connection's last row in the data
])
PUBLISH_TIMESTAMPS = {"ts": "ts_ns", "settle_ts": "settle_ts_ns"}
PUBLISH_DATE_FROM = "ts_ns"
