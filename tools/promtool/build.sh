#!/usr/bin/env bash
# Build promtool (Prometheus's rule checker) from the Go module proxy and cache it.
#
# `promtool check rules` is how the chart's PrometheusRule is checked (tests/k8s/test_monitoring.py):
# the same parser and PromQL validation Prometheus itself runs on a rule file. It is built, like
# the Kubernetes test binaries (tools/k8s-testenv/build.sh), with `go install` from the module
# proxy, not taken from a distribution package: Debian's prometheus package is years older than
# the rule syntax Prometheus 3 accepts.
#
# Cache: ${SLUICE_K8S_CACHE:-$HOME/.cache/sluice-k8s}/bin/promtool with a stamp file
# (.stamp-promtool) holding the key it was built from (module version and Go version); a binary
# whose stamp matches is kept (a warm run takes a fraction of a second). It is built in a scratch
# directory and moved in, so a promtool present in bin/ is always complete.
#
# Usage: tools/promtool/build.sh   build it if missing or stale, print its path
# Environment: SLUICE_K8S_CACHE (cache root), PROMETHEUS_MODULE_VERSION (default below: the Go
# module version of a Prometheus release, v0.3XX.Y for Prometheus 3.XX.Y), GOMODCACHE/GOCACHE.
set -euo pipefail

CACHE="${SLUICE_K8S_CACHE:-$HOME/.cache/sluice-k8s}"
BIN="$CACHE/bin"
VERSION="${PROMETHEUS_MODULE_VERSION:-v0.316.0}"
export GOTOOLCHAIN=local GOFLAGS="${GOFLAGS:-} -buildvcs=false" CGO_ENABLED=0

command -v go >/dev/null || { echo "promtool: 'go' is not on PATH (Go 1.26+ is needed)" >&2; exit 1; }
KEY="prometheus=$VERSION tags=remove_all_sd $(go env GOVERSION)"
mkdir -p "$BIN"
if [[ -x "$BIN/promtool" && -f "$BIN/.stamp-promtool" && "$(cat "$BIN/.stamp-promtool")" == "$KEY" ]]; then
    echo "$BIN/promtool"
    exit 0
fi
SCRATCH="$(mktemp -d "$CACHE/promtool.XXXXXX")"
trap 'rm -rf "$SCRATCH"' EXIT
echo "promtool: building github.com/prometheus/prometheus/cmd/promtool@$VERSION (a few minutes)" >&2
# remove_all_sd: leave out every service-discovery plugin (AWS, Azure, GCE, Kubernetes, ...).
# promtool checks and tests rules without them, and they are most of the build: with the tag the
# build took 2 min 43 s of CPU (4 min 11 s wall on a loaded 2-core machine, modules already
# downloaded); the build without it took about 38 min wall (modules downloaded too, load 10-16).
GOBIN="$SCRATCH" go install -trimpath -tags remove_all_sd -ldflags "-s -w" "github.com/prometheus/prometheus/cmd/promtool@$VERSION"
mv -f "$SCRATCH/promtool" "$BIN/promtool"
echo "$KEY" > "$BIN/.stamp-promtool"
echo "$BIN/promtool"
