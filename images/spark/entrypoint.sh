#!/bin/bash
# Entrypoint of the Sluice Spark image (images/spark/Dockerfile).
#
#   executor        what Spark's Kubernetes scheduler backend puts in the args of every executor
#                   pod it creates: run Spark's Kubernetes executor backend with the settings the
#                   pod's environment carries (below)
#   --help          this text
#   anything else   run as given, e.g. `python3 job.py`: a client-mode driver in a pod
#
# The executor pod's environment, filled in by Spark's driver:
#   SPARK_DRIVER_URL         spark://CoarseGrainedScheduler@DRIVER_HOST:PORT, where to register
#   SPARK_EXECUTOR_ID        1, 2, ... (the pod's name ends with -exec-ID)
#   SPARK_EXECUTOR_CORES, SPARK_EXECUTOR_MEMORY (the JVM heap, e.g. 512m)
#   SPARK_APPLICATION_ID, SPARK_RESOURCE_PROFILE_ID
#   SPARK_EXECUTOR_POD_IP    status.podIP: the address the executor announces (on the host
#                            network, the node's own)
#   SPARK_EXECUTOR_POD_NAME  metadata.name
#   SPARK_JAVA_OPT_0, _1 ... JVM options, in index order (spark.executor.extraJavaOptions, the
#                            settings an executor needs before it reaches the driver)
#   SPARK_CONF_DIR           the executor ConfigMap's mount (log4j2 settings), optional
#   SPARK_CLASSPATH          spark.executor.extraClassPath, optional
# SPARK_HOME and JAVA_HOME come from the image.
set -euo pipefail

usage() { sed -n '2,/^set /{/^set /d;s/^# \{0,1\}//;p}' "$0"; }

executor() {
    local v missing=()
    for v in SPARK_DRIVER_URL SPARK_EXECUTOR_ID SPARK_EXECUTOR_CORES SPARK_EXECUTOR_MEMORY \
             SPARK_APPLICATION_ID SPARK_EXECUTOR_POD_IP SPARK_EXECUTOR_POD_NAME; do
        [[ -n "${!v:-}" ]] || missing+=("$v")
    done
    if (( ${#missing[@]} > 0 )); then
        echo "sluice-spark-entrypoint: executor: ${missing[*]} not set (Spark's driver sets them in the executor pods it creates)" >&2
        exit 64
    fi
    # The JVM options, in their index order (Spark numbers them from 0 without gaps).
    local opts=() i=0 name
    while name="SPARK_JAVA_OPT_$i" && [[ -n "${!name+set}" ]]; do
        opts+=("${!name}")
        i=$((i + 1))
    done
    # The ConfigMap's directory first (its log4j2 file wins over the one inside Spark's jars).
    local classpath="$SPARK_HOME/jars/*"
    if [[ -n "${SPARK_CONF_DIR:-}" ]]; then classpath="$SPARK_CONF_DIR:$classpath"; fi
    if [[ -n "${SPARK_CLASSPATH:-}" ]]; then classpath="$classpath:$SPARK_CLASSPATH"; fi
    exec "$JAVA_HOME/bin/java" "${opts[@]}" \
        "-Xms$SPARK_EXECUTOR_MEMORY" "-Xmx$SPARK_EXECUTOR_MEMORY" \
        -cp "$classpath" org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBackend \
        --driver-url "$SPARK_DRIVER_URL" \
        --executor-id "$SPARK_EXECUTOR_ID" \
        --cores "$SPARK_EXECUTOR_CORES" \
        --app-id "$SPARK_APPLICATION_ID" \
        --hostname "$SPARK_EXECUTOR_POD_IP" \
        --resourceProfileId "${SPARK_RESOURCE_PROFILE_ID:-0}" \
        --podName "$SPARK_EXECUTOR_POD_NAME" \
        "$@"
}

case "${1:-}" in
    executor) shift; executor "$@" ;;
    --help|-h|"") usage ;;
    *) exec "$@" ;;
esac
