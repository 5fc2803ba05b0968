"""Text from the wire on an operator's terminal (DESIGN.md, "House style": text from the wire is
hostile). A client picks its own connection_name, product, vhost, queue names and reply texts: raw,
an ESC or OSC sequence retitles or clears the terminal, a newline forges whole rows in a table, a
bidirectional override makes text read backwards, and a 100 KB name buries everything after it.

`printable` is the one rule every human-readable output applies to such text (tables, summaries,
progress and log lines, error messages): control characters become visible escapes and long
values are cut with a marker saying how much was left out. `--json`, the Delta tables and the
HTML report keep the exact values (the report escapes them for HTML); `bounded` is the cut alone,
which metric labels use too (labels.py).

Backslashes are left as they are: an escape spelt out by the client reads like one made here, but
neither moves the cursor, and error messages quoting Python reprs stay readable.
"""

from __future__ import annotations

import logging
import re

# C0 (newline, tab and carriage return included: one row stays one line), DEL and C1; the Unicode
# line and paragraph separators; the bidirectional marks, embeddings, overrides and isolates
# (U+061C, U+200E-U+200F, U+202A-U+202E, U+2066-U+2069); lone surrogates, which a terminal cannot
# be sent at all (text decoded with surrogateescape carries them).
UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069\ud800-\udfff]")
NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
# A quoted value: room for any real name, not for a page of text.
DEFAULT_LIMIT = 200
# A name (connection, user, vhost) in a table column or on a summary line: a flood must not widen every row.
NAME_LIMIT = 64


def _escape(match: re.Match) -> str:
    char = match.group()
    named = NAMED.get(char)
    if named is not None:
        return named
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def bounded(text: str, limit: int) -> str:
    """`text` cut to `limit` characters, the cut said in a marker ("...[+99,800 chars]") that the
    result includes: a cut value never passes for a whole one, and the result is at most `limit`
    long plus the marker."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}...[+{len(text) - limit:,} chars]"


def printable(value, limit: int | None = DEFAULT_LIMIT) -> str:
    """`value` as text safe for a terminal: one line, no control or bidi character, at most `limit`
    characters of it (None: no cut)."""
    text = value if isinstance(value, str) else str(value)
    if limit is not None:
        text = bounded(text, limit)
    return UNPRINTABLE.sub(_escape, text)


# A log line or an error message: room for a sentence quoting a few values, not for a flood.
LINE_LIMIT = 4000


class PrintableFormatter(logging.Formatter):
    """A log line made printable whole: its message and arguments may quote the wire."""

    def format(self, record: logging.LogRecord) -> str:
        return printable(super().format(record), LINE_LIMIT)
