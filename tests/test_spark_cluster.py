"""The analysis on a real Spark standalone cluster (tests/spark_cluster.py: a master and two workers,
each its own JVM, from pyspark's jars): `ackscope analyze --master spark://...`, a full run and then
an incremental run after an append, on a lab lake (the recorded examples) and a generated one
(bench/frames_generator.py), each ending with tables equal, row for row, to the same runs' on this
machine alone (`ackscope analyze`, whose small append the driver carries on itself with no JVM).
The lab lake's incremental run goes through `spark-submit --master spark://... spark_jobs/job.py`,
which runs on the master spark-submit was given, shipped with docs/deployment.md's packed virtualenv
(`--archives`), as it would be to a real cluster's nodes; elsewhere the executors import ackscope
from this venv (the workers share this machine).

The cluster is started once for the module (a master's and two workers' JVMs cost tens of seconds
on a busy machine), and the packed environment is made beside the generated lake's runs."""

import functools
import glob
import importlib.util
import json
import os
import subprocess
import sys
from concurrent.futures import Future, ThreadPoolExecutor

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from analyzer import lake, schema
from analyzer.ingest import ingest_file

from .conftest import ROOT
from .spark_cluster import SPARK_HOME, standalone_cluster


def _load(name: str, path: str):
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, path))
    module = sys.modules.setdefault(name, importlib.util.module_from_spec(spec))
    spec.loader.exec_module(module)
    return module


gen = _load("bench_frames_generator", "bench/frames_generator.py")
digests = _load("bench_incremental", "bench/incremental.py")

ACKSCOPE = os.path.join(os.path.dirname(sys.executable), "ackscope")
RUN_TIMEOUT_S = 900
GENERATED = gen.Params(frames=12_000, hot_deliveries=2_000, seed=23, connections=8, duration_s=900)


class _BlockFailed(Exception):
    """Raised inside the module cluster's block once its tests are over, as a failing test would."""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """The module's cluster, ended by a failure inside its block; on the way out, standalone_cluster's
    promise is checked: no JVM of the cluster is left, even when the block fails."""
    pids = []
    try:
        with standalone_cluster(tmp_path_factory.mktemp("spark-cluster")) as running:
            pids = [process.pid for process in running.processes]
            yield running
            raise _BlockFailed()
    except _BlockFailed:
        pass
    assert len(pids) == 3 and [pid for pid in pids if os.path.exists(f"/proc/{pid}")] == []


def _analyze(lake_dir: str, env: dict, *options: str) -> dict:
    done = subprocess.run([ACKSCOPE, "analyze", "--lake", lake_dir, "--json", *options], capture_output=True,
                          text=True, timeout=RUN_TIMEOUT_S, env=env)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout)


def _applications(cluster) -> list[str]:
    """The applications the master has seen finish."""
    return [app["name"] for app in cluster.state().get("completedapps", [])]


def _append(lake_dir: str, frames: pa.Table, connections: pa.Table, app_id: str) -> None:
    for name, table, table_schema in (("frames", frames, schema.FRAMES),
                                      ("connections", connections, schema.CONNECTIONS)):
        writer = lake.TableWriter(lake_dir, name, table_schema)
        writer.write(table)
        writer.commit(app_id)


def _lab_pieces(tmp_path) -> list[tuple[pa.Table, pa.Table]]:
    """The recorded examples as an agent would have appended them: the first half, then the rest."""
    captures = sorted(glob.glob(os.path.join(ROOT, "examples", "*.pcapng")))
    half = len(captures) // 2
    pieces = []
    for number, group in enumerate((captures[:half], captures[half:])):
        folder = str(tmp_path / f"decoded-{number}")
        for capture in group:
            assert not ingest_file(capture, folder).errors, capture
        pieces.append((lake.read_table(folder, "frames", schema.FRAMES),
                       lake.read_table(folder, "connections", schema.CONNECTIONS)))
    return pieces


def _generated_pieces() -> list[tuple[pa.Table, pa.Table]]:
    """Generated traffic cut by time: its connections live across the append, so the incremental run
    carries them on from their checkpoints."""
    frames, connections = gen.lake_tables(GENERATED)
    pieces, seen = [], set()
    for piece in gen.as_appended(frames, [0.6]):
        ids = set(piece["connection_id"].to_pylist())
        new = connections.filter(pc.is_in(connections["connection_id"], pa.array(sorted(ids - seen), pa.string())))
        pieces.append((piece, new))
        seen |= ids
    return pieces


def _equal_tables(local_lake: str, cluster_lake: str) -> None:
    local, on_cluster = digests.tables_digest(local_lake), digests.tables_digest(cluster_lake)
    assert on_cluster == local, {name: (lake.read_table(local_lake, name, table_schema).num_rows,
                                        lake.read_table(cluster_lake, name, table_schema).num_rows)
                                 for name, table_schema in digests.OUTPUT_TABLES.items()}


def _analyze_on_cluster(cluster, lake_dir: str) -> dict:
    return _analyze(lake_dir, cluster.driver_env(), "--master", cluster.url)


# What the executors' Python workers import of ackscope's dependencies (pyspark comes from the
# cluster's Spark, on the workers' PYTHONPATH): the packed environment of docs/deployment.md.
EXECUTOR_PACKAGES = ("pyarrow", "numpy", "deltalake")


def _pinned(packages: tuple[str, ...]) -> list[str]:
    """`name==version` of each package as pyproject.toml pins it."""
    import tomllib

    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as project:
        pins = {line.split("==")[0]: line for line in tomllib.load(project)["project"]["dependencies"]}
    return [pins[name] for name in packages]


