"""The CDS archive of Spark's classes (spark_jobs/jvm_archive.py): named for the installation,
used only when it exists (the archive itself is made by `make venv`, a 30-60 s training run)."""

import os

from spark_jobs import jvm_archive


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
    assert jvm_archive.main(["--if-missing"]) == 0
    assert "there already" in capsys.readouterr().err
