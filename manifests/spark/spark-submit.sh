#!/usr/bin/env bash
# The example job of manifests/spark/sparkapplication.yaml, submitted with spark-submit straight to
# the Kubernetes API server (no operator). Same image, service account, arguments and settings.
#
#   K8S_API=https://my-cluster-api:6443 IMAGE=registry.example.com/sluice-spark:0.1.0 \
#     bash manifests/spark/spark-submit.sh
#
# spark-submit must be Spark's own (the version in the image), from a machine that can reach the
# API server with a kubeconfig allowed to create pods in the namespace.
set -euo pipefail
: "${K8S_API:?set K8S_API to the API server URL, e.g. https://10.0.0.1:6443}"
IMAGE="${IMAGE:-registry.example.com/sluice-spark:0.1.0}"
NAMESPACE="${NAMESPACE:-sluice-jobs}"
BOOTSTRAP="${BOOTSTRAP:-sluice.sluice.svc.cluster.local:9092}"

exec spark-submit \
  --master "k8s://${K8S_API}" \
  --deploy-mode cluster \
  --name order-totals \
  --conf spark.kubernetes.namespace="${NAMESPACE}" \
  --conf spark.kubernetes.container.image="${IMAGE}" \
  --conf spark.kubernetes.container.image.pullPolicy=IfNotPresent \
  --conf spark.kubernetes.authenticate.driver.serviceAccountName=spark \
  --conf spark.kubernetes.driverEnv.PYSPARK_PYTHON=/opt/sluice-venv/bin/python \
  --conf spark.executorEnv.PYSPARK_PYTHON=/opt/sluice-venv/bin/python \
  --conf spark.kubernetes.driver.label.app.kubernetes.io/name=order-totals \
  --conf spark.kubernetes.executor.label.app.kubernetes.io/name=order-totals \
  --conf spark.executor.instances=2 \
  --conf spark.executor.cores=1 \
  --conf spark.executor.memory=1g \
  --conf spark.driver.cores=1 \
  --conf spark.driver.memory=1g \
  --conf spark.sql.shuffle.partitions=6 \
  --conf spark.task.maxFailures=4 \
  local:///opt/sluice/jobs/order_totals.py \
  --bootstrap-servers "${BOOTSTRAP}" --input orders --output order-totals
