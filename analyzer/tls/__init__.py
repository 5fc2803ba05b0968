"""TLS between TCP reassembly and AMQP framing: records in, plaintext out, keys from the clients' key log.

Sans-IO, in small parts: `keylog` (the NSS key log format), `records` (record framing per
direction), `handshake` (the hellos, read in clear), `keys` (key schedules and record
protection, on the `cryptography` library: no hand-written ciphers) and `layer` (one
connection's TLS, both directions, as the connection's decoder stack uses it). Secrets from the
key log never leave `keys`: nothing here logs, stores or prints them.
"""

from .keylog import KeyLog
from .layer import TlsLayer, looks_like_client_hello, looks_like_tls_records

__all__ = ["KeyLog", "TlsLayer", "looks_like_client_hello", "looks_like_tls_records"]
