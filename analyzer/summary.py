"""What a lake holds, read back from the Delta tables (not from the decoder's memory)."""

import pyarrow.compute as pc

from . import lake
from .schema import CONNECTIONS, FRAMES


def lake_summary(lake_dir: str) -> dict:
    frames = lake.read_table(lake_dir, "frames", FRAMES, columns=["method"])
    summary = {"lake": lake_dir, "frames_version": None, "frame_rows": 0, "rows_by_method": {},
               "connections": []}
    if frames is not None:
        summary["frames_version"] = lake.open_table(lake_dir, "frames").version()
        summary["frame_rows"] = frames.num_rows
        counts = pc.value_counts(frames["method"]).to_pylist()
        summary["rows_by_method"] = {c["values"]: c["counts"] for c in sorted(counts, key=lambda c: -c["counts"])}
    columns = ["connection_id", "protocol", "connection_name", "client_product", "server_product",
               "user", "vhost", "frames_to_broker", "frames_to_client", "gaps", "ended_by", "started_at_syn"]
    connections = lake.read_table(lake_dir, "connections", CONNECTIONS, columns=columns)
    if connections is not None:
        rows = connections.to_pylist()
        summary["connections"] = sorted(rows, key=lambda r: r["connection_id"].rsplit("@", 1)[-1])
    return summary


def render_summary(summary: dict) -> str:
    lines = [f"Lake {summary['lake']}: {summary['frame_rows']:,} frame rows, "
             f"{len(summary['connections'])} connection(s)"]
    for conn in summary["connections"]:
        if conn["protocol"] != "amqp-0-9-1":
            lines.append(f"  {conn['connection_id']}  [{conn['protocol']}: not decoded]")
            continue
        who = conn["connection_name"] or conn["client_product"] or "unnamed client"
        how = "" if conn["started_at_syn"] else " (joined mid-stream)"
        lines.append(f"  {conn['connection_id']}  {who}{how}  user={conn['user'] or '?'} vhost={conn['vhost'] or '?'}"
                     f"  frames {conn['frames_to_broker']}->/{conn['frames_to_client']}<-"
                     f"  gaps={conn['gaps']}  ended by {conn['ended_by']}")
    if summary["rows_by_method"]:
        lines.append("Rows by method:")
        for method, n in summary["rows_by_method"].items():
            lines.append(f"  {method:<28} {n:>10,}")
    return "\n".join(lines)
