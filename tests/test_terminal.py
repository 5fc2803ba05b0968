"""terminal.printable, the one rule of every human-readable output, and the tables that use it."""

from __future__ import annotations

import logging

from analyzer.findings import render_findings
from analyzer.summary import render_summary
from analyzer.terminal import NAME_LIMIT, PrintableFormatter, bounded, printable


def finding(**overrides) -> dict:
    row = {"severity": "critical", "kind": "lost_confirm", "connection_id": "10.0.0.7:40112>10.0.0.2:5672@17",
           "connection_name": "orders", "client": "10.0.0.7:40112", "server": "10.0.0.2:5672", "channel": 1,
           "first_ts_ns": 1_700_000_000 * 10**9, "count": 3, "summary": "3 publishes were never confirmed"}
    return row | overrides


def test_control_bidi_and_separator_characters_become_visible_escapes():
    assert printable("a\x1b]0;pwn\x07\x1b[2J") == "a\\x1b]0;pwn\\x07\\x1b[2J"
    assert printable("row\r\nforged\tcell") == "row\\r\\nforged\\tcell"
    assert printable("\x00\x7f\x85\x9b") == "\\x00\\x7f\\x85\\x9b"
    assert printable("abc\u202edef\u2066\u2069\u200f\u061c") == "abc\\u202edef\\u2066\\u2069\\u200f\\u061c"
    assert printable("line\u2028para\u2029") == "line\\u2028para\\u2029"
    assert printable("lone \udc80 surrogate") == "lone \\udc80 surrogate"
    assert printable("café, 東京, emoji 🐇, back\\slash") == "café, 東京, emoji 🐇, back\\slash"  # left alone


def test_long_values_are_cut_with_a_marker_of_how_much():
    assert bounded("x" * 10, 10) == "x" * 10
    assert bounded("x" * 100_000, 10) == "x" * 10 + "...[+99,990 chars]"
    assert printable("\x1b" * 500, 4) == "\\x1b" * 4 + "...[+496 chars]"
    assert printable("y" * 300, None) == "y" * 300


def test_log_lines_are_printable_whole():
    record = logging.LogRecord("ackscope.agent", logging.WARNING, __file__, 1, "flush of %s failed: %s", ("lake\n",
                               "\x1b[2Jforged"), None)
    assert PrintableFormatter("ackscope capture: %(message)s").format(record) == \
        "ackscope capture: flush of lake\\n failed: \\x1b[2Jforged"


def test_a_forged_row_in_a_name_stays_in_its_own_row():
    forged = "app\ncritical  lost_confirm  forged  1  2026-01-01 00:00:00.000  99  forged"
    table = render_findings([finding(connection_name=forged, summary="msg \x1b]0;pwn\x07 id")]).split("\n")
    assert len(table) == 2 and "app\\ncritical" in table[1] and "\\x1b]0;pwn\\x07" in table[1]


def test_a_connection_with_no_connections_row_is_named_by_the_ends_its_id_names():
    """A finding whose connection has no row in the connections table (so no name and no ends)."""
    table = render_findings([finding(connection_name=None, client=None, server=None)])
    assert "None" not in table
    assert "10.0.0.7:40112 > 10.0.0.2:5672" in table.split("\n")[1]
    assert "10.0.0.7:40112 > 10.0.0.2:5672" in render_findings([finding(connection_name=None)])
    unknown = render_findings([finding(connection_name=None, client=None, server=None, connection_id=None)])
    assert "unknown connection" in unknown


def test_the_summary_cuts_and_escapes_names_users_and_vhosts():
    connection = {"connection_id": "c@1", "protocol": "amqp-0-9-1", "connection_name": "n" * 5000 + "\x1b[2J",
                  "client_product": None, "user": "u\nv", "vhost": "\u202e/", "frames_to_broker": 1,
                  "frames_to_client": 1, "gaps": 0, "ended_by": "tcp.fin", "started_at_syn": True,
                  "tls_version": "TLSv1.3\x1b[2J", "tls_note": None}
    lines = render_summary({"lake": "l", "frame_rows": 2, "rows_by_method": {}, "connections": [connection]}).split("\n")
    assert len(lines) == 2
    assert "n" * NAME_LIMIT + "...[+4,940 chars]" in lines[1] and "user=u\\nv vhost=\\u202e/" in lines[1]
    assert "over TLSv1.3\\x1b[2J" in lines[1]
