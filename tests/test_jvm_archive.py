"""The CDS archive of Spark's classes (spark_jobs/jvm_archive.py, made by make_jvm_archive.py): named for the installation,
used only when it exists (the archive itself is made by `make venv`, a 30-60 s training run)."""

import os
import subprocess
import sys

from spark_jobs import jvm_archive, make_jvm_archive


def test_no_archive_no_option(tmp_path, monkeypatch):
    monkeypatch.setenv("ACKSCOPE_JVM_ARCHIVE_DIR", str(tmp_path))
    # The JVM pointed at a missing archive would also drop the JDK's own: no option at all.
    assert jvm_archive.java_options() == ""


def test_an_existing_archive_is_mapped_quietly(tmp_path, monkeypatch):
    monkeypatch.setenv("ACKSCOPE_JVM_ARCHIVE_DIR", str(tmp_path))
    path = jvm_archive.archive_path()
    assert os.path.dirname(path) == str(tmp_path) and path.endswith(".jsa")
    open(path, "wb").close()
    options = jvm_archive.java_options().split()
    assert f"-XX:SharedArchiveFile={path}" in options
    assert "-Xlog:cds=off" in options and "-Xlog:cds+dynamic=off" in options


def test_the_name_follows_the_java_and_the_spark_jars(tmp_path, monkeypatch):
    monkeypatch.setenv("ACKSCOPE_JVM_ARCHIVE_DIR", str(tmp_path))
    path = jvm_archive.archive_path()
    jars = tmp_path / "spark" / "jars"
    jars.mkdir(parents=True)
    (jars / "spark-core.jar").write_bytes(b"x")
    monkeypatch.setenv("SPARK_HOME", str(tmp_path / "spark"))
    other = jvm_archive.archive_path()
    assert other != path
    (jars / "spark-core.jar").write_bytes(b"xy")
    assert jvm_archive.archive_path() != other
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "no-java"))
    assert jvm_archive.archive_path() is None and jvm_archive.java_options() == ""


def test_if_missing_leaves_an_existing_archive(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("ACKSCOPE_JVM_ARCHIVE_DIR", str(tmp_path))
    open(jvm_archive.archive_path(), "wb").close()
    assert make_jvm_archive.main(["--if-missing"]) == 0
    assert "there already" in capsys.readouterr().err


def test_a_local_driver_loads_spark_from_the_archive(tmp_path):
    """The real thing: a new driver JVM, started as every local run starts it, takes Spark's
    classes from the archive (the JVM's class-load log names the source), not from the JARs."""
    if jvm_archive.archive_path() is None:
        raise AssertionError("no java for Spark: the services install it")
    log = tmp_path / "classes.log"
    script = (
        "import os\n"
        "from spark_jobs import jvm_archive, make_jvm_archive\n"
        "from spark_jobs.session import get_spark\n"
        "if not os.path.isfile(jvm_archive.archive_path()):\n"
        "    make_jvm_archive.build()\n"
        f"spark = get_spark('local[1]', extra_java_options='-Xlog:class+load=info:file={log}')\n"
        "assert spark.range(3).count() == 3\n"
        "spark.stop()\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    sources = {}
    for line in log.read_text().splitlines():
        parts = line.split("] ", 3)[-1].split(" source: ", 1)
        if len(parts) == 2:
            sources[parts[0].strip()] = parts[1].strip()
    assert sources["org.apache.spark.SparkContext"] == "shared objects file (top)", \
        sources.get("org.apache.spark.SparkContext")
    from_archive = sum(source.startswith("shared objects file") for source in sources.values())
    assert from_archive > len(sources) / 2, (from_archive, len(sources))
