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
    # TLS (amqps): null for plaintext. Not decrypted: protocol "tls", no frames, and tls_note says why.
    ("tls_version", _str), ("tls_cipher_suite", _str), ("tls_sni", _str), ("tls_decrypted", _bool),
    ("tls_note", _str),
])

# A capture's open flows between two ingests (flow_lake.py): per capture source, one row per flow
# holding its decoder state (flow_state.py) as JSON, and the source's own row (connection_id "").
FLOW_STATE = pa.schema([
    ("date", _str), ("source", _str), ("connection_id", _str), ("format_version", _i32), ("state", _str),
    ("last_ts_ns", _i64),
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
    ("outcome", _str),                # acked, nacked, committed, rolled_back, open, overdue (open at the end of the data
                                      # and older than the overdue timeout, default 60 s), unknown, untracked (mode none),
                                      # lost (channel or connection closed - FIN/RST too - before its confirm or commit)
    ("confirm_tag", _i64),            # tag of the basic.ack/nack that confirmed it
    ("confirm_multiple", _bool),      # that confirm had multiple=true
    ("out_of_order", _bool),          # confirmed while an earlier publish was still unconfirmed; null unless acked/nacked
    ("out_of_order_by", _i64),        # its confirm_seq minus the oldest confirm_seq still unconfirmed then (0: in order)
    ("return_code", _i32), ("return_text", _str),  # basic.return that brought it back (mandatory, unroutable)
    ("return_seq", _i64),             # seq of that basic.return
    ("settle_seq", _i64),             # row the outcome took effect at: confirm, tx.commit/rollback, close, FIN/RST,
                                      # capture.gap; its own row if later (a confirm shown before its publish)
    ("settle_ts", _ts), ("settle_ts_ns", _i64),  # when; null for open, unknown and untracked
    ("settle_latency_ns", _i64),      # settle_ts_ns - ts_ns: confirm (or commit) latency
    ("observed_until_ts_ns", _i64),   # open and overdue rows only: ts of the connection's last row in the data
])
PUBLISH_TIMESTAMPS = {"ts": "ts_ns", "settle_ts": "settle_ts_ns"}
PUBLISH_DATE_FROM = "ts_ns"

# -- Findings (analyzer/detectors; across connections gathered by spark_jobs/findings.py) -------
# One row per finding: a pathology on one channel incarnation (or connection, or message), with the
# evidence to look it up in the capture. `finding_id` is a hash of what identifies it (kind, where,
# and its first evidence), so a rerun over the same data replaces a finding rather than adding one.

FINDING_KINDS = (
    "lost_confirm", "confirm_nack", "out_of_order_confirm", "unacked_buildup", "requeue_loop",
    "unknown_delivery_tag", "redelivery_after_close", "unroutable_returned",
    "unconfirmed_persistent_publish", "synchronous_confirms", "unbounded_prefetch", "flow_blocked",
)
SEVERITIES = ("info", "warning", "critical")
# The severity of each kind: the one table the detectors, the alert rules, the dashboards and the
# report read (README, "Findings").
FINDING_SEVERITY = {
    # Critical: a publish the publisher believes safe is gone, or the client broke the protocol
    # and the broker closed its channel.
    "lost_confirm": "critical",
    "unknown_delivery_tag": "critical",
    # Warning: the broker or a consumer is in trouble now and someone should act.
    "confirm_nack": "warning",
    "unacked_buildup": "warning",
    "requeue_loop": "warning",
    "redelivery_after_close": "warning",
    "unbounded_prefetch": "warning",
    "flow_blocked": "warning",
    # Info: a design choice worth knowing, not a failure. Out-of-order confirms are allowed by the
    # protocol (DESIGN.md: apps must not rely on the order); a publisher that asked for `mandatory`
    # was told about its unroutable message; persistent publishes without confirms and lockstep
    # confirms are risk and cost the application chose.
    "out_of_order_confirm": "info",
    "unroutable_returned": "info",
    "unconfirmed_persistent_publish": "info",
    "synchronous_confirms": "info",
}

