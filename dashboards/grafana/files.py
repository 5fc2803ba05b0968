"""Where the generated dashboards live, and reading them back (no grafana-foundation-sdk needed)."""

from __future__ import annotations

import json
from pathlib import Path

GENERATED = Path(__file__).resolve().parent.parent / "generated" / "grafana"


def load(folder: Path = GENERATED) -> list[dict]:
    """The generated dashboards, in file-name order."""
    return [json.loads(path.read_text(encoding="utf-8")) for path in sorted(folder.glob("*.json"))]
