"""The SparkSession the jobs run in, and which Delta path it can take.

`native`: delta-spark reads the tables; needs the Delta Lake JARs on Spark's classpath
(Databricks, EMR, `--packages io.delta:...` with Maven access, or JARs baked into the image).
`bridge`: delta-rs resolves snapshots, Spark only reads Parquet; works anywhere, including
air-gapped sites and the build machines. Either way the analysis commits with delta-rs.

A lake on S3 is read by Spark through Hadoop's s3a connector (the hadoop-aws JAR and the AWS SDK
bundle), configured from the AWS_* variables delta-rs reads (`use_lake`).
"""

import os
import re
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from importlib.metadata import version
from pathlib import Path

import pyspark
from py4j.protocol import Py4JJavaError
from pyspark import SparkConf
from pyspark.core.context import SparkContext
from pyspark.errors import PySparkRuntimeError
from pyspark.java_gateway import launch_gateway
from pyspark.sql import SparkSession

from analyzer.lake import is_s3

from . import jvm_archive

DELTA_EXTENSION = "io.delta.sql.DeltaSparkSessionExtension"
DELTA_CATALOG = "org.apache.spark.sql.delta.catalog.DeltaCatalog"
DELTA_MODES = ("auto", "native", "bridge")

_SESSION_CONF = {
    # Partition dates and every timestamp the agent writes are UTC.
    "spark.sql.session.timeZone": "UTC",
    # pyarrow and delta-rs use the proleptic Gregorian calendar: never rebase to Spark 2's hybrid one.
    "spark.sql.parquet.datetimeRebaseModeInRead": "CORRECTED",
    "spark.sql.parquet.int96RebaseModeInRead": "CORRECTED",
    # Between Spark and pandas through Arrow batches rather than a Python object per row.
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.ui.showConsoleProgress": "false",
    # Adaptive execution runs every shuffle and broadcast of a plan as a job of its own. The pass
    # fixes its partitions itself, so it has little to adapt, and a small run pays for each extra job.
    "spark.sql.adaptive.enabled": "false",
    # A run's shuffle files deleted when its query ends. Otherwise Spark's ContextCleaner deletes
    # them only once the JVM has collected the objects that reference them, and a long-lived
    # `analyze --every` driver collects seldom (every 30 minutes). A System.gc() right after each
    # run did not do: in 15 of 35 trials the carried run's shuffle files outlived it, until a
    # later collection.
    "spark.sql.classic.shuffleDependency.fileCleanup.enabled": "true",
    # Spark's sorts and window buffers, when they spill, open every piece at once with a 1 MB read
    # buffer, two with read-ahead: one buffer per piece keeps a big spill (the pass sorts a hot
    # connection in one task) within a small driver (bench/README.md).
    "spark.unsafe.sorter.spill.read.ahead.enabled": "false",
    # PySpark 4 otherwise records the Python call site of every DataFrame and Column function in
    # the driver (a stack walk, a failed IPython import and several py4j round trips per call),
    # only to name that line in an error's DataFrame context. Measured without it: `analyze --full`
    # of the demo's lake in a new driver 18 s instead of 24 (bench/README.md, "Session 30").
    "spark.python.sql.dataFrameDebugging.enabled": "false",
    # Each page's CRC32 checked, as pyarrow does (analyzer/lake.py): bytes damaged inside a data
    # file fail the read naming the file, never read as other values.
    "spark.hadoop.parquet.page.verify-checksum.enabled": "true",
}


LOG_CONFIG = Path(__file__).with_name("log4j2.properties")


def spark_log_path() -> str:
    """Where the driver Spark starts here writes its log (ACKSCOPE_SPARK_LOG, else a file per user
    in the temporary folder): error messages point there."""
    return os.environ.get("ACKSCOPE_SPARK_LOG") or os.path.join(tempfile.gettempdir(),
                                                                 f"ackscope-spark-{os.getuid()}.log")


class NativeDeltaUnavailable(RuntimeError):
    """`--delta-mode native` was asked for, but this Spark cannot run delta-spark."""


