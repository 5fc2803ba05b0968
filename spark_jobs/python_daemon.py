"""Spark's Python daemon for local sessions: pyspark.daemon, its workers importing pyspark from the
installed package rather than from the archives Spark puts first on their path.

Spark starts every Python worker's path with $SPARK_HOME/python/lib/pyspark.zip, the py4j zip and
the JAR of its own core classes (5,800 entries, no Python in it). Python caches no bytecode for
modules in an archive, so the daemon and every worker it forks compile pyspark's modules from
source again; and a worker's first task calls `importlib.invalidate_caches()`
(pyspark.worker_util.setup_spark_files), which makes every archive importer read its archive's
whole directory again: the JAR twice, pyspark.zip once per pyspark package imported (0.13-0.30 CPU
s a call, measured on a slow machine). Together the first Python job of a local session took 1.1-1.3
s longer (bench/README.md, session 22). When SPARK_HOME is the installed pyspark package itself (a
local session of a pip install: the archives are zipped copies of it), the daemon drops the
archives from the path before it imports pyspark, and the workers it forks inherit that path.
Otherwise it runs as pyspark.daemon does.

session.get_spark names this module `spark.python.daemon.module` for local sessions.
"""

from __future__ import annotations

import os
import sys
from importlib.machinery import PathFinder


def archives_of_this_install(path: list[str], spark_home: str | None) -> list[str]:
    """Spark's archives on `path` (zips and JARs under `spark_home`), which can be left out because
    `spark_home` is the installed pyspark package found without them, with py4j beside it; [] when
    any is not so. Other archives on the path (a user's own) stay."""
    if not spark_home:
        return []
    home = os.path.realpath(spark_home)
    archives = [entry for entry in path if os.path.isfile(entry) and os.path.realpath(entry).startswith(home + os.sep)]
    if not archives:
        return []
    rest = [entry for entry in path if entry not in archives]
    pyspark, py4j = PathFinder.find_spec("pyspark", rest), PathFinder.find_spec("py4j", rest)
    if pyspark is None or py4j is None or not pyspark.submodule_search_locations:
        return []
    installed = os.path.realpath(list(pyspark.submodule_search_locations)[0])
    return archives if installed == home else []


def main() -> None:
    dropped = archives_of_this_install(sys.path, os.environ.get("SPARK_HOME"))
    if dropped:
        sys.path[:] = [entry for entry in sys.path if entry not in dropped]
        for entry in list(sys.path_importer_cache):
            if any(entry == archive or entry.startswith(archive + os.sep) for archive in dropped):
                del sys.path_importer_cache[entry]
    from pyspark import daemon  # after the path is settled: the daemon and its workers import from it
    daemon.manager()


if __name__ == "__main__":
    main()
