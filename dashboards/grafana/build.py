"""Builds every dashboard and writes them as the committed JSON files. Needs grafana-foundation-sdk
(Python 3.11+); nothing else in the package does: push and panel_queries() read the JSON."""

from __future__ import annotations

import json
from pathlib import Path

from . import agent, drilldown, overview
from .files import GENERATED


def dashboards() -> dict[str, dict]:
    """File name -> dashboard JSON."""
    return {f"{module.UID}.json": module.dashboard() for module in (overview, drilldown, agent)}


def rendered() -> dict[str, str]:
    return {name: json.dumps(board, indent=2, ensure_ascii=False) + "\n" for name, board in dashboards().items()}


def write(folder: Path = GENERATED) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in rendered().items():
        path = folder / name
        path.write_text(text, encoding="utf-8")
        written.append(path)
    for stale in set(folder.glob("*.json")) - set(written):
        stale.unlink()   # a dashboard removed from the code leaves no file behind to be provisioned
    return written


def stale_files(folder: Path = GENERATED) -> list[str]:
    """Names of the files that differ from what the code generates now (missing, changed or extra)."""
    wanted = rendered()
    present = {path.name: path.read_text(encoding="utf-8") for path in folder.glob("*.json")}
    return sorted(name for name in set(wanted) | set(present) if wanted.get(name) != present.get(name))
