"""A class-data-sharing archive (AppCDS) of the Spark driver JVM's classes, for local runs
(docs/analysis.md, "The speed machinery"): loading and verifying Spark's classes is a small run's
largest fixed cost; the archive holds them parsed and verified in one mapped file (28-35% less wall
time for the runs Spark makes on a local master). Made once per Java and Spark installation
(make_jvm_archive.py); its name hashes Spark's `java` and JARs, so another Java or pyspark finds
none and runs as before, and the JVM silently ignores an archive that does not match. Mapped
outside the heap. Local masters only: a cluster starts its driver with its own options.
"""

from __future__ import annotations

import glob
import hashlib
import os
import shutil

import pyspark

# The JVM's messages about CDS (a class it cannot archive, an archive that does not match) are for
# whoever tunes the JVM, not for the terminal of `ackscope analyze`.
QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"


def archive_folder() -> str:
    """ACKSCOPE_JVM_ARCHIVE_DIR, else ackscope's folder in the user's cache."""
    return os.environ.get("ACKSCOPE_JVM_ARCHIVE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "ackscope", "jvm")


def archive_path() -> str | None:
    """This Java and Spark's archive (which may not exist yet); None if Spark's `java` is not found."""
    java = _java()
    if java is None:
        return None
    digest = hashlib.sha256()
    for path in [java, *sorted(glob.glob(os.path.join(_spark_home(), "jars", "*.jar")))]:
        stat = os.stat(path)
        digest.update(f"{path}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    return os.path.join(archive_folder(), f"spark-{pyspark.__version__}-{digest.hexdigest()[:16]}.jsa")


def java_options() -> str:
    """The driver's JVM options to map the archive, or "" when there is none for this installation."""
    try:
        path = archive_path()
    except OSError:
        return ""
    # Pointed at a missing file the JVM would drop its built-in JDK archive too: only an existing one.
    if path is None or not os.path.isfile(path):
        return ""
    return f"-XX:SharedArchiveFile={path} {QUIET}"


def _java() -> str | None:
    """The `java` spark-class runs: JAVA_HOME's, else the first on PATH."""
    home = os.environ.get("JAVA_HOME")
    java = os.path.join(home, "bin", "java") if home else shutil.which("java")
    return os.path.realpath(java) if java and os.path.isfile(java) else None


def _spark_home() -> str:
    return os.environ.get("SPARK_HOME") or os.path.dirname(pyspark.__file__)