FINDINGS = pa.schema([
    ("date", _str),                   # UTC day of first_ts
    ("finding_id", _str),             # stable hash: same finding, same id, run after run
    ("kind", _str),                   # one of FINDING_KINDS
    ("severity", _str),               # info, warning or critical
    ("connection_id", _str), ("agent_id", _str),
    ("connection_name", _str),        # the client's connection_name property, if it sent one
    ("client", _str), ("server", _str),  # addr:port of each end
    ("channel", _i32),                # 0 for connection-level findings
    ("incarnation", _i32),            # null for connection-level findings
    ("first_ts", _ts), ("first_ts_ns", _i64),  # the span the finding covers
    ("last_ts", _ts), ("last_ts_ns", _i64),
    ("count", _i64),                  # how many of what the kind counts (README, "Findings")
    ("value", pa.float64()),          # the measure compared with the threshold (seconds, share, ...), if any
    ("threshold", pa.float64()),      # the threshold it crossed, if any
    ("message_identity", _str),       # per-message kinds (requeue_loop): the message
    ("summary", _str),                # one readable sentence
    ("evidence", _str),               # JSON: tags, confirm numbers, message identities, frame seqs, source packets
    ("source", _str),                 # capture file (or interface) of the first evidence frame
])
FINDING_TIMESTAMPS = {"first_ts": "first_ts_ns", "last_ts": "last_ts_ns"}
FINDING_DATE_FROM = "first_ts_ns"

# -- Channel metrics (analyzer/timeline/metrics.py) --------------------------------------------------
# One row per channel incarnation and time bucket: what a dashboard plots. Buckets are
# [bucket_start, bucket_start + bucket_seconds), aligned to the Unix epoch; an event exactly on a
# boundary belongs to the bucket it starts. A row exists for every bucket in which something happened
# on the incarnation (its open or end, a delivery, settle, publish or confirm) and for every bucket
# between two such with something outstanding at its end; an idle channel with nothing outstanding
# gets no rows. Counts are of items (a multiple ack settling ten counts ten), taken at the time each
# thing took effect (deliveries and publishes at their row, settles at settle_ts_ns).
#
# "unacked": deliveries with no_ack = false (manual ack) from their row until settle_ts_ns (ack, nack,
# reject - at tx.commit in a transaction -, recover, close), or, still open when the data ends, to the
# end. Deliveries with outcome `unknown` (a capture gap, a missed open) never count: the data cannot
# say how long they stayed unacked; deliveries_unknown counts them. Neither do deliveries of unknown
# ack mode (no_ack null). "unconfirmed": publishes with mode confirm from their row until acked,
# nacked or lost (or to the end, if still open); `unknown` ones never count (publishes_unknown).
# "At the end" of a bucket: after every row with ts < its end (as_of_ns when the data ends inside).

