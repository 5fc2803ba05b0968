"""deploy/docker, as far as it can be checked without Docker (these machines cannot build images):
the agent image's requirements are pyproject.toml's pins and cover what the agent imports; every
file the Dockerfiles copy exists; both images end as a non-root user and the agent's only
capability is NET_RAW; the analysis image's SPARK_PACKAGES build step and every hadoop-aws version
deploy/, the docs and the README name agree with the Hadoop pyspark ships; the analysis image's entry
point starts Spark-on-Kubernetes drivers and executors as Spark's own images do, and passes anything
else through."""

from __future__ import annotations

import glob
import importlib.metadata
import importlib.util
import os
import re
import subprocess
import sys
import textwrap

import pytest
from packaging.requirements import Requirement

from .conftest import ROOT

DOCKER = os.path.join(ROOT, "deploy", "docker")
sys.path.insert(0, DOCKER)
import requirements  # noqa: E402  (deploy/docker/requirements.py, what the agent image runs)

DOCKERFILES = ("agent.Dockerfile", "analysis.Dockerfile")
# Imported when present, not needed: scapy's config looks for cryptography (its "all" extra) and goes on without it.
OPTIONAL = {"cryptography"}
# The agent's modules; what they import is what the image needs.
AGENT_IMPORTS = """
import sys
import analyzer.cli, analyzer.agent.run, analyzer.agent.bpf
import scapy.arch, scapy.arch.common, scapy.interfaces  # what the filter-compiling child imports
from analyzer.agent import capture, decoder, http, live_state, metrics, pcap_out, sink
# (_distutils_hack is setuptools' start-up hook from a .pth file, not an import of the agent's)
print("\\n".join(sorted({m.split(".")[0] for m in sys.modules if not m.startswith("_")})))
"""


def instructions(name: str) -> list[tuple[str, str]]:
    text = open(os.path.join(DOCKER, name)).read().replace("\\\n", " ")
    return [tuple(line.strip().split(None, 1)) for line in text.splitlines()
            if line.strip() and not line.lstrip().startswith("#")]


def requires_closure(names: set[str]) -> set[str]:
    """The distributions `names` install here, with everything they require (no extras)."""
    seen, todo = set(), list(names)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for text in importlib.metadata.requires(name) or []:
            requirement = Requirement(text)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                todo.append(requirements.name_of(text))
    return {re.sub(r"[-_.]+", "-", n) for n in seen}


def test_the_agent_requirements_are_pyprojects_pins():
    pinned = requirements.agent_requirements()
    assert len(pinned) == len(requirements.AGENT)
    assert all(re.fullmatch(r"[A-Za-z0-9_.-]+==[0-9][^ ;]*", r) for r in pinned), pinned
    with open(os.path.join(ROOT, "pyproject.toml")) as f:
        text = f.read()
    assert all(f'"{r}"' in text for r in pinned)


def test_the_agent_requirements_cover_every_module_the_agent_imports():
    run = subprocess.run([sys.executable, "-c", AGENT_IMPORTS], capture_output=True, text=True, cwd=ROOT)
    assert run.returncode == 0, run.stderr
    distributions = importlib.metadata.packages_distributions()
    needed = {re.sub(r"[-_.]+", "-", d.lower()) for module in run.stdout.split()
              for d in distributions.get(module, []) if d.lower() != "ackscope"}
    assert {"scapy", "pamqp", "deltalake", "pyarrow", "numpy", "prometheus-client"} <= needed
    installed = requires_closure(set(requirements.AGENT))
    assert needed - installed - OPTIONAL == set()
    assert not {"pyspark", "pandas", "delta-spark"} & installed  # the agent image stays slim


def test_a_missing_pin_is_refused(tmp_path):
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text('[project]\nname = "x"\ndependencies = ["scapy==2.8.0", "pyarrow==26.0.1"]\n')
    with pytest.raises(SystemExit, match="deltalake"):
        requirements.agent_requirements(pyproject)


