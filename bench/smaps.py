"""What a process's anonymous memory is, mapping by mapping (/proc/PID/smaps), so that a soak can
tell which mappings grow.

Each anonymous mapping is classed by its shape, as the allocators lay them out:
- `heap`: the brk heap ([heap]), glibc's main arena (the main thread's malloc);
- `arena`: a glibc thread arena, a 64 MiB-aligned heap whose used part is read-write and the rest
  of its 64 MiB reserved without access (---p) right after it: another thread's malloc;
- `stack`: a thread's stack, read-write right after its guard page (---p);
- `other`: the rest: mmap'd blocks (jemalloc's extents, Python's object arenas, glibc's large
  blocks), which the kernel merges when they are adjacent.
"""

from __future__ import annotations

ARENA_BYTES = 64 << 20
KINDS = ("heap", "arena", "stack", "other")


def mappings(pid: int) -> list[dict]:
    """Every mapping of the process: start, end, perms, path, and Rss/Anonymous in KiB."""
    out, current = [], None
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            head = line.split(None, 5)
            if "-" in head[0] and len(head) >= 5 and not head[0].endswith(":"):
                start, end = (int(x, 16) for x in head[0].split("-"))
                current = {"start": start, "end": end, "perms": head[1],
                           "path": head[5].strip() if len(head) > 5 else "", "rss": 0, "anon": 0}
                out.append(current)
            elif head[0] == "Rss:":
                current["rss"] = int(head[1])
            elif head[0] == "Anonymous:":
                current["anon"] = int(head[1])
    return out


def anonymous(pid: int) -> list[dict]:
    """The process's anonymous read-write mappings, each with its `kind` (see the module's text)."""
    maps = mappings(pid)
    kept = []
    for i, m in enumerate(maps):
        if m["path"] not in ("", "[heap]") or not m["perms"].startswith("rw"):
            continue
        after = maps[i + 1] if i + 1 < len(maps) else None
        before = maps[i - 1] if i else None
        if m["path"] == "[heap]":
            kind = "heap"
        elif m["start"] % ARENA_BYTES == 0 and (
                m["end"] - m["start"] == ARENA_BYTES
                or (after and after["start"] == m["end"] and after["perms"].startswith("---")
                    and after["end"] - m["start"] == ARENA_BYTES)):
            kind = "arena"
        elif before and before["end"] == m["start"] and before["perms"].startswith("---") and not before["path"]:
            kind = "stack"
        else:
            kind = "other"
        kept.append({**m, "kind": kind})
    return kept


def by_kind(maps: list[dict]) -> dict[str, float]:
    """Anonymous MiB per kind."""
    totals = dict.fromkeys(KINDS, 0.0)
    for m in maps:
        totals[m["kind"]] += m["anon"] / 1024
    return totals


def growth(first: list[dict], last: list[dict], top: int = 8) -> list[str]:
    """The mappings whose anonymous memory grew most from `first` to `last` (matched by start
    address), one line each."""
    before = {m["start"]: m["anon"] for m in first}
    rows = sorted(last, key=lambda m: before.get(m["start"], 0) - m["anon"])[:top]
    return [f"{m['start']:#014x} {m['kind']:6s} size {(m['end'] - m['start']) / 2**20:7.1f} MiB  anon "
            f"{before.get(m['start'], 0) / 1024:6.1f} -> {m['anon'] / 1024:6.1f} MiB" for m in rows]
