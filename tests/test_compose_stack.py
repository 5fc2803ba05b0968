"""deploy/compose offline: the compose file against the compose specification's JSON schema
(check-jsonschema's vendored copy), Prometheus' configuration with `promtool check config` (the
generated rules mounted as compose mounts them), Alertmanager's with `amtool check-config` and its
routes with `amtool config routes test`; each validator also rejects a broken file. And the wiring:
the agent in the broker's network namespace with NET_RAW only, every mounted file present, every
scrape target a service of the stack, the agent's job the one AmqpAgentDown watches."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
import yaml

from analyzer.cli import build_parser, run_analyze, run_capture
from dashboards import rules
from dashboards.alert_settings import AlertSettings
from spark_jobs.schedule import parse_interval

from .conftest import ROOT
from .prometheus_stack import binary

COMPOSE = os.path.join(ROOT, "deploy", "compose")
COMPOSE_FILE = os.path.join(COMPOSE, "compose.yaml")
PROMETHEUS_CONFIG = os.path.join(COMPOSE, "prometheus", "prometheus.yml")
ALERTMANAGER_CONFIG = os.path.join(COMPOSE, "alertmanager", "alertmanager.yml")


def load(path: str) -> dict:
    with open(path) as f:
        return yaml.safe_load(f)


def check_jsonschema(path: str) -> subprocess.CompletedProcess:
    tool = shutil.which("check-jsonschema", path=os.path.dirname(sys.executable))
    assert tool, "check-jsonschema is not installed: pip install -e '.[test]'"
    return subprocess.run([tool, "--builtin-schema", "vendor.compose-spec", path], capture_output=True, text=True,
                          timeout=120)


def amtool(*args: str) -> subprocess.CompletedProcess:
    tool = shutil.which("amtool")
    if tool is None:
        pytest.fail("amtool is not installed: run `make services` (deploy/ci/services.sh installs it)")
    return subprocess.run([tool, *args], capture_output=True, text=True, timeout=60)


def binds(service: dict) -> dict[str, str]:
    """Container path -> host path (relative to the compose file) of a service's bind mounts."""
    out = {}
    for volume in service.get("volumes", []):
        source, target = volume.split(":")[:2]
        if source.startswith("."):
            out[target] = os.path.normpath(os.path.join(COMPOSE, source))
    return out


# -- the compose file -------------------------------------------------------------------------------

def test_the_compose_file_is_valid_for_the_compose_specification():
    run = check_jsonschema(COMPOSE_FILE)
    assert run.returncode == 0, run.stdout + run.stderr


def test_a_broken_compose_file_is_rejected(tmp_path):
    compose = load(COMPOSE_FILE)
    compose["services"]["agent"]["capadd"] = compose["services"]["agent"].pop("cap_add")
    broken = tmp_path / "compose.yaml"
    broken.write_text(yaml.safe_dump(compose))
    run = check_jsonschema(str(broken))
    assert run.returncode == 1 and "capadd" in run.stdout


def test_the_stack_has_every_part():
    services = load(COMPOSE_FILE)["services"]
    assert {"rabbitmq", "agent", "analysis", "pushgateway", "prometheus", "alertmanager", "grafana"} <= set(services)


def test_the_agent_shares_the_brokers_network_with_net_raw_only():
    services = load(COMPOSE_FILE)["services"]
    agent = services["agent"]
    assert agent["network_mode"] == "service:rabbitmq"
    assert agent["cap_drop"] == ["ALL"] and agent["cap_add"] == ["NET_RAW"]
    args = build_parser().parse_args(agent["command"])  # ackscope's own parser: the flags exist
    assert args.run is run_capture
    assert (args.iface, args.port, args.metrics_addr, args.lake) == ("eth0", [5672], "0.0.0.0:9419", "/lake")
    assert "9419:9419" in services["rabbitmq"]["ports"]  # the agent's port lives in the broker's namespace
    assert "lake:/lake" in agent["volumes"] and "lake:/lake" in services["analysis"]["volumes"]
    analysis = services["analysis"]
    args = build_parser().parse_args(analysis["command"][1:])  # the image's entry point runs the command
    assert analysis["command"][0] == "ackscope" and args.run is run_analyze and "entrypoint" not in analysis
    assert (args.lake, args.pushgateway, parse_interval(args.every)) == ("/lake", "http://pushgateway:9091", 300)
    assert analysis["restart"] == "unless-stopped" and analysis["stop_grace_period"] == "15m"
    for name in ("agent", "analysis"):
        assert os.path.exists(os.path.join(COMPOSE, services[name]["build"]["context"],
                                           services[name]["build"]["dockerfile"]))