@pytest.mark.parametrize("name", DOCKERFILES)
def test_every_copied_file_exists_and_the_image_ends_non_root(name):
    steps = instructions(name)
    copies = [args.split() for op, args in steps if op == "COPY" and "--from=" not in args]
    assert copies
    for *sources, _target in copies:
        for source in sources:
            assert os.path.exists(os.path.join(ROOT, source)), f"{name}: COPY {source}: no such file"
    users = [args for op, args in steps if op == "USER"]
    assert users and users[-1] == "10001:10001"
    assert steps[0][0] == "FROM" and "python:3.11" in steps[0][1]


def test_the_agent_image_grants_net_raw_alone():
    runs = " ".join(args for op, args in instructions("agent.Dockerfile") if op == "RUN")
    assert re.findall(r"setcap (\S+)", runs) == ["cap_net_raw+ep"]
    froms = [args for op, args in instructions("agent.Dockerfile") if op == "FROM"]
    assert len(froms) == 2  # the compiler stays in the build stage


def fake_command(folder, name: str) -> None:
    path = folder / name
    path.write_text(textwrap.dedent(f"""\
        #!/bin/sh
        echo {name}
        for arg in "$@"; do echo "$arg"; done
        """))
    path.chmod(0o755)


def entrypoint(tmp_path, *args: str, **env: str) -> list[str]:
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir(exist_ok=True)
    fake_command(fake_bin, "spark-submit")
    java_home = tmp_path / "java"
    (java_home / "bin").mkdir(parents=True, exist_ok=True)
    fake_command(java_home / "bin", "java")
    path = f"{fake_bin}:{os.path.dirname(sys.executable)}:{os.environ['PATH']}"
    run = subprocess.run(["bash", os.path.join(DOCKER, "spark-entrypoint.sh"), *args], capture_output=True,
                         text=True, env={"PATH": path, "JAVA_HOME": str(java_home), **env}, timeout=60)
    assert run.returncode == 0, run.stderr
    return run.stdout.splitlines()


def test_the_entry_point_starts_a_driver_in_client_mode(tmp_path):
    out = entrypoint(tmp_path, "driver", "--properties-file", "/opt/spark/conf/spark.properties",
                     "local:///opt/ackscope/spark_jobs/job.py", "--lake=/lake",
                     SPARK_DRIVER_BIND_ADDRESS="10.1.2.3")
    assert out[0] == "spark-submit"
    assert out[1:3] == ["--deploy-mode", "client"]
    assert "spark.driver.bindAddress=10.1.2.3" in out
    assert out[-3:] == ["/opt/spark/conf/spark.properties", "local:///opt/ackscope/spark_jobs/job.py", "--lake=/lake"]


def test_the_entry_point_starts_an_executor_with_its_options_in_order(tmp_path):
    env = {"SPARK_EXECUTOR_MEMORY": "2g", "SPARK_DRIVER_URL": "spark://driver:7078", "SPARK_EXECUTOR_ID": "3",
           "SPARK_EXECUTOR_CORES": "1", "SPARK_APPLICATION_ID": "app-1", "SPARK_EXECUTOR_POD_IP": "10.0.0.9",
           "SPARK_RESOURCE_PROFILE_ID": "0", "SPARK_EXECUTOR_POD_NAME": "ackscope-exec-3",
           "SPARK_JAVA_OPT_1": "-Dsecond=2", "SPARK_JAVA_OPT_0": "-Dfirst=1", "SPARK_JAVA_OPT_10": "-Deleventh=11"}
    out = entrypoint(tmp_path, "executor", **env)
    assert out[0] == "java"
    assert out[1:4] == ["-Dfirst=1", "-Dsecond=2", "-Deleventh=11"]
    assert out[4:6] == ["-Xms2g", "-Xmx2g"]
    classpath = out[out.index("-cp") + 1]
    assert classpath.split(":")[0].endswith("pyspark/jars/*")
    assert "org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBackend" in out
    assert out[out.index("--executor-id") + 1] == "3" and out[out.index("--podName") + 1] == "ackscope-exec-3"


