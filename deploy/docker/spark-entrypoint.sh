#!/bin/bash
# Entry point of the analysis image. Spark on Kubernetes (spark-operator's driver and executor pods)
# starts the image with `driver ARGS...` or `executor`, and passes what it needs in environment
# variables (SPARK_DRIVER_BIND_ADDRESS; SPARK_DRIVER_URL, SPARK_EXECUTOR_* and the like), as the
# images Spark publishes expect. Anything else (`spark-submit ...` in the CronJob, a shell) runs as it is.
set -euo pipefail

spark_home="$(python -c 'import os, pyspark; print(os.path.dirname(pyspark.__file__))')"

case "${1:-}" in
  driver)
    shift
    exec spark-submit --deploy-mode client \
      --conf "spark.driver.bindAddress=${SPARK_DRIVER_BIND_ADDRESS}" \
      --conf "spark.executorEnv.SPARK_DRIVER_POD_IP=${SPARK_DRIVER_BIND_ADDRESS}" \
      "$@"
    ;;
  executor)
    # Extra JVM options arrive as SPARK_JAVA_OPT_0, SPARK_JAVA_OPT_1, ...
    java_options=()
    while IFS='=' read -r name _; do
      java_options+=("${!name}")
    done < <(env | grep -E '^SPARK_JAVA_OPT_[0-9]+=' | sort -t_ -k4 -n)
    exec "${JAVA_HOME}/bin/java" "${java_options[@]}" \
      -Xms"${SPARK_EXECUTOR_MEMORY}" -Xmx"${SPARK_EXECUTOR_MEMORY}" \
      -cp "${spark_home}/jars/*:${PWD}" \
      org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBackend \
      --driver-url "${SPARK_DRIVER_URL}" --executor-id "${SPARK_EXECUTOR_ID}" \
      --cores "${SPARK_EXECUTOR_CORES}" --app-id "${SPARK_APPLICATION_ID}" \
      --hostname "${SPARK_EXECUTOR_POD_IP}" --resourceProfileId "${SPARK_RESOURCE_PROFILE_ID}" \
      --podName "${SPARK_EXECUTOR_POD_NAME}"
    ;;
  *)
    exec "$@"
    ;;
esac