CHANNEL_METRICS = pa.schema([
    ("date", _str),                   # UTC day of bucket_start
    ("bucket_start", _ts), ("bucket_start_ns", _i64),
    ("bucket_seconds", _i32),         # the bucket's length
    ("connection_id", _str), ("agent_id", _str),
    ("channel", _i32), ("incarnation", _i32),  # the channel incarnation, as in deliveries
    ("as_of_ns", _i64),               # instant the end-of-bucket values describe: the bucket's end, or the
                                      # end of the data (channels.observed_until_ts_ns) if that is inside it
    ("unacked", _i64),                # unacked deliveries at the end of the bucket
    ("unacked_max", _i64),            # most unacked at once during the bucket (its start included)
    ("oldest_unacked_age_ns", _i64),  # as_of_ns - ts_ns of the oldest delivery unacked at the end; null if none
    ("oldest_unacked_seq", _i64),     # that delivery's seq (deliveries.seq)
    ("unconfirmed", _i64),            # unconfirmed publishes at the end of the bucket
    ("unconfirmed_max", _i64),        # most unconfirmed at once during the bucket (its start included)
    ("oldest_unconfirmed_age_ns", _i64),  # as_of_ns - ts_ns of the oldest publish unconfirmed at the end; null if none
    ("oldest_unconfirmed_seq", _i64), # that publish's seq (publishes.seq)
    ("consumer_prefetch", _i32),      # prefetch in force: that of the last basic.deliver at or before the end
    ("channel_prefetch", _i32),       # of the bucket (deliveries columns); 0 unlimited; null before the first
                                      # basic.deliver of the incarnation, or when that delivery's was unknown
    ("deliveries", _i64),             # basic.deliver + basic.get-ok rows in the bucket, any ack mode
    ("redeliveries", _i64),           # of which redelivered = true
    ("deliveries_unknown", _i64),     # of which the outcome is unknown (never counted as unacked)
    ("acks", _i64),                   # deliveries settled by basic.ack in the bucket
    ("nacks", _i64),                  # ... by basic.nack
    ("rejects", _i64),                # ... by basic.reject
    ("requeues", _i64),               # ... by a nack or reject with requeue = true
    ("publishes", _i64),              # basic.publish rows in the bucket, any mode
    ("returns", _i64),                # of which the broker returned (basic.return; counted at the publish: the
                                      # tables keep the return's seq, not its time)
    ("publishes_unknown", _i64),      # of which the outcome is unknown (never counted as unconfirmed)
    ("confirms", _i64),               # publishes acked by the broker in the bucket
    ("confirm_nacks", _i64),          # publishes nacked by the broker in the bucket
    ("lost", _i64),                   # publishes lost in the bucket (channel or connection closed unconfirmed/uncommitted)
])
CHANNEL_METRIC_TIMESTAMPS = {"bucket_start": "bucket_start_ns"}
CHANNEL_METRIC_DATE_FROM = "bucket_start_ns"

# One row per `ackscope analyze` run: what it analysed and why. The next run starts from the
# frames version of the last run that covered everything (scope "full" or "new_data").
ANALYSIS_RUNS = pa.schema([
    ("date", _str),                   # UTC day of started_ts
    ("run_id", _str),                 # every Delta commit of the run carries it as `userMetadata`
    ("started_ts", _ts), ("finished_ts", _ts),
    ("scope", _str),                  # full, new_data or days (--since/--until: those days' connections again)
    ("reason", _str),                 # why this scope (first run, frames compacted, settings changed, ...)
    ("since", _str), ("until", _str),  # the days of a "days" run
    ("frames_version", _i64),         # the frames snapshot analysed
    ("baseline_version", _i64),       # a new_data run: the frames version it continued from
    ("connections", _i64),            # connections analysed (again) by this run
    ("frames", _i64),                 # their frame rows
    ("bucket_seconds", _i64), ("overdue_ns", _i64),  # settings the stored rows were made with
    ("thresholds", _str),             # JSON: the detector thresholds of the findings
])

# One row per connection an analysis run has seen: where the next run carries it on from
# (analyzer/timeline/carry.py). Replaced per connection by every run that analyses it.
ANALYSIS_STATE = pa.schema([
    ("date", _str),                   # UTC day of last_ts_ns
    ("connection_id", _str),
    ("frames_version", _i64),         # the frames snapshot analysed up to
    ("last_seq", _i64), ("last_ts_ns", _i64),  # the connection's last frame analysed
    ("boundary_ns", _i64),            # start of the channel_metrics bucket the next run recomputes from
    ("carried_records", _i64),        # deliveries/publishes/channels the checkpoint holds (open + boundary)
    ("format", _str),                 # carry.FORMAT of the code that wrote the checkpoint
    ("checkpoint", pa.binary()),      # null: analysed whole and ended (closed or FIN/RST); new frames of it
                                      # are analysed with the whole connection again
])
