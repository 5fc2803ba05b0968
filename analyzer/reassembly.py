"""TCP reassembly for one direction of a flow: segments in any order in, contiguous bytes out.

Sans-IO: `segment()` and `acked()` return what became deliverable, as a list of `bytes` and
`Gap` items in stream order. A gap means bytes the capture never showed (packet loss in the
capture, a snap length, a capture that ends early); the framer resynchronises after it.
Retransmissions and overlaps are trimmed so every stream byte is delivered at most once.
"""

from dataclasses import dataclass

from .flow_state import Fields, encode_bytes

SEQ_MOD = 1 << 32
HALF = 1 << 31
DEFAULT_MAX_PENDING = 4 << 20  # out-of-order bytes held per direction before giving up on a hole
# ACKs for bytes we have not seen before we call them lost. Captures reorder the two directions
# (multi-queue NICs, span ports), so an ACK can show up just before the data it acknowledges.
ACKS_BEFORE_LOSS = 8


def seq_diff(a: int, b: int) -> int:
    """a - b in 32-bit sequence space, as a signed distance (handles wrap-around)."""
    return ((a - b + HALF) % SEQ_MOD) - HALF


@dataclass(frozen=True, slots=True)
class Gap:
    nbytes: int   # bytes missing from the stream (0 when unknown)
    reason: str   # "lost", "truncated", "buffer-limit", "end-of-capture"


