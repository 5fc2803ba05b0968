"""The Python daemon of local sessions (spark_jobs/python_daemon.py): its workers import pyspark as
installed, with no archive on their path, and only when Spark's archives are copies of that install."""

import os

import pyarrow as pa
import pyspark

from spark_jobs.python_daemon import archives_of_this_install

def _worker_view(batches):
    import sys

    import pyspark as worker_pyspark
    for _ in batches:
        pass
    yield pa.RecordBatch.from_pylist([{
        "archives": [entry for entry in sys.path if os.path.isfile(entry)],
        "zip_importers": sum(type(finder).__name__ == "zipimporter" for finder in sys.path_importer_cache.values()),
        "pyspark": worker_pyspark.__file__}])


def test_the_workers_import_pyspark_as_installed_with_no_archive_on_their_path(spark):
    rows = spark.range(2).repartition(2).mapInArrow(
        _worker_view, "archives array<string>, zip_importers long, pyspark string").collect()
    assert rows
    for row in rows:
        assert row["archives"] == [] and row["zip_importers"] == 0
        assert os.path.realpath(row["pyspark"]) == os.path.realpath(pyspark.__file__)


def test_archives_are_left_out_only_when_spark_home_is_the_installed_pyspark(tmp_path):
    # Here, not at import: the workers import this module to run _worker_view.
    installed = os.path.dirname(os.path.abspath(pyspark.__file__))
    archives = [os.path.join(installed, "python", "lib", name)
                for name in sorted(os.listdir(os.path.join(installed, "python", "lib"))) if name.endswith(".zip")]
    site = os.path.dirname(installed)
    jar = next(os.path.join(installed, "jars", name) for name in sorted(os.listdir(os.path.join(installed, "jars")))
               if name.startswith("spark-core"))
    path = [*archives, jar, site]
    assert archives and archives_of_this_install(path, installed) == [*archives, jar]
    # Another Spark (its own pyspark in its archives), or none named: the path stays as Spark made it.
    other = tmp_path / "spark"
    other.mkdir()
    assert archives_of_this_install(path, str(other)) == []
    assert archives_of_this_install(path, None) == []
    # An archive of one's own on the path is not Spark's: it stays.
    own = tmp_path / "own.zip"
    own.write_bytes(b"")
    assert archives_of_this_install([str(own), *path], installed) == [*archives, jar]
    # pyspark not installed outside the archives: nothing to import it from but them.
    assert archives_of_this_install([*archives, jar, str(tmp_path)], installed) == []