def _pack_environment(folder) -> str:
    """docs/deployment.md's packed virtualenv, made as it says: ackscope without its dependencies,
    the executors' packages at the project's pins, the folder packed with tar. Its path."""
    env, packed = folder / "ackscope-env", folder / "ackscope-env.tar.gz"
    subprocess.run([sys.base_prefix + "/bin/python3", "-m", "venv", str(env)], check=True)
    pip = [str(env / "bin" / "pip"), "install", "-q", "--disable-pip-version-check"]
    subprocess.run([*pip, "--no-deps", ROOT], check=True, capture_output=True)
    subprocess.run([*pip, *_pinned(EXECUTOR_PACKAGES)], check=True, capture_output=True)
    subprocess.run(["tar", "-czf", str(packed), "-C", str(env), "."], check=True)
    return str(packed)


@pytest.fixture(scope="module")
def packed_environment(tmp_path_factory):
    """The packed virtualenv, made in the background (a minute or two of pip and gzip, beside the
    generated lake's runs on the cluster, which go first): a Future of its path."""
    with ThreadPoolExecutor(1) as packing:
        yield packing.submit(_pack_environment, tmp_path_factory.mktemp("packed"))


def _submit_with_packed_environment(cluster, lake_dir: str, packing: Future) -> dict:
    """`spark-submit --master spark://... --archives ackscope-env.tar.gz#environment spark_jobs/job.py
    --lake ...`, as docs/deployment.md ships a job: each executor unpacks the environment in its work
    folder and runs its Python workers from it (`./environment/bin/python`, nothing of this venv).
    With no --master of the job's own, the job runs on spark-submit's master (before, its default
    local[*] overrode it)."""
    env = {key: value for key, value in cluster.driver_env().items() if key != "PYSPARK_PYTHON"}
    run = subprocess.run([os.path.join(SPARK_HOME, "bin", "spark-submit"), "--master", cluster.url,
                          "--archives", f"{packing.result()}#environment",
                          "--conf", "spark.pyspark.python=./environment/bin/python",
                          "--conf", f"spark.pyspark.driver.python={sys.executable}",
                          os.path.join(ROOT, "spark_jobs", "job.py"), "--lake", lake_dir, "--json"],
                         capture_output=True, text=True, timeout=RUN_TIMEOUT_S, env=env)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    return json.loads(run.stdout.splitlines()[-1])  # Spark merges the driver's stderr into stdout


def _unpacked_environments(cluster) -> set:
    """The packed environments the cluster's executors have unpacked in their work folders."""
    return set(cluster.folder.glob("worker-*/app-*/*/environment"))


# The generated lake first: the environment the lab lake's spark-submit ships is packed meanwhile
# (before, the lab lake went first and its spark-submit waited for the packing).
@pytest.mark.parametrize("traffic", ["generated", "lab"],
                         ids=["generated", "lab, the append through spark-submit with the packed environment"])
def test_a_full_run_and_an_incremental_one_on_the_cluster_equal_the_local_runs(cluster, packed_environment, traffic,
                                                                                tmp_path):
    """A full run, an append, an incremental run: on the cluster and on a local master, each lake
    equal to the other after each run. On the lab lake the incremental run is spark-submit's, shipped
    with docs/deployment.md's packed virtualenv."""
    if traffic == "lab":
        then = functools.partial(_submit_with_packed_environment, packing=packed_environment)
        pieces = _lab_pieces(tmp_path)
    else:
        then, pieces = _analyze_on_cluster, _generated_pieces()
    local_lake, cluster_lake = str(tmp_path / "local"), str(tmp_path / "cluster")
    before, unpacked_before = len(_applications(cluster)), _unpacked_environments(cluster)
    reports = []
    # Each local run goes beside the cluster's run of the same step: the two share no lake, and the
    # local master is none of the cluster's.
    with ThreadPoolExecutor(1) as beside:
        for number, ((frames, connections), on_cluster) in enumerate(zip(pieces, (_analyze_on_cluster, then))):
            for lake_dir in (local_lake, cluster_lake):
                _append(lake_dir, frames, connections, f"piece-{number}")
            local = beside.submit(_analyze, local_lake, {**os.environ, "PYSPARK_PYTHON": sys.executable})
            cluster_report = on_cluster(cluster, cluster_lake)
            reports.append((local.result(), cluster_report))
            _equal_tables(local_lake, cluster_lake)
    (full_local, full_cluster), (next_local, next_cluster) = reports
    assert full_local["scope"] == full_cluster["scope"] == "full" and full_cluster["frames"] == pieces[0][0].num_rows
    assert next_local["scope"] == next_cluster["scope"] == "new_data"
    # The append ran on the cluster's executors, where the local run's driver carried it on itself.
    assert next_cluster["delta_mode"] != "none" and next_cluster["spark_jobs"] > next_local["spark_jobs"]
    if traffic == "generated":
        assert next_cluster["carried_connections"] > 0
    else:  # the executors that ran its tasks unpacked the packed environment, and ran their workers from it
        unpacked = _unpacked_environments(cluster) - unpacked_before
        assert unpacked and all((path / "bin" / "python").exists() for path in unpacked)
    assert sum(full_cluster["findings_by_kind"].values()) > 0
    # Both runs were applications of the cluster's master, not local sessions.
    assert _applications(cluster)[before:] == ["ackscope-analyze", "ackscope-analyze"]


def test_the_documented_install_names_the_projects_pins():
    """docs/deployment.md's line that installs the executors' packages pins what pyproject.toml pins."""
    with open(os.path.join(ROOT, "docs", "deployment.md")) as doc:
        assert f"ackscope-env/bin/pip install {' '.join(_pinned(EXECUTOR_PACKAGES))}" in doc.read()
