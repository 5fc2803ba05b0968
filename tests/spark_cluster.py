"""A Spark standalone cluster on this machine, from pyspark's own jars: a master and workers, each
its own JVM (`spark-class org.apache.spark.deploy.master.Master` / `...worker.Worker`), on
127.0.0.1 and free ports, with a work folder of their own; stopped, every JVM with its executors,
however the test ends.

The executors' Python workers run this venv's interpreter (`spark.pyspark.python` in the drivers'
spark-defaults.conf): the workers share this machine, so the venv that has ackscope installed is
the one a packed environment would carry to a real cluster's nodes (docs/deployment.md).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pyspark

SPARK_HOME = os.path.dirname(pyspark.__file__)
START_TIMEOUT_S = 120
# The JIT's quick compiler only: the test cluster's daemons pass messages and its executors run a
# few seconds of small tasks, and the optimising compiler's threads would take this machine's two
# cores from the tasks.
QUICK_START = "-XX:TieredStopAtLevel=1"
STOP_TIMEOUT_S = 30


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@dataclass
class Cluster:
    url: str                  # spark://127.0.0.1:PORT
    ui: str                   # the master's web UI, whose /json/ lists the workers
    conf_dir: Path            # SPARK_CONF_DIR for drivers: spark-defaults.conf for this cluster
    folder: Path
    processes: list = field(default_factory=list)

    def driver_env(self) -> dict[str, str]:
        """The environment a driver (`ackscope analyze`, spark-submit) runs in to use this cluster."""
        return {**os.environ, "SPARK_HOME": SPARK_HOME, "SPARK_CONF_DIR": str(self.conf_dir),
                "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable}

    def state(self) -> dict:
        with urllib.request.urlopen(f"{self.ui}/json/", timeout=10) as answer:
            return json.load(answer)

    def logs(self, last: int = 3000) -> str:
        return "\n".join(f"--- {path.name}\n{path.read_text(errors='replace')[-last:]}"
                         for path in sorted(self.folder.glob("*.log")))


def _daemon_env(folder: Path) -> dict[str, str]:
    return {**os.environ, "SPARK_HOME": SPARK_HOME, "SPARK_CONF_DIR": str(folder / "daemon-conf"),
            "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_DAEMON_MEMORY": "256m", "SPARK_DAEMON_JAVA_OPTS": QUICK_START,
            "PYSPARK_PYTHON": sys.executable}


def _start(cluster: Cluster, name: str, main_class: str, *args: str) -> None:
    log = open(cluster.folder / f"{name}.log", "wb")
    # A session (process group) of its own: the worker's executors are its children, stopped with it.
    process = subprocess.Popen([os.path.join(SPARK_HOME, "bin", "spark-class"), main_class, *args],
                               stdout=log, stderr=subprocess.STDOUT, env=_daemon_env(cluster.folder),
                               start_new_session=True)
    log.close()
    cluster.processes.append(process)


def _stop(processes: list) -> None:
    """Workers first (each stops its executors), then the master: TERM, then KILL after a while."""
    for process in reversed(processes):
        if process.poll() is None:
            try:
                os.killpg(process.pid, signal.SIGTERM)
            except ProcessLookupError:
                continue
    deadline = time.monotonic() + STOP_TIMEOUT_S
    for process in processes:
        try:
            process.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
        try:  # the JVM's children too, whether or not it went on its own
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        process.wait(timeout=STOP_TIMEOUT_S)


@contextmanager
def standalone_cluster(folder: Path, workers: int = 2, cores: int = 1, memory: str = "1g",
                       executor_memory: str = "768m", shuffle_partitions: int = 4):
    """A master and `workers` workers of `cores` cores and `memory` each; yields the Cluster once every
    worker has registered with the master."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "daemon-conf").mkdir(exist_ok=True)
    conf_dir = folder / "driver-conf"
    conf_dir.mkdir(exist_ok=True)
    # What a site puts in its spark-defaults.conf: executor size, and the interpreter the executors'
    # Python workers run (here the venv's; on a real cluster the packed environment's, docs/deployment.md).
    # Each test run starts its executors anew for a few seconds of small tasks (QUICK_START).
    (conf_dir / "spark-defaults.conf").write_text(
        f"spark.executor.memory {executor_memory}\n"
        f"spark.executor.extraJavaOptions {QUICK_START}\n"
        f"spark.executor.cores {cores}\n"
        f"spark.cores.max {workers * cores}\n"
        f"spark.sql.shuffle.partitions {shuffle_partitions}\n"
        f"spark.pyspark.python {sys.executable}\n"
        "spark.driver.host 127.0.0.1\n"
        "spark.ui.enabled false\n")
    port, ui_port = free_port(), free_port()
    cluster = Cluster(url=f"spark://127.0.0.1:{port}", ui=f"http://127.0.0.1:{ui_port}", conf_dir=conf_dir,
                      folder=folder)
    try:
        _start(cluster, "master", "org.apache.spark.deploy.master.Master",
               "--host", "127.0.0.1", "--port", str(port), "--webui-port", str(ui_port))
        for number in range(workers):
            work = folder / f"worker-{number}"
            work.mkdir(exist_ok=True)
            _start(cluster, f"worker-{number}", "org.apache.spark.deploy.worker.Worker",
                   "--host", "127.0.0.1", "--cores", str(cores), "--memory", memory, "--work-dir", str(work),
                   "--webui-port", str(free_port()), cluster.url)
        _wait_for_workers(cluster, workers)
        yield cluster
    finally:
        _stop(cluster.processes)


def _wait_for_workers(cluster: Cluster, workers: int) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        gone = [p.args[1] for p in cluster.processes if p.poll() is not None]
        if gone:
            raise RuntimeError(f"the cluster's JVMs exited: {gone}\n{cluster.logs()}")
        try:
            alive = [w for w in cluster.state().get("workers", []) if w.get("state") == "ALIVE"]
            if len(alive) >= workers:
                return
        except (OSError, ValueError):
            # The master's UI is not up yet, or up before its JSON page: its HTML answered /json/
            # once in CI (not JSON: a ValueError).
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{workers} workers did not register in {START_TIMEOUT_S} s\n{cluster.logs()}")
        time.sleep(1)
