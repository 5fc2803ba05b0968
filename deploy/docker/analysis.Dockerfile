# The analysis: Java 17, Spark (from pyspark), the project with every pinned dependency. Runs
# `ackscope analyze --lake ...` (the CronJob, analysis-every's Deployment, the compose service) or
# serves as the driver and executor image of a spark-operator ScheduledSparkApplication
# (`spark-submit /opt/ackscope/spark_jobs/job.py`).
# Build from the repository root (not buildable on the project's build machines, which have no
# Docker; reviewed, not built, there):
#   docker build -f deploy/docker/analysis.Dockerfile -t ackscope-analysis:0.1.0 .
# With Maven access, SPARK_PACKAGES below adds Spark packages at build time: hadoop-aws for a lake on
# S3, delta-spark for the native Delta path (docs/deployment.md).
FROM python:3.11-slim-bookworm
RUN apt-get update && apt-get install -y --no-install-recommends openjdk-17-jre-headless procps \
        gcc libc6-dev tini \
    && rm -rf /var/lib/apt/lists/*
ENV JAVA_HOME=/usr/lib/jvm/java-17-openjdk-amd64
WORKDIR /opt/ackscope
COPY pyproject.toml setup.py README.md ./
COPY analyzer analyzer
COPY spark_jobs spark_jobs
COPY dashboards dashboards
# pyproject.toml's pins, the same the tests run with; pyspark brings Spark and spark-submit.
RUN python -m venv /opt/venv \
    && /opt/venv/bin/pip install --no-cache-dir . \
    && apt-get purge -y gcc libc6-dev && apt-get autoremove -y
ENV PATH=/opt/venv/bin:$PATH PYSPARK_PYTHON=/opt/venv/bin/python PYSPARK_DRIVER_PYTHON=/opt/venv/bin/python
# Optional, needs Maven Central: Maven coordinates, comma-separated, resolved with their dependencies
# as spark-submit --packages does and copied into Spark's jars, so every run has them. For a lake on
# S3, Hadoop's s3a connector of the Hadoop pyspark ships (its jars/hadoop-client-api-*.jar):
#   --build-arg SPARK_PACKAGES=org.apache.hadoop:hadoop-aws:3.5.0   (it brings the AWS SDK bundle)
# for native delta-spark: io.delta:delta-spark_2.13:4.4.1; for both, the two joined by a comma.
# DELTA_PACKAGES is its former name, still read when SPARK_PACKAGES is not given.
ARG SPARK_PACKAGES=""
ARG DELTA_PACKAGES=""
RUN packages="${SPARK_PACKAGES:-$DELTA_PACKAGES}"; \
    if [ -n "$packages" ]; then \
        echo 'from pyspark.sql import SparkSession; SparkSession.builder.config("spark.jars.packages", "'"$packages"'").config("spark.jars.ivy", "/tmp/ivy").getOrCreate().stop()' | python \
        && cp /tmp/ivy/jars/*.jar "$(python -c 'import pyspark, os; print(os.path.join(os.path.dirname(pyspark.__file__), "jars"))')" \
        && rm -rf /tmp/ivy; \
    fi
COPY deploy/docker/spark-entrypoint.sh /opt/ackscope/spark-entrypoint.sh
RUN groupadd --gid 10001 ackscope \
    && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /tmp --shell /usr/sbin/nologin ackscope \
    && mkdir /lake && chown 10001:10001 /lake
USER 10001:10001
ENV HOME=/tmp
VOLUME /lake
# tini reaps the JVM's and Python workers' children; the entry point starts Spark-on-Kubernetes
# drivers and executors (spark-operator) and passes any other command through.
ENTRYPOINT ["tini", "--", "/opt/ackscope/spark-entrypoint.sh"]
CMD ["spark-submit", "--help"]
