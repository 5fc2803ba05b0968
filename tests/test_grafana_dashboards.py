"""The generated Grafana dashboards: committed and up to date, built only from the metric catalog and
the recording rules, every query accepted by Prometheus's own parser (promtool), every panel with a
unit, a description and the datasource variable, laid out without overlaps.

Grafana itself cannot be installed on these machines; what Grafana does with the JSON is not tested
here. The e2e test (real Prometheus fed by real traffic) runs every panel_queries() expression."""

import json
import re
import shutil
import subprocess

import pytest

from analyzer import metric_names
from dashboards.grafana import panel_queries
from dashboards.grafana.build import stale_files, write
from dashboards.grafana.files import GENERATED, load
from dashboards.grafana.promql import SUBSTITUTIONS, metric_names_in, runnable
from dashboards.grafana.recorded import RECORDING_RULES
from dashboards.grafana.variables import ALL, variable_selectors

UIDS = {"ackscope-overview", "ackscope-drilldown", "ackscope-agent"}
KNOWN_NAMES = set(metric_names.EXPOSED) | set(RECORDING_RULES)
BOARDS = load()


def panels_of(board):
    return [p for p in board["panels"] if p["type"] != "row"]


def test_the_committed_json_is_what_the_code_generates():
    assert stale_files() == [], "run `python -m dashboards.grafana` and commit dashboards/generated/grafana"


def test_the_stale_check_sees_a_changed_missing_or_extra_file(tmp_path):
    write(tmp_path)
    assert stale_files(tmp_path) == []
    overview = tmp_path / "ackscope-overview.json"
    overview.write_text(overview.read_text().replace("Critical findings", "Critical"))
    (tmp_path / "ackscope-agent.json").unlink()
    (tmp_path / "old.json").write_text("{}")
    assert stale_files(tmp_path) == ["ackscope-agent.json", "ackscope-overview.json", "old.json"]


def test_three_dashboards_with_stable_uids_and_the_datasource_variable():
    assert {b["uid"] for b in BOARDS} == UIDS
    assert sorted(p.name for p in GENERATED.glob("*.json")) == sorted(f"{uid}.json" for uid in UIDS)
    for board in BOARDS:
        variables = {v["name"]: v for v in board["templating"]["list"]}
        assert variables["datasource"]["type"] == "datasource"
        assert variables["datasource"]["query"] == "prometheus"


@pytest.mark.parametrize("board", BOARDS, ids=lambda b: b["uid"])
def test_every_panel_has_a_description_a_unit_the_datasource_variable_and_queries(board):
    panels = panels_of(board)
    assert len(panels) >= 8
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for panel in panels:
        where = f"{board['uid']} / {panel['title']}"
        assert len(panel.get("description", "")) >= 40, f"{where}: say what it means and what to do"
        assert panel["fieldConfig"]["defaults"].get("unit") in {"s", "short", "pps", "Bps", "bytes"}, where
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, where
        assert panel["targets"], where
        for target in panel["targets"]:
            assert target["datasource"] == panel["datasource"], where
            assert target["expr"].strip(), where
        ref_ids = [t["refId"] for t in panel["targets"]]
        assert len(ref_ids) == len(set(ref_ids)), f"{where}: refIds must be unique"


@pytest.mark.parametrize("board", BOARDS, ids=lambda b: b["uid"])
def test_panels_stay_on_the_grid_and_do_not_overlap(board):
    cells = {}
    for panel in board["panels"]:
        pos = panel["gridPos"]
        assert pos["x"] >= 0 and pos["x"] + pos["w"] <= 24, panel["title"]
        for x in range(pos["x"], pos["x"] + pos["w"]):
            for y in range(pos["y"], pos["y"] + pos["h"]):
                assert (x, y) not in cells, f"{panel['title']} overlaps {cells[(x, y)]}"
                cells[(x, y)] = panel["title"]


def test_the_overview_shows_what_the_issue_asks_for():
    overview = next(b for b in BOARDS if b["uid"] == "ackscope-overview")
    exprs = " ".join(t["expr"] for p in panels_of(overview) for t in p["targets"])
    for needed in ("ackscope:findings:sum", "ackscope:lost_confirms:increase1h", "ackscope_unacked_deliveries",
                   "ackscope_oldest_unacked_seconds", "ackscope_unconfirmed_publishes",
                   "ackscope_oldest_unconfirmed_seconds", "ackscope:publish_confirm_seconds:p99_5m",
                   "ackscope:deliver_ack_seconds:p99_5m", "ackscope:requeues:rate5m", "ackscope:redeliveries:rate5m",
                   "time() - max by (job, lake) (ackscope_analysis_last_success_timestamp_seconds)"):
        assert needed in exprs


