"""What the detectors know about a connection once its records are in: its channel incarnations
(ChannelFacts), its schema.CONNECTIONS row and the thresholds; and the few frames some kinds read,
placed in the incarnation they belong to.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass, field

from ..timeline import records as r
from .common import MAX_EVIDENCE, Incarnation, least, most


@dataclass
class Context:
    connection: dict                       # the schema.CONNECTIONS row
    thresholds: object                     # analyzer.detectors.thresholds.Thresholds
    channels: dict[Incarnation, r.ChannelFacts] = field(default_factory=dict)

    def opens(self) -> dict[int, tuple[list[int], list[int]]]:
        """channel -> (open_seqs ascending, their incarnations)."""
        by_channel: dict[int, list[tuple[int, int]]] = {}
        for (channel, incarnation), facts in self.channels.items():
            by_channel.setdefault(channel, []).append((facts.open_seq, incarnation))
        return {channel: ([s for s, _ in sorted(lives)], [i for _, i in sorted(lives)])
                for channel, lives in by_channel.items()}


@dataclass
class FrameGroup:
    """The frames of one kind on one incarnation: count, span, least agent and the first rows'
    fields (seq first), in seq order."""
    n: int = 0
    first_ns: int | None = None
    last_ns: int | None = None
    agent_id: str | None = None
    fields: list = field(default_factory=list)


class FramesByIncarnation:
    """Frame rows of one kind, grouped by the incarnation they belong to: the latest incarnation
    of their channel opened at or before them (a reopened channel number starts a new one at its
    open; rows between a close and the next open still belong to the closed one). The
    incarnations are known only once their ChannelFacts are in, so the rows wait for the end of
    the connection, one tuple each: these kinds' frames (basic.return, manual basic.consume,
    channel.flow) are few next to the deliveries and publishes."""

    def __init__(self):
        self.rows: list[tuple] = []   # (channel, seq, ts_ns, agent_id, fields)

    def add(self, channel: int, seq: int, ts_ns: int, agent_id, fields: tuple) -> None:
        self.rows.append((channel, seq, ts_ns, agent_id, fields))

    def placed(self, context: Context, keep_unplaced: bool):
        """((channel, incarnation), seq, ts_ns, agent_id, fields) of each row, in seq order. Rows of a
        channel with no incarnation at all get incarnation None (kept only if `keep_unplaced`);
        rows before the first known open of their channel are dropped."""
        opens = context.opens()
        for channel, seq, ts_ns, agent_id, fields in sorted(self.rows, key=lambda row: row[1]):
            lives = opens.get(channel)
            if lives is None:
                if keep_unplaced:
                    yield (channel, None), seq, ts_ns, agent_id, fields
                continue
            at = bisect_right(lives[0], seq)
            if at > 0:
                yield (channel, lives[1][at - 1]), seq, ts_ns, agent_id, fields

    def by_incarnation(self, context: Context, keep_unplaced: bool) -> dict[tuple[int, int | None], FrameGroup]:
        groups: dict[tuple[int, int | None], FrameGroup] = {}
        for key, seq, ts_ns, agent_id, fields in self.placed(context, keep_unplaced):
            group = groups.get(key)
            if group is None:
                group = groups[key] = FrameGroup()
            group.n += 1
            group.first_ns, group.last_ns = least(group.first_ns, ts_ns), most(group.last_ns, ts_ns)
            group.agent_id = least(group.agent_id, agent_id)
            if len(group.fields) < MAX_EVIDENCE:
                group.fields.append(fields)
        return groups
