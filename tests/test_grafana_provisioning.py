"""The Grafana file-provisioning YAML in deploy/grafana: it parses, says what Grafana's provisioning
documentation requires, and points at the generated dashboards (through the mount docs/dashboards.md
tells users to make). Grafana itself is not run here (it cannot be installed on these machines)."""

import json
from pathlib import Path

import yaml

from dashboards.grafana.files import GENERATED
from dashboards.grafana.push import folder_uid

ROOT = Path(__file__).resolve().parent.parent
PROVISIONING = ROOT / "deploy" / "grafana" / "provisioning"
# Where docs/dashboards.md and the YAML's own comment mount the generated JSON in a Grafana container.
MOUNTS = {"/var/lib/grafana/dashboards/ackscope": GENERATED}


def read(path: Path) -> dict:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def test_the_dashboard_provider_points_at_the_generated_json():
    config = read(PROVISIONING / "dashboards" / "ackscope.yml")
    assert config["apiVersion"] == 1
    [provider] = config["providers"]
    assert provider["type"] == "file" and provider["name"]
    path = provider["options"]["path"]
    assert path in MOUNTS, f"{path} is not where the docs mount dashboards/generated/grafana"
    files = sorted(MOUNTS[path].glob("*.json"))
    assert len(files) == 3
    for file in files:
        board = json.loads(file.read_text())
        assert board["uid"] and "id" not in board, f"{file.name}: provisioning matches dashboards by uid"
    assert provider["folderUid"] == folder_uid(provider["folder"]), "the same folder as `dashboards push`"
    docs = (ROOT / "docs" / "dashboards.md").read_text()
    assert f"dashboards/generated/grafana:{path}" in docs


def test_the_datasource_is_the_default_prometheus_the_dashboards_pick():
    config = read(PROVISIONING / "datasources" / "prometheus.yml")
    assert config["apiVersion"] == 1
    [source] = config["datasources"]
    assert source["type"] == "prometheus" and source["isDefault"] is True
    assert source["url"].startswith(("http://", "https://")) and source["access"] == "proxy"
    for board in json.loads("[" + ",".join(p.read_text() for p in sorted(GENERATED.glob("*.json"))) + "]"):
        [variable] = [v for v in board["templating"]["list"] if v["name"] == "datasource"]
        assert variable["query"] == source["type"]


def test_the_docs_name_every_dashboard_and_panel():
    docs = (ROOT / "docs" / "dashboards.md").read_text()
    for file in GENERATED.glob("*.json"):
        board = json.loads(file.read_text())
        assert f"{board['title']} (`{board['uid']}`)" in docs
        for panel in board["panels"]:
            named = f"**{panel['title']}" if panel["type"] == "row" else f"*{panel['title']}*"
            assert named in docs.replace("\n  ", " "), f"docs/dashboards.md does not mention {panel['title']!r}"
