#!/usr/bin/env bash
# Static checks: generated code (protobuf, Kafka's messages) is current, the chart's CRDs equal manifests/crds, ruff (lint and format), mypy,
# import-linter contracts.
#
# broker/ and operator/ are imported as sluice.broker and sluice.operator
# (setuptools package-dir), which neither mypy nor import-linter can follow.
# We build that layout from symlinks in a scratch directory and run both
# there; paths in their output are relative to it (sluice/broker/x.py is
# broker/sluice_broker/x.py in the repository).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
python scripts/gen_proto.py --check
# Kafka's messages: needs kafka-clients' jar (~/.m2, else fetched with mvn, about 5 MB once)
python scripts/gen_kafka_messages.py --check
python scripts/sync_chart_crds.py --check
ruff check .
ruff format --check .
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/sluice"
for entry in "$root"/sluice/*; do
    ln -s "$entry" "$tmp/sluice/$(basename "$entry")"
done
ln -s "$root/broker/sluice_broker" "$tmp/sluice/broker"
ln -s "$root/operator/sluice_operator" "$tmp/sluice/operator"
(cd "$tmp" && mypy --config-file "$root/pyproject.toml" -p sluice)
# Test support code that is not in the package (the Kubernetes test control plane, the in-process
# broker harness) is typed too, in the same layout (it imports sluice.broker).
ln -s "$root/tests" "$tmp/tests"
(cd "$tmp" && mypy --config-file "$root/pyproject.toml" tests/support)
(cd "$tmp" && PYTHONPATH="$tmp" lint-imports --config "$root/pyproject.toml")
echo "static checks passed"
