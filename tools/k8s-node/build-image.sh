#!/usr/bin/env bash
# Build the Sluice image (the repository's Dockerfile) without a registry or a Docker engine.
#
#   1. A minimal Debian base with python3, once: `mmdebstrap --variant=minbase` of the machine's
#      own Debian release from its own apt sources (python3, python3-venv, passwd for useradd,
#      ca-certificates), imported as localhost/sluice-base:<suite>. No registry is reachable from
#      the project's machines, so python:3.11-slim (the Dockerfile's default base) cannot be
#      pulled; Debian 12's python3 is the same 3.11.
#   2. The Dockerfile, built with podman (buildah underneath) and --build-arg BASE=that base, as
#      localhost/sluice:<chart appVersion>. The image carries the hash of its inputs as a label
#      (sluice.source-hash); when the image present has the hash of the current tree, nothing is
#      built. The same Dockerfile builds with `docker build` (docs/kubernetes.md).
#
# Prints the image reference on stdout; progress and the measured times on stderr.
# Environment: SLUICE_IMAGE (default localhost/sluice:<appVersion>), SLUICE_IMAGE_BASE (a base to
# use instead of building one, e.g. python:3.11-slim where a registry is reachable).
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
IMAGE="${SLUICE_IMAGE:-localhost/sluice:$version}"
suite="$(. /etc/os-release && echo "$VERSION_CODENAME")"
BASE="${SLUICE_IMAGE_BASE:-localhost/sluice-base:$suite}"

# The hash of everything the Dockerfile copies, plus the Dockerfile and the base's name.
hash="$(cd "$ROOT" && {
    echo "$BASE"
    find Dockerfile .dockerignore pyproject.toml setup.py README.md sluice broker operator -type f \
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

log "building $IMAGE from $ROOT/Dockerfile (base $BASE)"
# The machine's CA bundle goes in as the build secret the Dockerfile's pip step reads: where
# registries are reached through a TLS-intercepting proxy, its CA is there (and only there).
secret=()
ca="${SLUICE_IMAGE_CA_BUNDLE:-${PIP_CERT:-/etc/ssl/certs/ca-certificates.crt}}"
[[ -s "$ca" ]] && secret=(--secret "id=ca-bundle,src=$ca")
podman build --quiet --network=host --pull=never "${secret[@]}" \
    --build-arg "BASE=$BASE" --label "sluice.source-hash=$hash" \
    -t "$IMAGE" -f "$ROOT/Dockerfile" "$ROOT" >&2
podman image prune --force >/dev/null 2>&1 || true  # the previous build's now untagged image
log "built $IMAGE: $(podman image inspect --format '{{.Size}}' "$IMAGE" | awk '{printf "%d MB", $1/1e6}')"
echo "$IMAGE"
