"""deploy/k8s offline: every overlay renders with `kubectl kustomize`; every object validates, core
kinds against Kubernetes' schemas (kubernetes-validate, strict: unknown fields are errors, as in
`kubectl apply`'s strict field validation) and the CRD objects against the vendored CRD schemas
(tests/crd_schemas, made strict the same way); broken objects are rejected; the generated
PrometheusRule and dashboard ConfigMaps are what dashboards/ generates; the agent sidecar has
NET_RAW only, its probes, requests and limits, and the PodMonitor finds it."""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import subprocess
from functools import cache

import jsonschema
import kubernetes_validate
import pytest
import yaml

from analyzer.cli import build_parser, run_analyze, run_capture
from dashboards import kubernetes, rules
from spark_jobs.schedule import parse_interval

from .conftest import ROOT

K8S = os.path.join(ROOT, "deploy", "k8s")
OVERLAYS = sorted(os.listdir(os.path.join(K8S, "overlays")))
# Native sidecars (init containers with restartPolicy: Always) are on by default from 1.29.
KUBERNETES_VERSIONS = ("1.29", kubernetes_validate.latest_version())
# The analysis image built with hadoop-aws, which the object-storage overlay runs.
S3A_IMAGE_TAG = "0.1.0-s3a"
CRD_SCHEMAS = {
    ("monitoring.coreos.com/v1", "PodMonitor"): "podmonitor-monitoring.coreos.com-v1.json",
    ("monitoring.coreos.com/v1", "PrometheusRule"): "prometheusrule-monitoring.coreos.com-v1.json",
    ("sparkoperator.k8s.io/v1beta2", "ScheduledSparkApplication"):
        "scheduledsparkapplication-sparkoperator.k8s.io-v1beta2.json",
}


def kubectl() -> str:
    path = shutil.which("kubectl")
    if path is None:
        pytest.fail("kubectl is not installed (it renders the kustomizations offline)")
    return path


