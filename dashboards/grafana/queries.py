"""Every query the dashboards run, as Prometheus can run it: for the catalog check here and for the
end-to-end test, which runs each against a real Prometheus fed by real traffic."""

from __future__ import annotations

from .files import load
from .promql import runnable


def panel_queries(boards: list[dict] | None = None) -> list[tuple[str, str, str]]:
    """(dashboard uid, panel title, PromQL) for every query of every panel, template variables
    replaced as Grafana does with "All" selected ($vhost, $application, $instance -> .*) and
    $__rate_interval -> 5m. Reads the generated JSON: exactly what Grafana is given."""
    found = []
    for board in load() if boards is None else boards:
        for panel in _panels(board.get("panels", [])):
            for target in panel.get("targets", []):
                if target.get("expr"):
                    found.append((board["uid"], panel["title"], runnable(target["expr"])))
    return found


def _panels(panels: list[dict]):
    for panel in panels:
        yield panel
        yield from _panels(panel.get("panels", []))   # a collapsed row holds its panels
