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