class ObjectStoreUnavailable(RuntimeError):
    """The lake is on S3, but this Spark has no s3a connector to reach it."""


S3A_FILESYSTEM = "org.apache.hadoop.fs.s3a.S3AFileSystem"
# hadoop-aws 3.4 and later call the AWS SDK v2; 3.3 the v1 SDK.
AWS_SDK_V2_CLIENT = "software.amazon.awssdk.services.s3.S3Client"
AWS_SDK_V1_CLIENT = "com.amazonaws.services.s3.AmazonS3"


LISTING_JOB_THRESHOLD = "spark.sql.sources.parallelPartitionDiscovery.threshold"


def use_lake(spark: SparkSession, lake: str) -> None:
    """Make the session able to read `lake`: on S3, check that the s3a connector is on
    Spark's classpath (before any work, so a missing JAR is one clear error, not a failure halfway)
    and give Hadoop's configuration the settings delta-rs takes from the environment. They go into
    the running context's Hadoop configuration, which every later read ships to its tasks,
    and not into SparkConf, which Spark's UI and event log list."""
    if not is_s3(lake):
        # The bridge names every file a read takes, and past 32 paths Spark lists them in a Spark
        # job of its own: a job a table read, and more of them as an analysis table's files pile up
        # run after run (bench/README.md, session 26). In a folder, a file's status costs the driver
        # microseconds. On S3 each is a request, which the job spreads over the executors.
        spark.conf.set(LISTING_JOB_THRESHOLD, str(2**31 - 1))
        return
    spark.conf.unset(LISTING_JOB_THRESHOLD)
    problem = _s3a_problem(spark)
    if problem is not None:
        raise ObjectStoreUnavailable(f"{lake} is on S3, and {problem}")
    hadoop = spark.sparkContext._jsc.hadoopConfiguration()
    for key, value in s3a_settings(os.environ).items():
        hadoop.set(key, value)


def s3a_settings(environ) -> dict[str, str]:
    """Hadoop's s3a settings that reach the store delta-rs reaches with these AWS_* variables.

    delta-rs (object_store) sends path-style requests unless AWS_VIRTUAL_HOSTED_STYLE_REQUEST is
    true; s3a's default is the other way round, so it is always said. Without keys in the
    environment, s3a's own provider chain (instance roles, IRSA web identity, profiles) is left alone."""
    def flag(name: str) -> bool:
        return environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")

    settings = {"fs.s3a.path.style.access": str(not flag("AWS_VIRTUAL_HOSTED_STYLE_REQUEST")).lower()}
    endpoint = environ.get("AWS_ENDPOINT_URL") or environ.get("AWS_ENDPOINT")
    if endpoint:
        settings["fs.s3a.endpoint"] = endpoint
        # delta-rs refuses http:// without AWS_ALLOW_HTTP; s3a picks TLS by this switch.
        settings["fs.s3a.connection.ssl.enabled"] = str(not endpoint.lower().startswith("http://")).lower()
    region = environ.get("AWS_REGION") or environ.get("AWS_DEFAULT_REGION")
    if region:
        settings["fs.s3a.endpoint.region"] = region
    key, secret = environ.get("AWS_ACCESS_KEY_ID"), environ.get("AWS_SECRET_ACCESS_KEY")
    token = environ.get("AWS_SESSION_TOKEN") or environ.get("AWS_TOKEN")
    if key and secret:
        settings["fs.s3a.access.key"], settings["fs.s3a.secret.key"] = key, secret
        settings["fs.s3a.aws.credentials.provider"] = "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider"
        if token:
            settings["fs.s3a.session.token"] = token
            settings["fs.s3a.aws.credentials.provider"] = "org.apache.hadoop.fs.s3a.TemporaryAWSCredentialsProvider"
    return settings


def hadoop_version(spark: SparkSession) -> str:
    return spark.sparkContext._jvm.org.apache.hadoop.util.VersionInfo.getVersion()


