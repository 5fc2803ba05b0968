# The analysis: Java 17, Spark (from pyspark), the project with every pinned dependency. Runs
# `spark-submit /opt/ackscope/spark_jobs/analyze.py --lake ...` (a CronJob, the compose loop) or
# serves as the driver and executor image of a spark-operator ScheduledSparkApplication.
# Build from the repository root (not buildable on the project's build machines, which have no
# Docker; reviewed, not built, there):
#   docker build -f deploy/docker/analysis.Dockerfile -t ackscope-analysis:0.1.0 .
# With Maven access, native delta-spark instead of the delta-rs bridge: see docs/deployment.md
# (DELTA_PACKAGES below fetches the JARs at build time).
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
# Optional, needs Maven Central: e.g. --build-arg DELTA_PACKAGES=io.delta:delta-spark_2.13:4.4.1
# copies delta-spark and its dependencies into Spark's jars, and the jobs take the native path.
ARG DELTA_PACKAGES=""
RUN if [ -n "$DELTA_PACKAGES" ]; then \
        echo 'from pyspark.sql import SparkSession; SparkSession.builder.config("spark.jars.packages", "'"$DELTA_PACKAGES"'").config("spark.jars.ivy", "/tmp/ivy").getOrCreate().stop()' | python \
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
