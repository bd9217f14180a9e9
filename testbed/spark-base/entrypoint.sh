#!/bin/bash
# The entrypoint of the testbed's stand-in for Spark's official image (apache/spark, built here
# from Debian's packages and the pinned pyspark wheel: nothing can be pulled). It keeps the contract
# Spark on Kubernetes relies on:
#   driver ARGS...    the driver pod: spark-submit in client mode, bound to the pod's address
#   executor          an executor pod: KubernetesExecutorBackend, configured by SPARK_* variables
#                     that the driver sets on the pod
#   anything else     run as given (spark-submit for the Job, python for tools)
set -eo pipefail

SPARK_HOME=${SPARK_HOME:-/opt/spark}
SPARK_CLASSPATH="${SPARK_CLASSPATH:+$SPARK_CLASSPATH:}$SPARK_HOME/jars/*"
# the driver passes the executors' JVM options as SPARK_JAVA_OPT_0, _1, ... (in order)
java_opts=()
while IFS='=' read -r name _; do
    java_opts+=("${!name}")
done < <(env | grep -o '^SPARK_JAVA_OPT_[0-9]*=' | sort -t_ -k4 -n)

case "${1:-}" in
    driver)
        shift
        exec "$SPARK_HOME/bin/spark-submit" \
            --conf "spark.driver.bindAddress=$SPARK_DRIVER_BIND_ADDRESS" \
            --conf "spark.executorEnv.SPARK_DRIVER_POD_IP=$SPARK_DRIVER_BIND_ADDRESS" \
            --deploy-mode client "$@"
        ;;
    executor)
        shift
        exec java "${java_opts[@]}" -Xms"$SPARK_EXECUTOR_MEMORY" -Xmx"$SPARK_EXECUTOR_MEMORY" \
            -cp "$SPARK_CLASSPATH" org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBackend \
            --driver-url "$SPARK_DRIVER_URL" --executor-id "$SPARK_EXECUTOR_ID" --cores "$SPARK_EXECUTOR_CORES" \
            --app-id "$SPARK_APPLICATION_ID" --hostname "$SPARK_EXECUTOR_POD_IP" \
            --resourceProfileId "$SPARK_RESOURCE_PROFILE_ID" --podName "$SPARK_EXECUTOR_POD_NAME"
        ;;
    *)
        exec "$@"
        ;;
esac
