#!/usr/bin/env bash
# End-to-end on a kind cluster, for anyone with Docker: create the cluster, build the image and
# load it into the nodes, install the chart, check that the release really produces and consumes,
# then run the Kubernetes test suite (tests/k8s) against that cluster instead of the suite's own
# test control plane.
#
# It cannot run on the project's development and CI machines (no Docker engine there); CI runs
# tests/k8s against the test control plane that tools/k8s-testenv/build.sh builds.
#
# Needs: docker (with a running engine), kind, kubectl, helm, and this repository installed in the
# Python environment that runs pytest (pip install -e '.[dev]').
#
#   tools/kind/e2e.sh              create (or reuse) the cluster "sluice" and run everything
#   tools/kind/e2e.sh --delete     ... and delete the cluster afterwards
# Environment: KIND_CLUSTER (default sluice), SLUICE_IMAGE (default sluice:<chart appVersion>),
# PYTEST_ARGS (extra pytest arguments, e.g. "-x -k helm").
set -euo pipefail
cd "$(dirname "$0")/../.."

CLUSTER="${KIND_CLUSTER:-sluice}"
APP_VERSION="$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' charts/sluice/Chart.yaml)"
IMAGE="${SLUICE_IMAGE:-sluice:$APP_VERSION}"
NAMESPACE=sluice
DELETE=0
[[ "${1:-}" == "--delete" ]] && DELETE=1

step() { printf '\n==> %s\n' "$*"; }
for tool in docker kind kubectl helm python; do
    command -v "$tool" >/dev/null || { echo "e2e: '$tool' is not on PATH" >&2; exit 1; }
done
docker info >/dev/null 2>&1 || { echo "e2e: no Docker engine answers (docker info failed)" >&2; exit 1; }

WORK="$(mktemp -d)"
cleanup() {
    rm -rf "$WORK"
    if (( DELETE )); then step "deleting kind cluster $CLUSTER"; kind delete cluster --name "$CLUSTER"; fi
}
trap cleanup EXIT
KUBECONFIG_FILE="$WORK/kubeconfig"

if kind get clusters 2>/dev/null | grep -qx "$CLUSTER"; then
    step "reusing kind cluster $CLUSTER"
else
    step "creating kind cluster $CLUSTER (tools/kind/kind-config.yaml)"
    kind create cluster --name "$CLUSTER" --config tools/kind/kind-config.yaml --wait 180s
fi
kind get kubeconfig --name "$CLUSTER" > "$KUBECONFIG_FILE"
export KUBECONFIG="$KUBECONFIG_FILE"

step "building image $IMAGE (Dockerfile) and loading it into the nodes"
docker build -t "$IMAGE" .
kind load docker-image "$IMAGE" --name "$CLUSTER"

step "installing the chart as release sluice in namespace $NAMESPACE"
helm upgrade --install sluice charts/sluice --namespace "$NAMESPACE" --create-namespace \
    --set image.repository="${IMAGE%:*}" --set image.tag="${IMAGE##*:}" --set image.pullPolicy=Never \
    --wait --timeout 10m
kubectl -n "$NAMESPACE" rollout status statefulset/sluice-broker --timeout 5m
kubectl -n "$NAMESPACE" get pods,coordinators -o wide

step "producing and consuming through the client Service, from a pod in the cluster"
kubectl -n "$NAMESPACE" apply -f - <<'YAML'
apiVersion: sluice.dev/v1alpha1
kind: Topic
metadata:
  name: e2e-smoke
spec:
  partitions: 3
  replicationFactor: 3
YAML
kubectl -n "$NAMESPACE" wait --for=condition=Ready topic/e2e-smoke --timeout 120s
# The chart's default client listener: TLS, ServiceAccount tokens (audience sluice), ACLs.
kubectl -n "$NAMESPACE" create serviceaccount e2e-client --dry-run=client -o yaml | kubectl apply -f -
kubectl -n "$NAMESPACE" apply -f - <<'YAML'
apiVersion: sluice.dev/v1alpha1
kind: SluiceUser
metadata:
  name: e2e-client
spec:
  authentication: {type: serviceAccount, serviceAccount: {name: e2e-client}}
  authorization:
    acls:
      - resource: {type: topic, name: e2e-smoke}
        operations: [Read, Write]
      - resource: {type: transactionalId, name: e2e-smoke}
        operations: [Write]
      - resource: {type: group, name: "*"}
        operations: [Read]
YAML
kubectl -n "$NAMESPACE" wait --for=jsonpath='{.status.conditions[?(@.type=="Ready")].status}'=True \
    sluiceuser/e2e-client --timeout 120s
overrides='{"spec": {"serviceAccountName": "e2e-client",
  "volumes": [
    {"name": "token", "projected": {"sources": [{"serviceAccountToken": {"audience": "sluice", "path": "token"}}]}},
    {"name": "ca", "secret": {"secretName": "sluice-cluster-ca-cert", "items": [{"key": "ca.crt", "path": "ca.crt"}]}}],
  "containers": [{"name": "client", "image": "'"$IMAGE"'", "imagePullPolicy": "Never", "stdin": true,
    "env": [{"name": "SLUICE_BOOTSTRAP_SERVERS", "value": "sluice:9092"}],
    "volumeMounts": [{"name": "token", "mountPath": "/var/run/secrets/sluice"}, {"name": "ca", "mountPath": "/etc/sluice/ca"}],
    "command": ["sh", "-c", "printf \"security.protocol=SASL_SSL\\nssl.ca.location=/etc/sluice/ca/ca.crt\\nsasl.oauthbearer.token.file=/var/run/secrets/sluice/token\\n\" > /tmp/client.properties && seq 1 100 | sluice produce e2e-smoke --transactional-id e2e-smoke --command-config /tmp/client.properties && sluice consume e2e-smoke --from-beginning --max-messages 100 --command-config /tmp/client.properties | sort -n | uniq | wc -l"]}]}}'
out="$(kubectl -n "$NAMESPACE" run "e2e-client-$RANDOM" --rm -i --restart=Never --quiet \
    --image="$IMAGE" --overrides="$overrides")"
echo "read back $out distinct records of 100"
[[ "$(echo "$out" | tail -n 1 | tr -d ' ')" == "100" ]] || { echo "e2e: smoke produce/consume failed" >&2; exit 1; }

step "running tests/k8s against the kind cluster"
SLUICE_TEST_KUBECONFIG="$KUBECONFIG_FILE" python -m pytest tests/k8s ${PYTEST_ARGS:-}
