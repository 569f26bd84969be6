#!/usr/bin/env bash
# mypy over the whole distribution as it is imported.
#
# broker/ and operator/ are imported as sluice.broker and sluice.operator
# (setuptools package-dir), which mypy cannot follow. We build that layout
# from symlinks in a scratch directory and check it there; paths in mypy's
# output are relative to that directory (sluice/broker/x.py is broker/x.py).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/sluice"
for entry in "$root"/sluice/*; do
    ln -s "$entry" "$tmp/sluice/$(basename "$entry")"
done
ln -s "$root/broker" "$tmp/sluice/broker"
ln -s "$root/operator" "$tmp/sluice/operator"
cd "$tmp"
mypy --config-file "$root/pyproject.toml" -p sluice "$@"
