#!/usr/bin/env bash
# Build Sluice's images without a registry or a Docker engine.
#
#   tools/k8s-node/build-image.sh [sluice]   the Sluice image (the repository's Dockerfile): brokers
#                                            and operator, localhost/sluice:<chart appVersion>
#   tools/k8s-node/build-image.sh spark      the Spark image (images/spark/Dockerfile): executor
#                                            pods of Spark jobs, localhost/sluice-spark-executor:<appVersion>
#
#   1. A minimal Debian base with python3, once: `mmdebstrap --variant=minbase` of the machine's
#      own Debian release from its own apt sources (python3, python3-venv, passwd for useradd,
#      ca-certificates), imported as localhost/sluice-base:<suite>. No registry is reachable from
#      the project's machines, so python:3.11-slim (the Dockerfiles' default base) cannot be
#      pulled; Debian 12's python3 is the same 3.11. Both images start from it.
#   2. The Dockerfile, built with podman (buildah underneath) and --build-arg BASE=that base. The
#      image carries the hash of its inputs as a label (sluice.source-hash); when the image present
#      has the hash of the current tree, nothing is built. The same Dockerfiles build with
#      `docker build` (docs/kubernetes.md, docs/spark.md).
#
# The Spark image holds the driver's pyspark release exactly (a Spark driver and its executors must
# be one release): SLUICE_PYSPARK_VERSION, else the pyspark of the python3 on PATH; it is part of
# the hash and the label sluice.pyspark-version.
#
# Prints the image reference on stdout; progress and the measured times on stderr.
# Environment: SLUICE_IMAGE / SLUICE_SPARK_IMAGE (default localhost/sluice:<appVersion>,
# localhost/sluice-spark-executor:<appVersion>), SLUICE_IMAGE_BASE (a base to use instead of building one,
# e.g. python:3.11-slim where a registry is reachable), SLUICE_PYSPARK_VERSION.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
HERE="$ROOT/tools/k8s-node"
export CONTAINERS_CONF="$HERE/containers.conf"
START=$(date +%s)
log() { printf '[build-image %4ds] %s\n' "$(( $(date +%s) - START ))" "$*" >&2; }

for tool in podman mmdebstrap; do
    command -v "$tool" >/dev/null || {
        echo "build-image: '$tool' is missing: apt-get install podman buildah mmdebstrap (see .ci/run)" >&2; exit 1; }
done

version="$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' "$ROOT/charts/sluice/Chart.yaml")"
suite="$(. /etc/os-release && echo "$VERSION_CODENAME")"
BASE="${SLUICE_IMAGE_BASE:-localhost/sluice-base:$suite}"
build_args=(--build-arg "BASE=$BASE")
labels=()
case "${1:-sluice}" in
    sluice)
        IMAGE="${SLUICE_IMAGE:-localhost/sluice:$version}"
        DOCKERFILE=Dockerfile ;;
    spark)
        IMAGE="${SLUICE_SPARK_IMAGE:-localhost/sluice-spark-executor:$version}"
        DOCKERFILE=images/spark/Dockerfile
        pyspark="${SLUICE_PYSPARK_VERSION:-$(python3 -c 'import pyspark; print(pyspark.__version__)' 2>/dev/null || true)}"
        [[ -n "$pyspark" ]] || {
            echo "build-image: the Spark image needs the driver's pyspark release: set SLUICE_PYSPARK_VERSION or put a python3 with pyspark on PATH" >&2
            exit 1; }
        build_args+=(--build-arg "PYSPARK_VERSION=$pyspark")
        labels+=(--label "sluice.pyspark-version=$pyspark") ;;
    *) echo "usage: $0 [sluice|spark]" >&2; exit 2 ;;
esac

# The hash of everything the Dockerfile copies, plus the Dockerfile (and, for the Spark image, its
# directory: the entrypoint), the build arguments and so the base's name.
if [[ "$DOCKERFILE" == Dockerfile ]]; then inputs=(Dockerfile); else inputs=("$(dirname "$DOCKERFILE")"); fi
hash="$(cd "$ROOT" && {
    echo "${build_args[*]}"
    find "${inputs[@]}" .dockerignore pyproject.toml setup.py README.md sluice broker operator -type f \
        -not -path '*/__pycache__/*' -not -name '*.pyc' -print0 | sort -z | xargs -0 sha256sum
} | sha256sum | cut -c1-16)"

if [[ "$(podman image inspect --format '{{index .Labels "sluice.source-hash"}}' "$IMAGE" 2>/dev/null)" == "$hash" ]]; then
    log "$IMAGE is current (source hash $hash)"
    echo "$IMAGE"
    exit 0
fi

if [[ -z "${SLUICE_IMAGE_BASE:-}" ]] && ! podman image exists "$BASE"; then
    log "building the base $BASE with mmdebstrap (Debian $suite, minbase + python3)"
    tmp="$(mktemp -d)"
    trap 'rm -rf "$tmp"' EXIT
    sources=/etc/apt/sources.list.d/debian.sources
    [[ -f "$sources" ]] || sources=/etc/apt/sources.list
    mmdebstrap --quiet --variant=minbase --include=python3,python3-venv,passwd,ca-certificates \
        --aptopt='Acquire::Retries "3"' \
        --customize-hook='rm -rf "$1"/var/cache/apt/* "$1"/var/lib/apt/lists/* "$1"/usr/share/doc/* "$1"/usr/share/man/*' \
        "$suite" "$tmp/base.tar" "$sources" >&2
    podman import --quiet --change 'CMD ["/bin/bash"]' "$tmp/base.tar" "$BASE" >/dev/null
    log "base built: $(podman image inspect --format '{{.Size}}' "$BASE" | awk '{printf "%d MB", $1/1e6}')"
fi

log "building $IMAGE from $ROOT/$DOCKERFILE (${build_args[*]})"
# The machine's CA bundle goes in as the build secret the Dockerfile's pip step reads: where
# registries are reached through a TLS-intercepting proxy, its CA is there (and only there).
secret=()
ca="${SLUICE_IMAGE_CA_BUNDLE:-${PIP_CERT:-/etc/ssl/certs/ca-certificates.crt}}"
[[ -s "$ca" ]] && secret=(--secret "id=ca-bundle,src=$ca")
podman build --quiet --network=host --pull=never "${secret[@]}" \
    "${build_args[@]}" "${labels[@]}" --label "sluice.source-hash=$hash" \
    -t "$IMAGE" -f "$ROOT/$DOCKERFILE" "$ROOT" >&2
podman image prune --force >/dev/null 2>&1 || true  # the previous build's now untagged image
log "built $IMAGE: $(podman image inspect --format '{{.Size}}' "$IMAGE" | awk '{printf "%d MB", $1/1e6}')"
echo "$IMAGE"
