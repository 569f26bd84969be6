#!/usr/bin/env bash
# Pack the broker code of one commit as tests/data/sluice-<commit>-src.tgz, for
# tests/integration/test_rolling_upgrade.py: ``sluice`` with ``sluice.broker`` laid out as the installed
# package (broker/sluice_broker -> sluice/broker, pyproject's package-dir), so the test puts the
# extracted tree first on PYTHONPATH of the old brokers and needs no network, git history or build
# (the generated protobuf modules are committed; the dependencies are this environment's). Only what
# a broker imports: no operator, CLI, Spark or test support, no type stubs. Reproducible (sorted, fixed
# owner and mtime).
#
#     bash tests/data/make_old_source.sh d37a648
set -euo pipefail
commit="${1:?usage: make_old_source.sh COMMIT}"
root="$(cd "$(dirname "$0")/../.." && pwd)"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
git -C "$root" archive "$commit" sluice broker/sluice_broker | tar -x -C "$tmp"
mkdir "$tmp/stage"
mv "$tmp/sluice" "$tmp/stage/sluice"
mv "$tmp/broker/sluice_broker" "$tmp/stage/sluice/broker"
rm -rf "$tmp/stage/sluice/spark" "$tmp/stage/sluice/cli" "$tmp/stage/sluice/testing" \
    "$tmp/stage/sluice/__main__.py" "$tmp/stage/sluice/py.typed"
find "$tmp/stage" -name '*.pyi' -delete
tar --sort=name --owner=0 --group=0 --numeric-owner --mtime='2026-11-28 00:00Z' \
    -C "$tmp/stage" -czf "$root/tests/data/sluice-$(git -C "$root" rev-parse --short=7 "$commit")-src.tgz" sluice
