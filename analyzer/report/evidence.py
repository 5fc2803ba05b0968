"""A finding's evidence JSON as rows of (label, HTML) for the report, every value escaped.

The detectors' vocabulary (analyzer/detectors/common.py, EVIDENCE) is named here in words; a
field this module does not know is still shown, under its own name, so new evidence is never
hidden. Lists are capped (MAX_ITEMS) and say how many the finding counts in all.
"""

from __future__ import annotations

import os
from html import escape

MAX_ITEMS = 20
PUBLISHER_KINDS = {"lost_confirm", "confirm_nack", "out_of_order_confirm", "unroutable_returned",
                   "unconfirmed_persistent_publish", "synchronous_confirms"}

LABELS = {  # evidence field -> what people call it
    "tags": "delivery tags", "confirm_seqs": "publish numbers (confirm_seq)",
    "message_identities": "message identities", "message_id": "message_id",
    "seqs": "frame rows (seq)", "source_packets": "capture packets", "source_files": "capture file of each packet",
    "exchanges": "exchanges", "routing_keys": "routing keys", "queues": "queues",
    "ended_by": "channel ended by", "end_seq": "ended at frame row",
    "close_code": "close code", "close_text": "close text", "violations": "violations", "methods": "methods",
    "evidence_from": "seen in", "delivered_on_channels": "tag was outstanding on channel",
    "reply_code": "broker reply code", "reply_text": "broker reply text", "return_codes": "return codes",
    "out_of_order_by_max": "largest out-of-order distance", "oldest_tag": "oldest delivery tag",
    "oldest_seq": "oldest delivery's frame row", "oldest_age_seconds": "oldest unacked for (s)",
    "stall_seconds": "stalled at the prefetch limit (s)", "prefetch_limit": "prefetch limit",
    "peak_unacked": "peak unacked", "confirm_mode_publishes": "confirm-mode publishes",
    "lockstep_publishes": "publishes sent in lockstep", "median_idle_seconds": "median idle after a confirm (s)",
    "publishes_per_second": "publishes per second", "deliveries": "deliveries", "bounces": "bounced back",
    "x_death_max": "highest x-death count", "channels": "went through (connection#channel)",
    "redelivered_on": "redelivered on", "redelivered_on_channels": "redelivered on (connection#channel)",
    "reason": "reason", "episodes": "episodes", "still_blocked": "still blocked at the end",
}
# Lists with one item per counted thing: when they are cut, the finding's count says how many in all.
PER_ITEM = {"tags", "confirm_seqs", "message_identities", "seqs", "source_packets", "source_files", "exchanges", "routing_keys",
            "return_codes", "violations", "methods", "evidence_from", "delivered_on_channels"}
FIRST = ("tags", "confirm_seqs", "message_identities", "message_id", "source_packets", "seqs")


def evidence_rows(finding: dict, evidence: dict) -> list[tuple[str, str]]:
    rows = []
    order = [k for k in FIRST if k in evidence] + sorted(k for k in evidence if k not in FIRST)
    for name in order:
        value = evidence[name]
        if isinstance(value, list) and all(v is None for v in value):
            continue  # e.g. no channel to name for a tag delivered nowhere
        if value is None:
            continue
        label = LABELS.get(name, name.replace("_", " "))
        if name == "tags" and finding.get("kind") in PUBLISHER_KINDS:
            label = "confirm tags"
        rows.append((label, _value_html(name, value, finding)))
    if finding.get("source") or evidence.get("source_packets"):
        rows.append(("capture file", _capture_html(finding, evidence)))
    return rows


def _value_html(name: str, value, finding: dict) -> str:
    if name == "episodes" and isinstance(value, list):
        return "<br>".join(escape(_episode(e)) for e in value[:MAX_ITEMS]) + _more(value, None)
    if isinstance(value, list):
        shown = value[:MAX_ITEMS]
        items = "".join(f"<code>{escape(_scalar(v))}</code>" for v in shown)
        count = finding.get("count") if name in PER_ITEM else None
        return f'<span class="items">{items}</span>{_more(value, count)}'
    if isinstance(value, dict):
        return escape(", ".join(f"{k}={_scalar(v)}" for k, v in value.items()))
    return escape(_scalar(value))


def _more(value: list, count: int | None) -> str:
    shown = min(len(value), MAX_ITEMS)
    if len(value) > shown:
        return f' <span class="more">first {shown} of {len(value):,} shown</span>'
    if count is not None and count > shown and shown >= MAX_ITEMS:
        return f' <span class="more">first {shown} listed; the finding counts {count:,}</span>'
    return ""


def _scalar(value) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def _episode(episode) -> str:
    if not isinstance(episode, dict):
        return _scalar(episode)
    end = episode.get("unblocked_seq")
    seconds = episode.get("seconds")
    return (f"blocked at row {episode.get('blocked_seq')} → "
            + (f"unblocked at row {end}" if end is not None else "never unblocked in the data")
            + (f" ({seconds:.3g} s)" if isinstance(seconds, (int, float)) else ""))


def _capture_html(finding: dict, evidence: dict) -> str:
    """The capture file and a Wireshark filter for its packets; one of each per file where the
    evidence's packets are in several (`source_files`: a capture in pieces numbers each from 1)."""
    source = finding.get("source") or ""
    packets = (evidence.get("source_packets") or [])[:MAX_ITEMS]
    files = evidence.get("source_files")
    files = files[:MAX_ITEMS] if isinstance(files, list) else [source] * len(packets)
    by_file: dict[str, list[int]] = {}
    for packet, file in zip(packets, files):
        if isinstance(packet, int):
            by_file.setdefault(file if isinstance(file, str) else source, []).append(packet)
    if not by_file:
        return _file_html(source, [])
    return "<br>".join(_file_html(file, file_packets) for file, file_packets in by_file.items())


def _file_html(source: str, packets: list[int]) -> str:
    html = f'<code title="{escape(source)}">{escape(os.path.basename(source) or source)}</code>' if source else ""
    if packets:
        # Several frames can share a packet: the filter names each packet once.
        wireshark = "frame.number in {" + " ".join(str(p) for p in dict.fromkeys(packets)) + "}"
        html += f' <span class="hint">Wireshark filter:</span> <code class="filter">{escape(wireshark)}</code>'
    return html