def test_the_entry_point_passes_other_commands_through(tmp_path):
    assert entrypoint(tmp_path, "spark-submit", "--version") == ["spark-submit", "--version"]
    assert entrypoint(tmp_path, "echo", "plain") == ["plain"]


# -- Spark packages at build time (hadoop-aws for S3, delta-spark) ----------------------------------

def pyspark_hadoop_version() -> str:
    """The Hadoop pyspark ships, from its jars (as Spark's VersionInfo reports it, without a JVM)."""
    jars = os.path.join(os.path.dirname(importlib.util.find_spec("pyspark").origin), "jars")
    [api] = glob.glob(os.path.join(jars, "hadoop-client-api-*.jar"))
    return os.path.basename(api).removeprefix("hadoop-client-api-").removesuffix(".jar")


def test_every_hadoop_aws_named_is_pysparks_hadoop():
    """hadoop-aws must be the version of the Hadoop Spark runs; the Dockerfile, the manifests, the docs
    and the README name it, and all must say pyspark's."""
    hadoop = pyspark_hadoop_version()
    files = [os.path.join(ROOT, "README.md"), os.path.join(ROOT, "docs", "deployment.md"),
             *glob.glob(os.path.join(ROOT, "deploy", "**", "*"), recursive=True)]
    named = {}
    for path in files:
        if os.path.isfile(path):
            with open(path, encoding="utf-8", errors="replace") as f:
                for version in re.findall(r"hadoop-aws[:-](\d[\w.-]*?)(?:\.jar)?(?=[\s,`)\]'\"]|$)", f.read()):
                    named.setdefault(version, set()).add(os.path.relpath(path, ROOT))
    assert set(named) == {hadoop}, named
    assert {"deploy/docker/analysis.Dockerfile", "docs/deployment.md", "README.md"} <= named[hadoop]


def package_step(tmp_path, **build_args: str) -> tuple[str, list[str]]:
    """Runs the analysis Dockerfile's Spark-packages step with these build args and a stand-in
    python: what it asked Spark to resolve (or None) and the JARs it copied into Spark's jars."""
    steps = instructions("analysis.Dockerfile")
    args = {a.split("=", 1)[0]: "" for op, a in steps if op == "ARG"}
    [script] = [a for op, a in steps if op == "RUN" and "spark.jars.packages" in a]
    ivy, jars = tmp_path / "ivy", tmp_path / "jars"
    jars.mkdir(parents=True)
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "python").write_text(textwrap.dedent(f"""\
        #!/bin/sh
        if [ "$1" = -c ]; then echo {jars}; exit 0; fi
        cat > {tmp_path}/resolved.py
        mkdir -p {ivy}/jars && touch {ivy}/jars/resolved.jar
        """))
    (fake / "python").chmod(0o755)
    run = subprocess.run(["sh", "-c", script.replace("/tmp/ivy", str(ivy))], capture_output=True, text=True,
                         env={"PATH": f"{fake}:/usr/bin:/bin", **args, **build_args}, timeout=60)
    assert run.returncode == 0, run.stderr
    resolved = tmp_path / "resolved.py"
    asked = re.search(r'"spark.jars.packages", "([^"]*)"', resolved.read_text()).group(1) if resolved.exists() else None
    assert not ivy.exists()
    return asked, sorted(os.listdir(jars))


def test_the_spark_packages_build_arg_fetches_what_it_names(tmp_path):
    both = f"org.apache.hadoop:hadoop-aws:{pyspark_hadoop_version()},io.delta:delta-spark_2.13:4.4.1"
    assert package_step(tmp_path / "none") == (None, [])
    assert package_step(tmp_path / "both", SPARK_PACKAGES=both) == (both, ["resolved.jar"])
    # DELTA_PACKAGES, its former name, still works alone; SPARK_PACKAGES wins when both are given.
    assert package_step(tmp_path / "old", DELTA_PACKAGES="io.delta:delta-spark_2.13:4.4.1")[0] == \
        "io.delta:delta-spark_2.13:4.4.1"
    assert package_step(tmp_path / "new", DELTA_PACKAGES="a:b:1", SPARK_PACKAGES="c:d:2")[0] == "c:d:2"
