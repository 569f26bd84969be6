"""Package discovery for the three source roots; everything else is in pyproject.toml.

``sluice`` lives in ``sluice/``, ``sluice.broker`` in ``broker/sluice_broker/`` and
``sluice.operator`` in ``operator/sluice_operator/`` (pyproject's ``package-dir``). setuptools'
``packages.find`` only sees the first, so each root is searched here and its packages prefixed:
new subpackages are picked up without a list to keep by hand.
"""

from setuptools import find_packages, setup

ROOTS = {"sluice": "sluice", "sluice.broker": "broker/sluice_broker", "sluice.operator": "operator/sluice_operator"}


def packages() -> list[str]:
    found: list[str] = []
    for name, path in ROOTS.items():
        found.append(name)
        found.extend(f"{name}.{sub}" for sub in find_packages(path))
    return found


setup(packages=packages())
