#!/usr/bin/env bash
# The example job (examples/spark/order_totals.py) in client mode: the driver runs here, the
# executors are pods that Spark's Kubernetes scheduler backend creates with the image of
# images/spark/Dockerfile. This is how the project's single-node cluster runs Spark
# (tests/node/test_kafka_and_spark_on_a_node.py does the same from Python), and it works on any
# cluster whose pods can reach the driver at DRIVER_HOST.
#
#   K8S_API=https://10.0.0.1:6443 DRIVER_HOST=10.0.0.5 IMAGE=registry.example.com/sluice-spark-executor:0.1.0 \
#   BOOTSTRAP=10.0.0.7:9092 TOKEN_FILE=token CA_FILE=ca.crt bash manifests/spark/spark-submit-client.sh
#
# Needs: spark-submit from the same pyspark release as the image (the spark extra of sluice-broker
# installs it: pip install -e '.[spark]' in a clone; build the image with --build-arg
# PYSPARK_VERSION=<that release>), python3 on PATH with sluice installed (the executors run the
# driver's PYSPARK_PYTHON, "python3", which the image also has), manifests/spark/rbac.yaml
# applied, and the credentials of its service account: TOKEN_FILE (kubectl -n sluice-jobs create
# token spark > token) and CA_FILE (the API server's CA).
#
# HOST_NETWORK=true (the default) adds the executor pod template with the host network, for
# clusters without a pod network (the brokers then also run with the chart's hostNetwork.enabled,
# and BOOTSTRAP is a node's address). With a pod network set HOST_NETWORK=false; the driver's
# host must then be reachable from the pods (a node, or a pod: DRIVER_HOST=$POD_IP).
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
: "${K8S_API:?set K8S_API to the API server URL, e.g. https://10.0.0.1:6443}"
: "${DRIVER_HOST:?set DRIVER_HOST to this machine's address as the executor pods reach it}"
: "${TOKEN_FILE:?set TOKEN_FILE to a token of the spark service account (manifests/spark/rbac.yaml)}"
: "${CA_FILE:?set CA_FILE to the API server's CA certificate}"
IMAGE="${IMAGE:-registry.example.com/sluice-spark-executor:0.1.0}"
NAMESPACE="${NAMESPACE:-sluice-jobs}"
BOOTSTRAP="${BOOTSTRAP:-sluice.sluice.svc.cluster.local:9092}"
template=()
if [[ "${HOST_NETWORK:-true}" == true ]]; then
    template=(--conf "spark.kubernetes.executor.podTemplateFile=$HERE/executor-pod-template-host-network.yaml")
fi

PYSPARK_PYTHON=python3 exec spark-submit \
  --master "k8s://${K8S_API}" \
  --deploy-mode client \
  --name order-totals \
  --conf spark.kubernetes.namespace="${NAMESPACE}" \
  --conf spark.kubernetes.container.image="${IMAGE}" \
  --conf spark.kubernetes.container.image.pullPolicy=IfNotPresent \
  --conf spark.kubernetes.authenticate.oauthTokenFile="${TOKEN_FILE}" \
  --conf spark.kubernetes.authenticate.caCertFile="${CA_FILE}" \
  "${template[@]}" \
  --conf spark.driver.host="${DRIVER_HOST}" \
  --conf spark.driver.bindAddress="${DRIVER_BIND_ADDRESS:-0.0.0.0}" \
  --conf spark.blockManager.port=0 \
  --conf spark.executor.instances=2 \
  --conf spark.executor.cores=1 \
  --conf spark.executor.memory=1g \
  --conf spark.sql.shuffle.partitions=6 \
  --conf spark.task.maxFailures=4 \
  "$HERE/../../examples/spark/order_totals.py" \
  --bootstrap-servers "${BOOTSTRAP}" --input orders --output order-totals
