"""`python -m dashboards.grafana` regenerates dashboards/generated/grafana/*.json;
`--check` only says whether they are up to date (exit 1 if not)."""

import argparse
import sys

from .build import stale_files, write
from .files import GENERATED


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m dashboards.grafana", description=__doc__)
    parser.add_argument("--check", action="store_true", help="exit 1 if the committed JSON is stale")
    args = parser.parse_args()
    if args.check:
        stale = stale_files()
        for name in stale:
            print(f"stale: {GENERATED / name}", file=sys.stderr)
        return 1 if stale else 0
    for path in write():
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
