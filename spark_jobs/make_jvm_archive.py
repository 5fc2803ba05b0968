"""`python -m spark_jobs.make_jvm_archive [--if-missing]`: the training run that makes the archive
jvm_archive.py maps (run by `make venv`, `make test` and `make jvm-archive`): the bundled sample
analysed in a new driver JVM started with `-XX:ArchiveClassesAtExit`, the file renamed into place
once written whole. Its failure only costs speed.
"""

from __future__ import annotations

import os
import sys
import tempfile

from .jvm_archive import QUIET, archive_path


def build(master: str = "local[2]") -> str:
    """Train and write the archive: the bundled sample ingested and analysed in a new driver JVM
    that dumps its classes when it exits. Returns the archive's path."""
    from analyzer.cli import sample_captures
    from analyzer.ingest import ingest_file
    from pyspark.core.context import SparkContext

    from .analyze import analyze
    from .session import get_spark

    path = archive_path()
    if path is None:
        raise RuntimeError("no java found: set JAVA_HOME or put java on PATH")
    if SparkContext._gateway is not None:
        raise RuntimeError("a Spark driver JVM is already running in this process: build the archive in a new one")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    dumping = f"{path}.{os.getpid()}.tmp"
    with tempfile.TemporaryDirectory(prefix="ackscope-jvm-archive-") as lake:
        for capture in sample_captures():
            ingest_file(capture, lake)
        spark = get_spark(master, "ackscope-jvm-archive",
                          extra_java_options=f"-XX:ArchiveClassesAtExit={dumping} {QUIET}", class_archive=False)
        try:
            analyze(spark, lake)
        finally:
            spark.stop()
            _exit_driver_jvm()
    if not os.path.isfile(dumping):
        raise RuntimeError(f"the driver JVM wrote no archive ({dumping})")
    os.replace(dumping, path)  # whole or not at all, for runs starting meanwhile
    return path


def _exit_driver_jvm() -> None:
    """End the gateway's JVM and wait while it writes the archive (it exits when its stdin closes)."""
    from pyspark.core.context import SparkContext

    gateway = SparkContext._gateway
    proc = gateway.proc
    gateway.shutdown()
    proc.stdin.close()
    proc.wait(timeout=600)
    SparkContext._gateway, SparkContext._jvm = None, None


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    path = archive_path()
    if "--if-missing" in args and path is not None and os.path.isfile(path):
        print(f"jvm archive: {path} is there already", file=sys.stderr)
        return 0
    try:
        print(f"jvm archive: wrote {build()}", file=sys.stderr)
    except RuntimeError as exc:  # runs work without it, only slower
        print(f"jvm archive: not made: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
