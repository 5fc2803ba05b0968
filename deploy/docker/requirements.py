"""The agent image's pinned requirements, read from pyproject.toml so the image and the project never
disagree: `python deploy/docker/requirements.py` prints them, one a line.

The analysis image runs everything and installs the project with all its dependencies (`pip install
.`). The agent image installs only the distributions the capture agent imports
(tests/test_deploy_images.py checks that this list covers them), so it carries no Spark, pandas or
Grafana SDK."""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"
# What `ackscope capture` imports (scapy only in the child that compiles the BPF filter).
AGENT = ("scapy", "pamqp", "deltalake", "pyarrow", "numpy", "prometheus-client")


def name_of(requirement: str) -> str:
    return re.split(r"[\s=<>!~;\[]", requirement, maxsplit=1)[0].lower()


def agent_requirements(pyproject: Path = PYPROJECT) -> list[str]:
    with open(pyproject, "rb") as f:
        pinned = tomllib.load(f)["project"]["dependencies"]
    chosen = [r for r in pinned if name_of(r) in AGENT]
    missing = set(AGENT) - {name_of(r) for r in chosen}
    if missing:
        raise SystemExit(f"requirements.py: {', '.join(sorted(missing))} not in {pyproject}'s dependencies")
    return chosen


if __name__ == "__main__":
    print("\n".join(agent_requirements()))
    sys.exit(0)