class TcpDirection:
    __slots__ = ("next_seq", "pending", "pending_bytes", "max_pending", "started_at_syn",
                 "retransmitted_bytes", "fin_seq", "closed", "unseen_acks", "peer_acked", "isn")

    def __init__(self, max_pending: int = DEFAULT_MAX_PENDING):
        self.next_seq: int | None = None
        self.pending: dict[int, bytes] = {}
        self.pending_bytes = 0
        self.max_pending = max_pending
        self.started_at_syn = False
        self.retransmitted_bytes = 0
        self.fin_seq: int | None = None
        self.closed = False
        self.unseen_acks = 0  # ACKs seen in a row for bytes that have not shown up
        self.peer_acked: int | None = None  # the highest ACK beyond what we have seen
        self.isn: int | None = None  # the SYN's sequence number, when the capture saw it

    def segment(self, seq: int, payload: bytes, syn: bool = False, fin: bool = False,
                missing: int = 0) -> list:
        if seq == self.next_seq and payload and not (syn or fin or missing or self.pending):
            # The usual segment: the next bytes, in order, nothing buffered. What the general path does
            # for it, without its calls (tests/test_fast_paths.py holds the two to the same result).
            self.unseen_acks = 0
            self.next_seq = (seq + len(payload)) % SEQ_MOD
            return [payload]
        return self._segment_general(seq, payload, syn, fin, missing)

    def _segment_general(self, seq: int, payload: bytes, syn: bool = False, fin: bool = False,
                         missing: int = 0) -> list:
        out: list = []
        if syn:
            if self.next_seq is None or not self.started_at_syn:
                self.next_seq = (seq + 1) % SEQ_MOD
                self.started_at_syn = True
                self.isn = seq
            seq = (seq + 1) % SEQ_MOD  # data on a SYN (TCP Fast Open) follows the SYN's sequence number
        if fin:
            self.fin_seq = (seq + len(payload) + missing) % SEQ_MOD
        if payload or missing:
            if self.next_seq is None:
                self.next_seq = seq  # mid-stream: the first byte we see is where the stream starts for us
            self._add(seq, payload, missing, out)
        return out

    def _add(self, seq: int, payload: bytes, missing: int, out: list) -> None:
        rel = seq_diff(seq, self.next_seq)
        if rel < 0:  # retransmission or overlap: keep only the new tail
            keep = len(payload) + rel
            if keep <= 0:
                self.retransmitted_bytes += len(payload)
                if keep + missing > 0:  # a retransmission cut by the snap length, reaching past what we have
                    out.append(Gap(keep + missing, "truncated"))
                    self.next_seq = (self.next_seq + keep + missing) % SEQ_MOD
                    self._drain(out)
                return
            self.retransmitted_bytes += -rel
            payload, seq, rel = payload[-keep:], self.next_seq, 0
        if rel == 0:
            self.unseen_acks = 0
            out.append(payload)
            self.next_seq = (seq + len(payload)) % SEQ_MOD
            if missing:
                out.append(Gap(missing, "truncated"))
                self.next_seq = (self.next_seq + missing) % SEQ_MOD
            if self.pending:
                self._drain(out)
            return
        old = self.pending.get(seq)
        if old is not None:
            self.retransmitted_bytes += min(len(old), len(payload))
        if old is None or len(old) < len(payload):
            self.pending[seq] = payload
            self.pending_bytes += len(payload) - (len(old) if old else 0)
        while self.pending_bytes > self.max_pending:
            self._skip_hole(out, "buffer-limit")

    def _drain(self, out: list) -> None:
        """Deliver buffered segments that now continue the stream."""
        progressed = True
        while self.pending and progressed:
            progressed = False
            for seq in list(self.pending):
                rel = seq_diff(seq, self.next_seq)
                if rel > 0:
                    continue
                data = self.pending.pop(seq)
                self.pending_bytes -= len(data)
                keep = len(data) + rel
                self.retransmitted_bytes += min(len(data), -rel)  # bytes already delivered
                if keep > 0:
                    out.append(data[-keep:])
                    self.next_seq = (self.next_seq + keep) % SEQ_MOD
                progressed = True

    def _skip_hole(self, out: list, reason: str) -> None:
        """Declare the bytes before the earliest buffered segment lost, then deliver what follows."""
        if not self.pending:
            return
        first = min(self.pending, key=lambda s: seq_diff(s, self.next_seq))
        missing = seq_diff(first, self.next_seq)
        if missing > 0:
            out.append(Gap(missing, reason))
            self.next_seq = first
        self._drain(out)

    def acked(self, ack: int) -> list:
        """The peer acknowledged up to `ack`. Bytes before it that still have not shown up after a few
        such ACKs never will: they were lost by the capture, not the network."""
        if self.fin_seq is not None and seq_diff(ack, self.fin_seq) > 0:
            ack = self.fin_seq  # the FIN itself takes one sequence number
        if self.next_seq is None or seq_diff(ack, self.next_seq) <= 0:
            return []
        self.peer_acked = ack
        self.unseen_acks += 1
        if self.unseen_acks < ACKS_BEFORE_LOSS:
            return []
        self.unseen_acks = 0
        out: list = []
        while seq_diff(ack, self.next_seq) > 0:
            if self.pending and min(seq_diff(s, self.next_seq) for s in self.pending) < seq_diff(ack, self.next_seq):
                self._skip_hole(out, "lost")
            else:
                out.append(Gap(seq_diff(ack, self.next_seq), "lost"))
                self.next_seq = ack
                self._drain(out)  # segments buffered at or across `ack` continue the stream now
        return out

    def finish(self) -> list:
        """The flow ended (FIN, RST or end of capture): whatever is still buffered is delivered after its holes."""
        out: list = []
        while self.pending:
            self._skip_hole(out, "end-of-capture")
        for end in (self.peer_acked, self.fin_seq):  # bytes the peer got, or sent before its FIN, that we never saw
            if end is not None and self.next_seq is not None and seq_diff(end, self.next_seq) > 0:
                out.append(Gap(seq_diff(end, self.next_seq), "lost"))
                self.next_seq = end
        self.closed = True
        return out

    # -- state as data (flow_state.py) --------------------------------------------------------------

    def snapshot(self) -> dict:
        return {"next_seq": self.next_seq, "pending": [[seq, encode_bytes(data)] for seq, data in self.pending.items()],
                "max_pending": self.max_pending, "started_at_syn": self.started_at_syn,
                "retransmitted_bytes": self.retransmitted_bytes, "fin_seq": self.fin_seq, "closed": self.closed,
                "unseen_acks": self.unseen_acks, "peer_acked": self.peer_acked, "isn": self.isn}

    @classmethod
    def restore(cls, doc, where: str = "tcp") -> "TcpDirection":
        f = Fields(doc, where)
        tcp = cls(f.int("max_pending", 1, 1 << 30))
        tcp.next_seq = f.int("next_seq", 0, SEQ_MOD - 1, optional=True)
        for i, item in enumerate(f.list("pending", 1 << 16)):
            entry = Fields({"seq": item[0], "data": item[1]} if type(item) is list and len(item) == 2 else None,
                           f"{where}.pending[{i}]")
            seq, data = entry.int("seq", 0, SEQ_MOD - 1), entry.bytes("data", tcp.max_pending)
            if seq in tcp.pending or not data:
                entry.fail("seq", "repeated, or with no data")
            tcp.pending[seq] = data
            tcp.pending_bytes += len(data)
        if tcp.pending_bytes > tcp.max_pending or (tcp.pending and tcp.next_seq is None):
            f.fail("pending", "more bytes than max_pending, or data pending before the stream started")
        tcp.started_at_syn = f.bool("started_at_syn")
        tcp.retransmitted_bytes = f.int("retransmitted_bytes")
        tcp.fin_seq = f.int("fin_seq", 0, SEQ_MOD - 1, optional=True)
        tcp.closed = f.bool("closed")
        tcp.unseen_acks = f.int("unseen_acks", 0, ACKS_BEFORE_LOSS)
        tcp.peer_acked = f.int("peer_acked", 0, SEQ_MOD - 1, optional=True)
        tcp.isn = f.int("isn", 0, SEQ_MOD - 1, optional=True)
        return tcp