def test_every_mounted_file_exists_and_prometheus_and_grafana_get_the_generated_files():
    services = load(COMPOSE_FILE)["services"]
    for name, service in services.items():
        for target, source in binds(service).items():
            assert os.path.exists(source), f"{name}: {source} (mounted at {target}) does not exist"
    assert binds(services["prometheus"])["/etc/prometheus/rules/ackscope.rules.yml"] == rules.OUTPUT
    grafana = binds(services["grafana"])
    provider = load(os.path.join(grafana["/etc/grafana/provisioning"], "dashboards", "ackscope.yml"))
    assert grafana[provider["providers"][0]["options"]["path"]] == os.path.join(ROOT, "dashboards", "generated", "grafana")
    datasource = load(os.path.join(grafana["/etc/grafana/provisioning"], "datasources", "prometheus.yml"))
    assert datasource["datasources"][0]["url"] == "http://prometheus:9090"
    assert "9090:9090" in services["prometheus"]["ports"]


# -- Prometheus -------------------------------------------------------------------------------------

def prometheus_layout(tmp_path, config: dict | None = None) -> str:
    """The configuration and rules as the container sees them (/etc/prometheus)."""
    folder = tmp_path / "etc-prometheus"
    for target, source in binds(load(COMPOSE_FILE)["services"]["prometheus"]).items():
        path = folder / os.path.relpath(target, "/etc/prometheus")
        path.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(source, path)
    if config is not None:
        (folder / "prometheus.yml").write_text(yaml.safe_dump(config))
    return str(folder / "prometheus.yml")


def test_promtool_checks_the_prometheus_configuration_and_its_rules(tmp_path):
    run = subprocess.run([binary("promtool"), "check", "config", prometheus_layout(tmp_path)],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr
    rule_count = sum(len(group["rules"]) for group in rules.rules_document()["groups"])
    assert "SUCCESS: 1 rule files found" in run.stdout + run.stderr
    assert f"SUCCESS: {rule_count} rules found" in run.stdout + run.stderr


def test_promtool_rejects_a_broken_prometheus_configuration(tmp_path):
    config = load(PROMETHEUS_CONFIG)
    config["global"]["scrape_interval"] = "soon"
    run = subprocess.run([binary("promtool"), "check", "config", prometheus_layout(tmp_path, config)],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode != 0 and "soon" in run.stdout + run.stderr


def test_prometheus_scrapes_the_agent_and_the_pushgateway_of_the_stack():
    config = load(PROMETHEUS_CONFIG)
    services = load(COMPOSE_FILE)["services"]
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert [c["targets"] for c in jobs[AlertSettings().agent_job]["static_configs"]] == [["rabbitmq:9419"]]
    assert jobs["pushgateway"]["honor_labels"] is True  # the pushed groups keep their job and lake
    assert [c["targets"] for c in jobs["pushgateway"]["static_configs"]] == [["pushgateway:9091"]]
    [managers] = config["alerting"]["alertmanagers"]
    assert managers["static_configs"][0]["targets"] == ["alertmanager:9093"]
    for job in config["scrape_configs"]:
        for target in (t for c in job["static_configs"] for t in c["targets"]):
            host, port = target.split(":")
            assert host == "localhost" or host in services, target
            if host != "localhost":
                assert any(p.split(":")[-1] == port for p in services[host].get("ports", [])), target


# -- Alertmanager -----------------------------------------------------------------------------------

def test_amtool_checks_the_alertmanager_configuration():
    run = amtool("check-config", ALERTMANAGER_CONFIG)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "SUCCESS" in run.stdout


def test_amtool_rejects_a_route_to_an_unknown_receiver(tmp_path):
    config = load(ALERTMANAGER_CONFIG)
    config["route"]["routes"][0]["receiver"] = "nobody"
    broken = tmp_path / "alertmanager.yml"
    broken.write_text(yaml.safe_dump(config))
    run = amtool("check-config", str(broken))
    assert run.returncode != 0 and "nobody" in run.stdout + run.stderr


def test_every_severity_the_rules_use_has_a_route():
    severities = {rule["labels"]["severity"] for group in rules.rules_document()["groups"]
                  for rule in group["rules"] if "alert" in rule}
    assert severities == {"critical", "warning", "info"}
    routed = {}
    for severity in severities:
        run = amtool("config", "routes", "test", f"--config.file={ALERTMANAGER_CONFIG}",
                     f"severity={severity}", "alertname=AmqpLostConfirms")
        assert run.returncode == 0, run.stderr
        routed[severity] = run.stdout.strip()
    assert routed == {"critical": "ackscope-critical", "warning": "ackscope", "info": "ackscope"}