def test_every_drilldown_query_follows_the_vhost_and_application_variables():
    drilldown = next(b for b in BOARDS if b["uid"] == "ackscope-drilldown")
    variables = {v["name"]: v for v in drilldown["templating"]["list"]}
    for name in ("vhost", "application"):
        assert variables[name]["type"] == "query" and variables[name]["includeAll"]
        assert variables[name]["allValue"] == ALL == SUBSTITUTIONS["$" + name]
        assert variables[name]["query"].startswith("label_values(")
    assert '$vhost' in variables["application"]["query"], "applications listed are those of the chosen vhosts"
    for panel in panels_of(drilldown):
        for target in panel["targets"]:
            assert 'vhost=~"$vhost"' in target["expr"] and 'application=~"$application"' in target["expr"], \
                panel["title"]


def test_every_metric_a_panel_or_variable_reads_is_in_the_catalog_or_a_recording_rule():
    queries = panel_queries()
    assert len(queries) >= 40
    for uid, title, expr in queries:
        names = metric_names_in(expr)
        assert names, f"{uid} / {title}: no metric found in {expr}"
        assert names <= KNOWN_NAMES, f"{uid} / {title}: unknown {names - KNOWN_NAMES}"
    for board in BOARDS:
        for selector in variable_selectors(board):
            assert metric_names_in(runnable(selector)) <= KNOWN_NAMES
            names_in_regex = selector.split('"')[1].split("|") if "__name__" in selector else []
            assert set(names_in_regex) <= set(metric_names.EXPOSED), selector


def test_panel_queries_leave_no_template_variable_behind():
    for uid, title, expr in panel_queries():
        assert "$" not in expr, f"{uid} / {title}: {expr}"
    assert runnable('rate(x{vhost=~"${vhost}"}[$__rate_interval])') == 'rate(x{vhost=~".*"}[5m])'


def test_the_metric_name_reader_finds_names_and_skips_everything_else():
    assert metric_names_in('sum by (le, vhost) (rate(a_total{x=~"b|c", y="d(e)"}[5m]))'
                           ' / on (job) group_left (lake) b:rule:sum') == {"a_total", "b:rule:sum"}
    assert metric_names_in("histogram_quantile(0.99, sum without (instance) (h_bucket)) > 1e3 and up") == \
        {"h_bucket", "up"}
    assert metric_names_in("time() - max(ts_seconds offset 5m)") == {"ts_seconds"}
    assert metric_names_in("vector(0)") == set()


@pytest.fixture(scope="module")
def promtool():
    path = shutil.which("promtool")
    if path is None:
        pytest.fail("promtool is not installed: run `make test` (deploy/ci/services.sh installs it)")
    return path


def promtool_rejects(promtool, tmp_path, exprs: list[str]) -> str:
    """Prometheus's own parser, offline: each expression as a recording rule through `promtool check
    rules`, which parses and type-checks it. Returns what promtool complained about ('' if nothing)."""
    rules = {"groups": [{"name": "panel_queries", "rules": [
        {"record": f"ackscope_check:q{i}", "expr": expr} for i, expr in enumerate(exprs)]}]}
    path = tmp_path / "panel_queries.rules.yml"
    path.write_text(json.dumps(rules, indent=1))  # JSON is YAML: no quoting rules to get wrong
    result = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    return "" if result.returncode == 0 else result.stdout + result.stderr


def test_every_panel_query_parses_in_prometheus(promtool, tmp_path):
    queries = panel_queries()
    complaint = promtool_rejects(promtool, tmp_path, [expr for _, _, expr in queries])
    assert complaint == "", complaint


def test_the_parse_check_rejects_a_broken_query(promtool, tmp_path):
    assert "parse error" in promtool_rejects(promtool, tmp_path, ["sum by (a) (rate(x[5m])"])
    assert "range vector" in promtool_rejects(promtool, tmp_path, ["rate(x)"])


def test_the_recording_rules_used_are_defined_with_the_labels_promised():
    """recorded.py is the contract with the rules (dashboards/rules.py, from the alerts work): every
    rule a panel reads exists there, grouped by exactly the labels the panels expect."""
    rules = pytest.importorskip("dashboards.rules", reason="dashboards/rules.py lands with the alerting rules")
    defined = {rule.record: rule.expr for rule in rules.recording_rules()}
    for name, labels in RECORDING_RULES.items():
        assert name in defined, f"{name} is read by a panel but not recorded"
        grouping = re.search(r"\bby \(([^)]*)\)", defined[name])
        assert grouping, f"{name}: {defined[name]}"
        assert {label.strip() for label in grouping.group(1).split(",")} - {"le"} == set(labels), name
