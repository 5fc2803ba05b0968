"""`ackscope report`: one self-contained HTML file about a lake, made without Spark.

lake_view.py reads the tables (delta-rs, bounded), series.py reduces what the charts draw,
svg.py and charts.py draw them as inline SVG, evidence.py and page.py write the page. The file
needs no network: styles, pictures and a few lines of optional script are inline.
"""

from __future__ import annotations

import os
import time

from .lake_view import LakeMissing, read_lake
from .page import render_page

__all__ = ["LakeMissing", "write_report"]


def write_report(lake_dir: str, out_path: str) -> int:
    """Write the report of `lake_dir` to `out_path` (atomically: a reader never sees half a page);
    returns its size in bytes. Raises LakeMissing if there is no such folder."""
    html = render_page(read_lake(lake_dir), time.time_ns())
    data = html.encode("utf-8")
    folder = os.path.dirname(os.path.abspath(out_path))
    os.makedirs(folder, exist_ok=True)
    partial = f"{out_path}.partial-{os.getpid()}"
    try:
        with open(partial, "wb") as out:
            out.write(data)
        os.replace(partial, out_path)
    finally:
        if os.path.exists(partial):
            os.remove(partial)
    return len(data)