@cache
def render(folder: str) -> tuple[dict, ...]:
    run = subprocess.run([kubectl(), "kustomize", folder], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    return tuple(yaml.safe_load_all(run.stdout))


def overlay(name: str) -> tuple[dict, ...]:
    return render(os.path.join(K8S, "overlays", name))


def strict(schema):
    """An OpenAPI schema from a CRD that also rejects unknown fields, as the API server does under
    strict field validation (it prunes them otherwise): objects with declared properties get
    additionalProperties: false unless they preserve unknown fields."""
    if isinstance(schema, list):
        return [strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: strict(v) for k, v in schema.items()}
    if ("properties" in schema and "additionalProperties" not in schema
            and not schema.get("x-kubernetes-preserve-unknown-fields")):
        out["additionalProperties"] = False
    return out


@cache
def crd_validator(api_version: str, kind: str) -> jsonschema.protocols.Validator:
    with open(os.path.join(ROOT, "tests", "crd_schemas", CRD_SCHEMAS[(api_version, kind)])) as f:
        schema = strict(json.load(f))
    return jsonschema.Draft4Validator(schema)


def validate(obj: dict) -> None:
    """Raises if the object is not valid for its kind; an unknown kind is an error too."""
    key = (obj["apiVersion"], obj["kind"])
    if key in CRD_SCHEMAS:
        crd_validator(*key).validate(obj)
        return
    for version in KUBERNETES_VERSIONS:
        kubernetes_validate.validate(obj, version, strict=True)


def find(objects, kind: str, name: str | None = None) -> list[dict]:
    return [o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]


def agent_container(workload: dict) -> dict:
    spec = workload["spec"]["template"]["spec"]
    [agent] = [c for c in spec.get("initContainers", []) if c["name"] == "ackscope-agent"]
    return agent


# -- rendering and validation ---------------------------------------------------------------------

def test_there_are_the_overlays_the_docs_describe():
    assert OVERLAYS == ["app-sidecar", "app-sidecar-tls", "broker-sidecar", "object-storage", "spark-operator"]


@pytest.mark.parametrize("name", OVERLAYS)
def test_every_rendered_object_validates(name):
    objects = overlay(name)
    assert len(objects) >= 8
    for obj in objects:
        try:
            validate(obj)
        except Exception as exc:  # noqa: BLE001 - named in the failure
            pytest.fail(f"{name}: {obj['kind']}/{obj['metadata']['name']}: {type(exc).__name__}: {str(exc)[:800]}")


def test_the_base_renders_and_validates_alone():
    objects = render(os.path.join(K8S, "base"))
    assert {o["kind"] for o in objects} == {"ServiceAccount", "ConfigMap", "PodMonitor", "PrometheusRule"}
    for obj in objects:
        validate(obj)


def test_broken_objects_are_rejected():
    """The validators validate: a misspelt field, a wrong type, a bad enum value, an unknown kind."""
    objects = overlay("spark-operator")
    statefulset = copy.deepcopy(find(objects, "StatefulSet")[0])
    agent_container(statefulset)["livenessProbe"]["httpGet"]["paht"] = "/healthz"
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(statefulset)
    statefulset = copy.deepcopy(find(objects, "StatefulSet")[0])
    statefulset["spec"]["replicas"] = "one"
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(statefulset)

    podmonitor = copy.deepcopy(find(objects, "PodMonitor")[0])
    podmonitor["spec"]["podMetricsEndpoint"] = podmonitor["spec"].pop("podMetricsEndpoints")
    with pytest.raises(jsonschema.ValidationError):
        validate(podmonitor)
    application = copy.deepcopy(find(objects, "ScheduledSparkApplication")[0])
    application["spec"]["template"]["type"] = "Pyhton"
    with pytest.raises(jsonschema.ValidationError):
        validate(application)
    application = copy.deepcopy(find(objects, "ScheduledSparkApplication")[0])
    del application["spec"]["schedule"]
    with pytest.raises(jsonschema.ValidationError):
        validate(application)
    rule = copy.deepcopy(find(objects, "PrometheusRule")[0])
    rule["spec"]["groups"][1]["rules"][0]["for"] = "fifteen minutes"
    with pytest.raises(jsonschema.ValidationError):
        validate(rule)
    with pytest.raises(kubernetes_validate.SchemaNotFoundError):
        validate({"apiVersion": "example.com/v1", "kind": "Gadget", "metadata": {"name": "x"}})


# -- the generated objects --------------------------------------------------------------------------

def test_the_committed_prometheusrule_and_dashboards_are_generated_from_dashboards():
    assert kubernetes.stale_files() == [], "stale: run `make generate` (python -m dashboards.kubernetes) and commit"


def test_the_stale_check_sees_a_changed_or_missing_file(tmp_path):
    assert kubernetes.main(["-o", str(tmp_path)]) == 0
    assert sorted(os.listdir(tmp_path)) == sorted(kubernetes.files())
    assert kubernetes.stale_files(str(tmp_path)) == []
    (tmp_path / "prometheusrule.yaml").write_text(kubernetes.files()["prometheusrule.yaml"].replace("15m", "16m"))
    (tmp_path / "grafana-dashboards.yaml").unlink()
    assert kubernetes.stale_files(str(tmp_path)) == ["prometheusrule.yaml", "grafana-dashboards.yaml"]


@pytest.mark.parametrize("name", OVERLAYS)
def test_every_overlay_carries_the_rules_and_the_dashboards(name):
    objects = overlay(name)
    [rule] = find(objects, "PrometheusRule")
    assert rule["spec"] == rules.rules_document()
    with open(rules.OUTPUT) as committed:
        assert rule["spec"] == yaml.safe_load(committed)  # the same rules as the file Prometheus loads
    boards = [o for o in find(objects, "ConfigMap") if o["metadata"]["labels"].get("grafana_dashboard") == "1"]
    generated = os.path.join(ROOT, "dashboards", "generated", "grafana")
    assert sorted(k for b in boards for k in b["data"]) == sorted(os.listdir(generated))
    for board in boards:
        [(file_name, text)] = board["data"].items()
        with open(os.path.join(generated, file_name), encoding="utf-8") as f:
            assert text == f.read()
        assert json.loads(text)["uid"]


# -- the agent sidecar ------------------------------------------------------------------------------

@pytest.mark.parametrize("name", OVERLAYS)  # each adds the agent to a workload
def test_the_agent_sidecar_has_net_raw_only_probes_and_resources(name):
    objects = overlay(name)
    workloads = [o for o in objects if o["kind"] in ("Deployment", "StatefulSet")]
    assert workloads
    for workload in workloads:
        agent = agent_container(workload)
        assert agent["restartPolicy"] == "Always"  # a native sidecar: up before the broker, down after it
        security = agent["securityContext"]
        assert security["capabilities"] == {"drop": ["ALL"], "add": ["NET_RAW"]}
        assert security["runAsNonRoot"] is True and security["runAsUser"] != 0
        assert security["allowPrivilegeEscalation"] is False and security["readOnlyRootFilesystem"] is True
        port = {p["name"]: p["containerPort"] for p in agent["ports"]}
        assert port == {"ackscope-agent": 9419}
        assert "--metrics-addr=0.0.0.0:9419" in agent["args"]
        assert agent["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "ackscope-agent"}
        assert agent["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "ackscope-agent"}
        assert set(agent["resources"]["requests"]) == {"cpu", "memory"}
        assert agent["resources"]["limits"]["memory"] == "768Mi"
        # The broker's or application's own containers are untouched.
        assert all("NET_RAW" not in str(c.get("securityContext")) for c in workload["spec"]["template"]["spec"]["containers"])


@pytest.mark.parametrize("name", OVERLAYS)  # each adds the agent to a workload
def test_the_podmonitor_selects_the_agents_pods_and_names_their_job(name):
    objects = overlay(name)
    [monitor] = find(objects, "PodMonitor")
    selector = monitor["spec"]["selector"]["matchLabels"]
    for workload in (o for o in objects if o["kind"] in ("Deployment", "StatefulSet")):
        labels = workload["spec"]["template"]["metadata"]["labels"]
        assert selector.items() <= labels.items()
        assert labels[monitor["spec"]["jobLabel"]] == "ackscope-agent"  # AmqpAgentDown's job
        [endpoint] = monitor["spec"]["podMetricsEndpoints"]
        assert endpoint["port"] in {p["name"] for p in agent_container(workload)["ports"]}


def settings(objects) -> dict:
    [config] = [o for o in find(objects, "ConfigMap") if o["metadata"]["name"].startswith("ackscope-settings-")]
    return config["data"]


def lake_of(objects, workload: dict) -> str:
    agent = agent_container(workload)
    [ref] = [e["valueFrom"]["configMapKeyRef"] for e in agent["env"] if e["name"] == "ACKSCOPE_LAKE"]
    [config] = find(objects, "ConfigMap", ref["name"])
    assert "--lake=$(ACKSCOPE_LAKE)" in agent["args"]
    return config["data"][ref["key"]]


def test_the_lake_is_a_shared_volume_or_object_storage():
    for name in ("broker-sidecar", "app-sidecar", "spark-operator"):
        objects = overlay(name)
        [claim] = find(objects, "PersistentVolumeClaim", "ackscope-lake")
        assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
        for workload in (o for o in objects if o["kind"] in ("Deployment", "StatefulSet")):
            assert lake_of(objects, workload) == "/lake"
            mounts = {m["mountPath"]: m["name"] for m in agent_container(workload)["volumeMounts"]}
            assert mounts["/lake"] == "ackscope-lake"
    objects = overlay("object-storage")
    assert not find(objects, "PersistentVolumeClaim")
    [broker] = find(objects, "StatefulSet")
    assert lake_of(objects, broker).startswith("s3a://")
    sources = agent_container(broker)["envFrom"]
    assert {"secretRef": {"name": "ackscope-s3-credentials", "optional": True}} in sources
    assert settings(objects)["AWS_REGION"]


def test_the_object_storage_analysis_cronjob_analyses_the_agents_s3_lake():
    """The object-storage overlay schedules the analysis on the lake its agents write: the CronJob's
    --lake is the agents' s3a:// lake, its S3 settings and credentials come from the same ConfigMap and
    Secret (no credential in any manifest), it runs the s3a-capable image, and mounts no lake."""
    objects = overlay("object-storage")
    [broker] = find(objects, "StatefulSet")
    agents_lake = lake_of(objects, broker)
    [cronjob] = find(objects, "CronJob", "ackscope-analysis")
    pod = cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    [container] = pod["containers"]
    assert container["envFrom"] == agent_container(broker)["envFrom"]
    assert {"secretRef": {"name": "ackscope-s3-credentials", "optional": True}} in container["envFrom"]
    [settings_ref] = [s["configMapRef"]["name"] for s in container["envFrom"] if "configMapRef" in s]
    [config] = find(objects, "ConfigMap", settings_ref)
    assert config["data"]["AWS_REGION"] and "env" not in container
    assert container["args"][0] == "ackscope"
    args = parsed(container["args"][1:], **config["data"])
    assert args.run is run_analyze
    assert args.lake == agents_lake and agents_lake.startswith("s3a://")
    assert args.pushgateway == config["data"]["ACKSCOPE_PUSHGATEWAY"]
    assert container["image"] == f"ackscope-analysis:{S3A_IMAGE_TAG}"
    assert [m["mountPath"] for m in container["volumeMounts"]] == ["/tmp"]
    assert [v for v in pod["volumes"] if set(v) - {"name", "emptyDir"}] == []
    assert not find(objects, "PersistentVolumeClaim")
    # No credential in plain manifests: no AWS key in a ConfigMap or in an env value.
    rendered = yaml.safe_dump_all(objects)
    assert not re.search(r"AWS_(SECRET_ACCESS_KEY|ACCESS_KEY_ID|SESSION_TOKEN)", rendered)


def test_the_docs_build_the_s3a_image_the_object_storage_overlay_runs():
    """docs/deployment.md builds the tag the overlay names, with hadoop-aws in SPARK_PACKAGES."""
    with open(os.path.join(ROOT, "docs", "deployment.md")) as f:
        docs = f.read()
    [build] = [b for b in re.findall(r"docker build (?:\\\n|[^\n])*", docs) if f"analysis:{S3A_IMAGE_TAG}" in b]
    assert "--build-arg SPARK_PACKAGES=org.apache.hadoop:hadoop-aws:" in build


def test_the_spark_operator_overlay_on_s3_as_the_docs_give_it(tmp_path):
    """docs/deployment.md's spark-operator overlay with the lake on S3 (no overlay of its own in the
    repository): rendered beside a copy of deploy/k8s, it validates, and the application analyses the
    agents' s3a:// lake with their settings and Secret, in the s3a-capable image, with no volume."""
    with open(os.path.join(ROOT, "docs", "deployment.md")) as f:
        [text] = re.findall(r"```yaml\n(# deploy/k8s/overlays/spark-operator/kustomization.yaml.*?)```", f.read(), re.S)
    shutil.copytree(K8S, tmp_path / "k8s")
    (tmp_path / "k8s" / "overlays" / "spark-operator" / "kustomization.yaml").write_text(text)
    objects = render(str(tmp_path / "k8s" / "overlays" / "spark-operator"))
    for obj in objects:
        validate(obj)
    [broker] = find(objects, "StatefulSet")
    agents_lake = lake_of(objects, broker)
    [application] = find(objects, "ScheduledSparkApplication")
    template = application["spec"]["template"]
    args = parsed(["analyze", *template["arguments"]])
    assert args.lake == agents_lake and agents_lake.startswith("s3a://")
    assert template["image"] == f"ackscope-analysis:{S3A_IMAGE_TAG}"
    for role in ("driver", "executor"):
        assert template[role]["envFrom"] == agent_container(broker)["envFrom"]
        assert "volumeMounts" not in template[role]
    assert "volumes" not in template and not find(objects, "PersistentVolumeClaim")


def test_the_analysis_cronjob_runs_ackscope_analyze_on_the_lake_and_pushes():
    """`ackscope analyze` starts its local driver JVM itself, with ackscope's options for it
    (spark-submit would start it first, with none of them)."""
    objects = overlay("broker-sidecar")
    [cronjob] = find(objects, "CronJob", "ackscope-analysis")
    assert cronjob["spec"]["concurrencyPolicy"] == "Forbid"
    pod = cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    [container] = pod["containers"]
    assert "command" not in container  # the image's entry point runs it
    args = container["args"]
    assert args[:2] == ["ackscope", "analyze"]
    assert {"--master=local[*]", "--driver-memory=2g", "--lake=$(ACKSCOPE_LAKE)",
            "--pushgateway=$(ACKSCOPE_PUSHGATEWAY)"} <= set(args[2:])
    assert "--every" not in " ".join(args)   # one run a pod: the schedule is the CronJob's
    [source] = container["envFrom"]
    assert source["configMapRef"]["name"].startswith("ackscope-settings-")
    assert {m["mountPath"] for m in container["volumeMounts"]} == {"/lake", "/tmp"}
    assert container["resources"]["requests"]["cpu"] == "2"


def test_the_scheduled_spark_application_gets_the_lake_and_gateway_from_the_settings():
    objects = overlay("spark-operator")
    [application] = find(objects, "ScheduledSparkApplication")
    template = application["spec"]["template"]
    values = settings(objects)
    assert template["arguments"][:2] == [f"--lake={values['ACKSCOPE_LAKE']}",
                                         f"--pushgateway={values['ACKSCOPE_PUSHGATEWAY']}"]
    assert template["mainApplicationFile"] == "local:///opt/ackscope/spark_jobs/job.py"
    assert application["spec"]["concurrencyPolicy"] == "Forbid"
    for role in ("driver", "executor"):
        assert {"name": "ackscope-lake", "mountPath": "/lake"} in template[role]["volumeMounts"]
    [account] = find(objects, "ServiceAccount", template["driver"]["serviceAccount"])
    [binding] = find(objects, "RoleBinding")
    assert binding["subjects"][0]["name"] == account["metadata"]["name"]
    assert not find(objects, "CronJob")


def test_the_warm_analysis_driver_as_the_docs_give_it(tmp_path):
    """docs/deployment.md's swap of analysis-cronjob for analysis-every, in the broker-sidecar and the
    object-storage overlays, rendered beside a copy of deploy/k8s: it validates, there is one driver
    (no overlap: one replica, Recreate), `ackscope analyze --every` itself gets the pod's SIGTERM and
    has time to finish its run, and the lake and settings reach it as they reach the CronJob."""
    with open(os.path.join(ROOT, "docs", "deployment.md")) as f:
        [swap] = re.findall(r"```yaml\n# A warm analysis driver.*?\ncomponents:\n(.*?)```", f.read(), re.S)
    shutil.copytree(K8S, tmp_path / "k8s")
    for name in ("broker-sidecar", "object-storage"):
        path = tmp_path / "k8s" / "overlays" / name / "kustomization.yaml"
        text = path.read_text()
        assert "../../components/analysis-cronjob" in text
        path.write_text(text.replace("  - ../../components/analysis-cronjob\n", swap))
        objects = render(str(path.parent))
        for obj in objects:
            validate(obj)
        assert not find(objects, "CronJob")
        [deployment] = find(objects, "Deployment", "ackscope-analysis")
        assert deployment["spec"]["replicas"] == 1 and deployment["spec"]["strategy"] == {"type": "Recreate"}
        pod = deployment["spec"]["template"]["spec"]
        assert pod["terminationGracePeriodSeconds"] >= 600
        [container] = pod["containers"]
        assert container["args"][:2] == ["ackscope", "analyze"] and "command" not in container
        [cronjob] = find(overlay(name), "CronJob", "ackscope-analysis")
        [scheduled] = cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"]
        assert container["envFrom"] == scheduled["envFrom"] and container["resources"] == scheduled["resources"]
        assert container["image"] == scheduled["image"] and container["volumeMounts"] == scheduled["volumeMounts"]
        values = dict(settings(objects))
        args = parsed(container["args"][1:], **values)
        assert args.run is run_analyze and parse_interval(args.every) == 300
        assert (args.master, args.driver_memory, args.pushgateway, args.push_job) == (
            "local[*]", "2g", values["ACKSCOPE_PUSHGATEWAY"], "ackscope-analysis")
        [broker] = find(objects, "StatefulSet")
        assert args.lake == lake_of(objects, broker)
        assert args.lake.startswith("s3a://") if name == "object-storage" else args.lake == "/lake"


# -- the commands are ackscope's ------------------------------------------------------------------------

def parsed(args: list[str], **values: str):
    """The arguments as ackscope's own parser reads them, $(VAR) references filled in as Kubernetes would
    (from `values`, else these)."""
    values = {"ACKSCOPE_LAKE": "/lake", "ACKSCOPE_PUSHGATEWAY": "http://pushgateway:9091", "POD_NAME": "rabbitmq-0",
              "POD_NAMESPACE": "default", **values}
    filled = [re.sub(r"\$\((\w+)\)", lambda m: values[m.group(1)], a) for a in args]
    return build_parser().parse_args(filled)


@pytest.mark.parametrize("name", OVERLAYS)
def test_the_agent_arguments_are_ackscope_captures(name):
    for workload in (o for o in overlay(name) if o["kind"] in ("Deployment", "StatefulSet")):
        args = parsed(agent_container(workload)["args"])
        assert args.run is run_capture
        ports = [5672, 5671] if name == "app-sidecar-tls" else [5672]
        assert (args.iface, args.port, args.metrics_addr, args.lake) == ("eth0", ports, "0.0.0.0:9419", "/lake")
        assert args.agent_id == "default.rabbitmq-0"


def test_the_tls_overlay_shares_a_private_in_memory_key_log_between_the_application_and_the_agent():
    (workload,) = find(overlay("app-sidecar-tls"), "Deployment", "orders-api")
    spec = workload["spec"]["template"]["spec"]
    keylog = "/var/run/ackscope-keylog/keys.log"
    (volume,) = [v for v in spec["volumes"] if v["name"] == "tls-keylog"]
    assert volume["emptyDir"]["medium"] == "Memory"
    init, agent = spec["initContainers"]
    assert (init["name"], agent["name"]) == ("ackscope-keylog", "ackscope-agent")
    assert "0o600" in init["command"][-1] and keylog in init["command"][-1]
    assert parsed(agent["args"]).tls_keylog == keylog
    assert {"name": "tls-keylog", "mountPath": os.path.dirname(keylog), "readOnly": True} in agent["volumeMounts"]
    (app,) = spec["containers"]
    assert {"name": "SSLKEYLOGFILE", "value": keylog} in app["env"]
    # The agent refuses a key log others may read: the application writes it as the agent's user.
    assert app["securityContext"]["runAsUser"] == agent["securityContext"]["runAsUser"] == init["securityContext"]["runAsUser"]
    mounting = [c["name"] for c in spec["initContainers"] + spec["containers"]
                if any(m["name"] == "tls-keylog" for m in c.get("volumeMounts", []))]
    assert sorted(mounting) == ["ackscope-agent", "ackscope-keylog", "orders-api"]


def test_the_analysis_arguments_are_ackscope_analyzes():
    [cronjob] = find(overlay("broker-sidecar"), "CronJob")
    [container] = cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"]
    assert container["args"][0] == "ackscope"
    args = parsed(container["args"][1:])
    assert args.run is run_analyze
    assert (args.master, args.driver_memory, args.lake, args.pushgateway, args.push_job, args.every) == (
        "local[*]", "2g", "/lake", "http://pushgateway:9091", "ackscope-analysis", None)
    [application] = find(overlay("spark-operator"), "ScheduledSparkApplication")
    args = parsed(["analyze", *application["spec"]["template"]["arguments"]])
    assert args.run is run_analyze and args.lake == "/lake" and args.master.startswith("k8s://")


def test_every_dashboard_configmap_fits_kubectl_apply():
    """kubectl apply keeps the whole object in an annotation of at most 256 KiB."""
    for board in kubernetes.dashboard_config_maps():
        assert len(json.dumps(board)) < 256 * 1024, board["metadata"]["name"]
