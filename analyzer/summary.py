"""What a lake holds, read back from the Delta tables (not from the decoder's memory)."""

import pyarrow.compute as pc

from . import lake
from .schema import CONNECTIONS, FRAMES
from .terminal import NAME_LIMIT, printable


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
               "user", "vhost", "frames_to_broker", "frames_to_client", "gaps", "ended_by", "started_at_syn",
               "tls_version", "tls_decrypted", "tls_note"]
    connections = lake.read_table(lake_dir, "connections", CONNECTIONS, columns=columns)
    if connections is not None:
        rows = connections.to_pylist()
        summary["connections"] = sorted(rows, key=lambda r: r["connection_id"].rsplit("@", 1)[-1])
    not_decrypted: dict = {}
    for conn in summary["connections"]:
        if conn["tls_version"] is not None and not conn["tls_decrypted"] or conn["protocol"] == "tls":
            not_decrypted[conn["tls_note"]] = not_decrypted.get(conn["tls_note"], 0) + 1
    summary["tls_not_decrypted"] = not_decrypted
    return summary


def render_summary(summary: dict) -> str:
    """The summary for a terminal: names, users and vhosts come from the wire, so each is escaped
    and bounded (terminal.py) and a connection stays one line."""
    lines = [f"Lake {printable(summary['lake'])}: {summary['frame_rows']:,} frame rows, "
             f"{len(summary['connections'])} connection(s)"]
    for conn in summary["connections"]:
        if conn["protocol"] == "tls":
            lines.append(f"  {printable(conn['connection_id'])}  [{printable(conn['tls_version'] or 'tls')}: not decrypted: "
                         f"{printable(conn['tls_note'])}]")
            continue
        if conn["protocol"] != "amqp-0-9-1":
            lines.append(f"  {printable(conn['connection_id'])}  [{printable(conn['protocol'])}: not decoded]")
            continue
        who = printable(conn["connection_name"] or conn["client_product"] or "unnamed client", NAME_LIMIT)
        how = ("" if conn["started_at_syn"] else " (joined mid-stream)") + (
            f" over {printable(conn['tls_version'])}" if conn["tls_version"] else "")
        user, vhost = (printable(conn[key] or "?", NAME_LIMIT) for key in ("user", "vhost"))
        lines.append(f"  {printable(conn['connection_id'])}  {who}{how}  user={user} vhost={vhost}"
                     f"  frames {conn['frames_to_broker']}->/{conn['frames_to_client']}<-"
                     f"  gaps={conn['gaps']}  ended by {conn['ended_by']}")
    if summary.get("tls_not_decrypted"):
        lines.append(f"TLS connections not decrypted: {sum(summary['tls_not_decrypted'].values())} ("
                     + "; ".join(f"{n}: {printable(why)}" for why, n in sorted(summary["tls_not_decrypted"].items(),
                                                                   key=lambda item: -item[1])) + ")")
    if summary["rows_by_method"]:
        lines.append("Rows by method:")
        for method, n in summary["rows_by_method"].items():
            lines.append(f"  {printable(method):<28} {n:>10,}")
    return "\n".join(lines)
