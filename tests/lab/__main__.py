"""python -m tests.lab list | run [NAME... | all] --out DIR"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tests.lab.runner import run_scenarios
from tests.lab.scenarios import SCENARIOS


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.lab", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("list", help="print the scenario names, one per line")
    run = commands.add_parser("run", help="record scenarios: DIR/NAME.pcapng and DIR/NAME.expected.json")
    run.add_argument("names", nargs="*", metavar="NAME", help="scenario names, or 'all' (the default)")
    run.add_argument("--out", type=Path, required=True, metavar="DIR")
    args = parser.parse_args(argv)

    if args.command == "list":
        print("\n".join(SCENARIOS))
        return 0
    names = list(SCENARIOS) if not args.names or args.names == ["all"] else args.names
    unknown = [name for name in names if name not in SCENARIOS]
    if unknown:
        parser.error(f"unknown scenario(s): {', '.join(unknown)}; see `list`")
    failures = run_scenarios([SCENARIOS[name] for name in names], args.out)
    for failure in failures:
        print(f"FAILED {failure}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
