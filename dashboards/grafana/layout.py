"""Puts sections of panels on a dashboard with stable ids and turns it into the JSON Grafana takes."""

from __future__ import annotations

import json

from grafana_foundation_sdk.builders import dashboard
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import DashboardLinkType

from . import variables

TAGS = ["ackscope", "amqp", "rabbitmq"]


def new_dashboard(uid: str, title: str, description: str, *more_variables) -> dashboard.Dashboard:
    board = (dashboard.Dashboard(title).uid(uid).description(description).tags(TAGS)
            .time("now-6h", "now").refresh("1m").readonly()
            # every ackscope dashboard links to the others, keeping the time range and the variables
            .link(dashboard.DashboardLink("ackscope").type(DashboardLinkType.DASHBOARDS).tags(["ackscope"])
                  .as_dropdown(True).include_vars(True).keep_time(True))
             .with_variable(variables.datasource()))
    for variable in more_variables:
        board = board.with_variable(variable)
    return board


def assemble(board: dashboard.Dashboard, sections: list[tuple[str, list]]) -> dict:
    """Adds each (row title, panels) section in order. Ids are given here, in order, so a panel keeps
    its id (and links to it keep working) as long as the panels before it stay."""
    next_id = 1
    for row_title, panels in sections:
        board = board.with_row(dashboard.Row(row_title).id(next_id))
        next_id += 1
        for panel in panels:
            board = board.with_panel(panel.id(next_id))
            next_id += 1
    return json.loads(json.dumps(board.build(), cls=JSONEncoder))
