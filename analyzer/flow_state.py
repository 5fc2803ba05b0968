"""A flow's decoder state as data: what a capture cut in pieces needs to continue a connection.

A capture comes in pieces (rotated files, scheduled ingests, a restarted watcher). At the end of a
piece every open flow describes itself with `snapshot()`: plain JSON values only (str, int, bool,
None, lists, dicts; buffered bytes as base64, bounded in size), never a pickle. The next piece
rebuilds it with `restore(doc)`, which checks every field for type and range as it reads it and
raises `FlowStateError` naming the field: a snapshot that fails any check is refused, and its flow
starts mid-stream as it would without one (nothing false is decoded from a bad state).

The layers of a flow (helpers/FLOW_STATE.md): `reassembly.TcpDirection` per direction, an optional
TLS layer (`"tls"`, None for plaintext), `framing.FrameReader` per direction, and the connection
(`connection.AmqpConnection`) that holds them with its identity, facts and pending content.
"""

from __future__ import annotations

import base64
import binascii
import json

FORMAT_VERSION = 1
MAX_SNAPSHOT_BYTES = 64 << 20  # one flow's JSON document at most (4 MiB of pending TCP data per direction and some)
MAX_TEXT = 1 << 16             # a string field's length at most (ids, names, facts from the wire)
U32 = (1 << 32) - 1
I64 = (1 << 63) - 1


class FlowStateError(ValueError):
    """A flow's saved state is not one this build wrote, or not a state a flow can be in: the field
    named is missing, of the wrong type or out of range."""


def dumps(doc: dict) -> str:
    return json.dumps(doc, separators=(",", ":"), allow_nan=False)


def loads(text: str) -> dict:
    if not isinstance(text, str) or len(text) > MAX_SNAPSHOT_BYTES:
        raise FlowStateError(f"state: not a string of at most {MAX_SNAPSHOT_BYTES} characters")
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise FlowStateError(f"state: not JSON: {exc}") from None
    return doc


def encode_bytes(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


class Fields:
    """The fields of one snapshot object, each checked as it is read. `where` names the object in
    errors ("connection.tcp[0]"); every error names the field."""

    def __init__(self, doc, where: str):
        if not isinstance(doc, dict):
            raise FlowStateError(f"{where}: not an object")
        self.doc, self.where = doc, where

    def _get(self, key: str):
        if key not in self.doc:
            raise FlowStateError(f"{self.where}.{key}: missing")
        return self.doc[key]

    def fail(self, key: str, why: str):
        raise FlowStateError(f"{self.where}.{key}: {why}")

    def int(self, key: str, lo: int = 0, hi: int = I64, optional: bool = False) -> int | None:
        value = self._get(key)
        if value is None and optional:
            return None
        if type(value) is not int or not lo <= value <= hi:
            self.fail(key, f"not an integer in [{lo}, {hi}]" + (" or null" if optional else ""))
        return value

    def bool(self, key: str) -> bool:
        value = self._get(key)
        if type(value) is not bool:
            self.fail(key, "not a boolean")
        return value

    def str(self, key: str, max_len: int = MAX_TEXT, optional: bool = False, choices=None) -> str | None:
        value = self._get(key)
        if value is None and optional:
            return None
        if type(value) is not str or len(value) > max_len:
            self.fail(key, f"not a string of at most {max_len} characters")
        if choices is not None and value not in choices:
            self.fail(key, f"not one of {sorted(choices)}")
        return value

    def bytes(self, key: str, max_len: int) -> bytes:
        value = self.str(key, max_len=4 * (max_len // 3 + 1))
        try:
            data = base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            self.fail(key, "not base64")
        if len(data) > max_len:
            self.fail(key, f"more than {max_len} bytes")
        return data

    def list(self, key: str, max_items: int, length: int | None = None) -> list:
        value = self._get(key)
        if type(value) is not list or len(value) > max_items or (length is not None and len(value) != length):
            self.fail(key, f"not a list of {length if length is not None else f'at most {max_items}'} items")
        return value

    def end(self, key: str) -> tuple[bytes, int]:
        """A TCP end saved as [address text, port]: (packed address, port), a flow key's half."""
        import ipaddress
        end = self.list(key, 2, length=2)
        try:
            if type(end[0]) is not str:
                raise ValueError
            address = ipaddress.ip_address(end[0]).packed
        except ValueError:
            self.fail(key, "not an IP address")
        if type(end[1]) is not int or not 0 <= end[1] <= 0xFFFF:
            self.fail(key, "not a TCP port")
        return address, end[1]

    def obj(self, key: str) -> "Fields":
        return Fields(self._get(key), f"{self.where}.{key}")

    def raw(self, key: str):
        return self._get(key)


def check_value(value, arrow_type, where: str):
    """A scalar of a row checked against its column's Arrow type (frames and connections columns):
    strings bounded, integers within the type's range, booleans, or null."""
    import pyarrow as pa
    if value is None:
        return None
    if pa.types.is_string(arrow_type):
        ok = type(value) is str and len(value) <= MAX_TEXT
    elif pa.types.is_boolean(arrow_type):
        ok = type(value) is bool
    elif pa.types.is_integer(arrow_type):
        bits = arrow_type.bit_width - 1
        ok = type(value) is int and -(1 << bits) <= value < (1 << bits)
    else:
        ok = False
    if not ok:
        raise FlowStateError(f"{where}: not a value of type {arrow_type}")
    return value