def _s3a_problem(spark: SparkSession) -> str | None:
    jvm, hadoop = spark.sparkContext._jvm, hadoop_version(spark)
    major_minor = tuple(int(part) for part in re.findall(r"\d+", hadoop)[:2])
    sdk = AWS_SDK_V2_CLIENT if major_minor >= (3, 4) else AWS_SDK_V1_CLIENT
    missing = [name for name in (S3A_FILESYSTEM, sdk) if not _class_loadable(jvm, name)]
    if not missing:
        return None
    jars = os.path.join(os.environ.get("SPARK_HOME") or os.path.dirname(pyspark.__file__), "jars")
    return (f"Spark cannot reach it: the hadoop-aws JAR and the AWS SDK bundle it needs are not on its classpath "
            f"({', '.join(missing)} cannot be loaded). Add them for this Spark's Hadoop {hadoop}: spark-submit "
            f"--packages org.apache.hadoop:hadoop-aws:{hadoop} (Maven brings the SDK bundle), or both JARs in {jars}")


# The tag of the commits being made (commits_tagged), read by every commit (all delta-rs's).
_COMMIT_TAG: ContextVar[str | None] = ContextVar("ackscope_commit_tag", default=None)


@contextmanager
def commits_tagged(tag: str) -> Iterator[None]:
    """Every Delta commit made meanwhile carries `tag` (provisional.py: the run id) as its
    `userMetadata` (table_files.commit_properties)."""
    token = _COMMIT_TAG.set(tag)
    try:
        yield
    finally:
        _COMMIT_TAG.reset(token)


def commit_tag() -> str | None:
    """The tag the commits made now carry (commits_tagged), None outside a run."""
    return _COMMIT_TAG.get()


def get_spark(master: str | None = "local[*]", app_name: str = "ackscope", driver_memory: str | None = None,
              extra_java_options: str = "", class_archive: bool = True) -> SparkSession:
    """The session for a job on `master` (None: resolved_master's); `driver_memory` (e.g. "8g"),
    `extra_java_options` and `class_archive` (a local driver maps the CDS archive of Spark's
    classes, if one was made: jvm_archive.py) count only if this call starts the driver JVM."""
    master = resolved_master(master)
    conf = SparkConf().setMaster(master).setAppName(app_name).setAll(list(_SESSION_CONF.items()))
    cores = _local_cores(master)
    if cores is not None:
        # 200 shuffle partitions of a few KB each dominate small local runs; two per core keep
        # every core busy.
        conf.set("spark.sql.shuffle.partitions", str(2 * cores))
        # Local runs are batch jobs and tests, often several at once: no UI, no fight over port 4040.
        conf.set("spark.ui.enabled", "false")
        # Local Python workers (grouped Arrow functions) need this interpreter's packages: pyarrow,
        # analyzer. PySpark reads the variable when the context starts; a cluster sets its own.
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    if driver_memory:
        conf.set("spark.driver.memory", driver_memory)
    # Spark's log lines go to a file, not the terminal (counts only if this call starts the driver).
    java_options = [conf.get("spark.driver.extraJavaOptions", ""), f"-Dlog4j2.configurationFile={LOG_CONFIG.as_uri()}",
                    f"-Dackscope.spark.log={spark_log_path()}", extra_java_options]
    if cores is not None and class_archive:
        java_options.append(jvm_archive.java_options())
    conf.set("spark.driver.extraJavaOptions", " ".join(option for option in java_options if option))
    if _delta_jars_in_driver(conf):
        conf.set("spark.sql.extensions", DELTA_EXTENSION).set("spark.sql.catalog.spark_catalog", DELTA_CATALOG)
    spark = SparkSession.builder.config(conf=conf).getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark


class DriverDidNotStart(RuntimeError):
    """Spark's driver JVM exited before it could serve this process."""


