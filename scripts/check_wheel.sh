#!/usr/bin/env bash
# Build the wheel, install it (not editable) into a fresh venv and use it from a directory that
# is not the checkout: proof that the package-dir mapping (broker/sluice_broker -> sluice.broker,
# operator/sluice_operator -> sluice.operator) ships every module and that nothing leans on the
# source tree being on sys.path. With --demo it also runs `sluice demo --no-chaos` from there.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
# Built from a copy holding just what the Dockerfile copies into its image (so that set is
# checked too, and setuptools leaves no build/ folder in the checkout).
mkdir "$tmp/src"
cp -r "$root"/{pyproject.toml,setup.py,README.md,sluice,broker,operator} "$tmp/src/"
python -m pip wheel -q --no-deps -w "$tmp/dist" "$tmp/src"
python3 -m venv "$tmp/venv"
"$tmp/venv/bin/python" -m pip install -q "$tmp/dist"/sluice_broker-*.whl
cd "$tmp"
"$tmp/venv/bin/python" - <<'PY'
import importlib, pkgutil, operator, json
import sluice, sluice.broker, sluice.operator
assert "sluice_operator" not in (operator.__file__ or ""), operator.__file__
names = [m.name for pkg in (sluice,) for m in pkgutil.walk_packages(pkg.__path__, "sluice.")]
# Every module that needs only the base install imports from the wheel.
optional = ("sluice.spark", "sluice.operator.kopf_app", "sluice.operator.main", "sluice.operator.handlers",
            "sluice.operator.controller.kubernetes", "sluice.metadata.kubernetes")
for name in names:
    if not name.startswith(optional) and not name.endswith("__main__"):
        importlib.import_module(name)
for name in ("sluice.broker.log.storage", "sluice.broker.txn.coordinator", "sluice.operator.controller.local"):
    assert name in names, f"{name} is missing from the wheel"
print(f"wheel: {len(names)} modules found, the base ones import")
PY
"$tmp/venv/bin/sluice" --help > /dev/null
"$tmp/venv/bin/python" -m sluice --help > /dev/null
if [ "${1:-}" = "--demo" ]; then
    "$tmp/venv/bin/sluice" demo --no-chaos
fi
echo "wheel check passed"
