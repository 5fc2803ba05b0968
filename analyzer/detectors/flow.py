"""flow_blocked: the broker holding publishers back. One finding per connection that got
connection.blocked (a resource alarm: memory or disk), and one per channel incarnation paused by
a broker channel.flow active=false; each with how long until it was released. Read from the
frames: flow control is not part of the per-channel records. These frames are few (a broker
alarm, not traffic), so they are held until the connection ends.
"""

from __future__ import annotations

from .common import MAX_EVIDENCE, RawFinding, fixed, least, seconds
from .context import Context, FramesByIncarnation

CONNECTION_SIGNALS = ("connection.blocked", "connection.unblocked")


def episodes(signals: list[tuple], until_ns: int | None) -> dict:
    """`signals`: (seq, ts_ns, agent_id, is_start, is_release, detail) of one place, in seq order.
    Each start is held back until the first release after it (or `until_ns`, the end of the data
    for that place); starts sharing a release are one episode, timed from the first of them."""
    by_release: dict[int | None, list] = {}
    pending: list[tuple] = []
    for signal in signals:
        if signal[4]:  # a release answers every start before it that none answered yet
            for start in pending:
                by_release.setdefault(signal[0], [signal[1]]).append(start)
            pending = []
        if signal[3]:
            pending.append(signal)
    for start in pending:
        by_release.setdefault(None, [None]).append(start)
    listed, n, held_ns, first_ns, last_ns, agent_id = [], 0, 0, None, None, None
    for release_seq, (release_ns, *starts) in by_release.items():
        start_ns = min(s[1] for s in starts)
        end_ns = max(release_ns if release_ns is not None else until_ns if until_ns is not None else s[1]
                     for s in starts)
        first = min(starts, key=lambda s: s[0])
        listed.append({"blocked_seq": first[0], "unblocked_seq": release_seq,
                       "seconds": seconds(end_ns - start_ns), "detail": first[5]})
        n += len(starts)
        held_ns += end_ns - start_ns
        first_ns = start_ns if first_ns is None else min(first_ns, start_ns)
        last_ns = end_ns if last_ns is None else max(last_ns, end_ns)
        for s in starts:
            agent_id = least(agent_id, s[2])
    listed.sort(key=lambda e: e["blocked_seq"])
    seqs = sorted({s for e in listed[:MAX_EVIDENCE] for s in (e["blocked_seq"], e["unblocked_seq"]) if s is not None})
    return {"n": n, "held_ns": held_ns, "first_ns": first_ns, "last_ns": last_ns, "agent_id": agent_id,
            "still_blocked": None in by_release, "reason": listed[0]["detail"],
            "episodes": [{k: e[k] for k in ("blocked_seq", "unblocked_seq", "seconds")} for e in listed[:MAX_EVIDENCE]],
            "seqs": seqs[:MAX_EVIDENCE]}


class ChannelFlows(FramesByIncarnation):
    """channel.flow rows, each with fields (stops, resumes)."""


class FlowBlocked:
    """The broker's flow control, whatever its length: even a short block stalls every publisher
    on the connection, and it means a broker resource alarm went off."""

    def __init__(self):
        self.connection_signals: list[tuple] = []
        self.channel_flows = ChannelFlows()

    @staticmethod
    def wants(row) -> bool:
        return row["direction"] == "to_client" and (row["method"] in CONNECTION_SIGNALS
                                                    or row["method"] == "channel.flow")

    def frame(self, row) -> None:
        method = row["method"]
        if method == "channel.flow":
            active = row.get("active")
            self.channel_flows.add(row["channel"], row["seq"], row["ts_ns"], row.get("agent_id"),
                                   (active is False, active is True))
        else:
            self.connection_signals.append((row["seq"], row["ts_ns"], row.get("agent_id"),
                                            method == "connection.blocked", method == "connection.unblocked",
                                            row.get("detail")))

    def findings(self, context: Context) -> list[RawFinding]:
        out = []
        signals = sorted(self.connection_signals)
        if any(s[3] for s in signals):
            e = episodes(signals, context.connection.get("last_ts_ns"))
            still = ", and was still blocked when the data ended" if e["still_blocked"] else ""
            reason = e["reason"] if e["reason"] is not None else "no reason given"
            out.append(RawFinding(
                "flow_blocked", e["agent_id"], 0, None, e["first_ns"], e["last_ns"], e["n"],
                value=seconds(e["held_ns"]),
                summary=f"The broker blocked this connection's publishing {e['n']} times (connection.blocked: "
                        f"{reason}) for {fixed(seconds(e['held_ns']), 1)} s in all{still}: a resource alarm (memory "
                        f"or disk) on the broker",
                evidence=dict(seqs=e["seqs"], episodes=e["episodes"], reason=e["reason"],
                              still_blocked=e["still_blocked"])))
        by_incarnation: dict[tuple, list] = {}
        for key, seq, ts_ns, agent_id, (paused, resumed) in self.channel_flows.placed(context, keep_unplaced=False):
            by_incarnation.setdefault(key, []).append((seq, ts_ns, agent_id, paused, resumed, None))
        for (channel, incarnation), signals in by_incarnation.items():
            if not any(s[3] for s in signals):
                continue
            facts = context.channels[(channel, incarnation)]
            until = next((t for t in (facts.end_ts_ns, facts.observed_until_ts_ns, facts.open_ts_ns) if t is not None),
                         None)
            e = episodes(signals, until)
            still = ", and it was still paused when the data ended" if e["still_blocked"] else ""
            out.append(RawFinding(
                "flow_blocked", e["agent_id"], channel, incarnation, e["first_ns"], e["last_ns"], e["n"],
                value=seconds(e["held_ns"]),
                summary=f"The broker paused channel {channel} with channel.flow active=false {e['n']} times for "
                        f"{fixed(seconds(e['held_ns']), 1)} s in all{still}",
                evidence=dict(seqs=e["seqs"], episodes=e["episodes"], still_blocked=e["still_blocked"])))
        return out