def _start_driver(conf: SparkConf) -> None:
    """Starts the driver JVM `conf` describes, unless this process has one already (or runs under
    spark-submit, which started it). As PySpark does, but with the JVM's standard error appended to
    Spark's log: Spark's launcher has the JVM load an incubator module, which the JVM announces on
    stderr before any logging starts. A JVM that cannot start says why there too: that is raised."""
    if SparkContext._gateway is not None or "PYSPARK_GATEWAY_PORT" in os.environ:
        SparkContext._ensure_initialized(conf=conf)
        return
    path = spark_log_path()
    with open(path, "ab") as log:
        start = log.tell()
        try:
            gateway = launch_gateway(conf, popen_kwargs={"stderr": log})
        except PySparkRuntimeError as exc:
            raise DriverDidNotStart(f"Spark's driver did not start: {_text_since(path, start)} (Spark's log: {path})") \
                from exc
    SparkContext._ensure_initialized(gateway=gateway, conf=conf)


def _text_since(path: str, offset: int, limit: int = 2000) -> str:
    """What a file gained after `offset` (its last `limit` characters), on one line."""
    with open(path, "rb") as file:
        file.seek(offset)
        text = file.read().decode(errors="replace")
    return " ".join(text[-limit:].split()) or "it said nothing"


def delta_mode(spark: SparkSession, requested: str = "auto") -> str:
    """`native` or `bridge`: what `--delta-mode` asked for, or under `auto` the best this session can do."""
    if requested not in DELTA_MODES:
        raise ValueError(f"--delta-mode must be one of {', '.join(DELTA_MODES)}, not {requested!r}")
    if requested == "bridge":
        return "bridge"
    problem = _native_delta_problem(spark)
    if problem is None:
        return "native"
    if requested == "native":
        raise NativeDeltaUnavailable(
            f"--delta-mode native: {problem}. Add them (spark-submit --packages "
            f"io.delta:delta-spark_2.13:{version('delta-spark')}, or spark.jars) or use --delta-mode bridge, "
            f"which reads the same tables through delta-rs.")
    return "bridge"


def _native_delta_problem(spark: SparkSession) -> str | None:
    if not _class_loadable(spark.sparkContext._jvm, DELTA_EXTENSION):
        return f"the Delta Lake JARs are not on Spark's classpath ({DELTA_EXTENSION} cannot be loaded)"
    if DELTA_EXTENSION not in spark.conf.get("spark.sql.extensions", ""):
        return (f"the Delta Lake JARs are present but this session was built without "
                f"spark.sql.extensions={DELTA_EXTENSION}")
    return None


def _delta_jars_in_driver(conf: SparkConf) -> bool:
    """Are the Delta classes loadable in the driver this conf starts?

    Delta's session extension must be configured before the session exists, and only the driver
    JVM knows its final classpath (`--packages`, `spark.jars`, JARs in SPARK_HOME), so start that
    JVM first (PySpark reuses it for the session) and ask it."""
    _start_driver(conf)
    return _class_loadable(SparkContext._jvm, DELTA_EXTENSION)


def _class_loadable(jvm, name: str) -> bool:
    loader = jvm.java.lang.Thread.currentThread().getContextClassLoader()
    try:
        jvm.java.lang.Class.forName(name, False, loader)
    except Py4JJavaError as exc:
        if exc.java_exception.getClass().getName() == "java.lang.ClassNotFoundException":
            return False
        raise
    return True


def resolved_master(master: str | None) -> str:
    """The master a run uses: the one it names, else under spark-submit the one spark-submit was
    given (`spark-submit --master spark://... spark_jobs/job.py`: its driver JVM holds it), else
    local[*]."""
    if master is not None:
        return master
    if "PYSPARK_GATEWAY_PORT" in os.environ:
        SparkContext._ensure_initialized()
        submitted = SparkContext._jvm.java.lang.System.getProperty("spark.master")
        if submitted:
            return submitted
    return "local[*]"


def is_local(master: str) -> bool:
    """Does `master` run the tasks in the driver's process (local, local[N]) rather than on a cluster?"""
    return _local_cores(master) is not None


def _local_cores(master: str) -> int | None:
    """Threads of a local master (`local`, `local[4]`, `local[*]`, `local[4,2]`); None for a cluster."""
    match = re.fullmatch(r"local(?:\[(\*|\d+)(?:,\d+)?\])?", master)
    if match is None:
        return None
    threads = match.group(1)
    if threads is None:
        return 1
    if threads == "*":
        return os.cpu_count() or 1
    return int(threads)
