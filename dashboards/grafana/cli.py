"""`ackscope dashboards ...`: the subcommand, added to analyzer/cli.py's parser by one call."""

from __future__ import annotations

import argparse
import sys

EXIT_OK = 0
EXIT_BAD_ARGUMENTS = 2


def add_dashboards_command(commands) -> None:
    dashboards = commands.add_parser("dashboards", help="the Grafana dashboards: push them into a Grafana",
                                     description="ackscope's Grafana dashboards (overview, drill-down, agent "
                                                 "health), generated into dashboards/generated/grafana.")
    actions = dashboards.add_subparsers(title="actions", required=True, metavar="ACTION")
    push = actions.add_parser(
        "push", help="create or update the dashboards in a Grafana through its HTTP API",
        description="Create or update ackscope's dashboards in a Grafana through its HTTP API, in FOLDER "
                    "(created if missing). Idempotent: each dashboard is saved by its uid with overwrite, "
                    "so pushing again updates it in place. The dashboards read the Prometheus data source "
                    "chosen in their `datasource` variable.",
        epilog="Exit status: 0 pushed; 2 bad arguments or token file; 6 Grafana unreachable; 7 the token was "
               "rejected (401) or lacks rights (403); 8 Grafana answered with another error, or the URL is not a Grafana.")
    push.add_argument("--url", required=True, help="Grafana's base URL, e.g. http://grafana:3000")
    push.add_argument("--token-file", metavar="FILE",
                      help="file holding a service account token (sent as a Bearer token, never printed); "
                           "without it, no credentials are sent unless the URL has user:password")
    push.add_argument("--folder", default="ackscope", metavar="NAME", help="folder title (default %(default)s)")
    push.add_argument("--timeout", type=float, default=10.0, metavar="S",
                      help="seconds to wait for each answer (default %(default)s)")
    push.set_defaults(run=run_push)


def run_push(args: argparse.Namespace) -> int:
    from .push import PushError, push_dashboards, read_token, shown

    token = None
    if args.token_file:
        try:
            token = read_token(args.token_file)
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
            print(f"ackscope dashboards push: cannot use the token file {args.token_file}: {reason}", file=sys.stderr)
            return EXIT_BAD_ARGUMENTS
    try:
        folder, pushed = push_dashboards(args.url, token=token, folder=args.folder, timeout=args.timeout)
    except PushError as exc:
        print(f"ackscope dashboards push: {exc}", file=sys.stderr)
        return exc.exit_status
    for item in pushed:
        print(f"{item.action} {item.uid} ({item.title}) version {item.version} in folder {args.folder!r}"
              + (f": {item.url}" if item.url else ""))
    print(f"{len(pushed)} dashboard(s) pushed to {shown(args.url)} (folder uid {folder})")
    return EXIT_OK
