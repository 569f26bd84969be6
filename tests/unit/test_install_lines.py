"""Every install line in the docs installs this project (issue 29, item 4).

The distribution is ``sluice-broker`` (pyproject's ``[project] name``); ``sluice`` on the Python
package index is an unrelated project, and ``sluice-broker`` is not published there. So a
``pip install`` in README.md and the other Markdown files installs from the repository: ``.``
(``-e .``) or the wheel built from it, with extras pyproject declares. Package names are
allowed only for other projects (``confluent-kafka``, ``opentelemetry-sdk``, ...).
"""

from __future__ import annotations

import os
import re
import shlex
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

import sluice

ROOT = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
NAME: str = PROJECT["name"]
EXTRAS: set[str] = set(PROJECT["optional-dependencies"])
# The wheel `python -m pip wheel --no-deps -w dist .` writes (a pure-Python wheel).
WHEEL = f"{re.sub(r'[-_.]+', '_', NAME).lower()}-{PROJECT['version']}-py3-none-any.whl"
SKIP_DIRS = {"build", "dist", "node_modules", "__pycache__"}


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def repository_files() -> Iterator[Path]:
    """The repository's files, without hidden folders (.git, .venv, caches) but .ci, and build output."""
    for folder, dirs, files in os.walk(ROOT):
        dirs[:] = sorted(
            d for d in dirs if d == ".ci" or not (d.startswith(".") or d in SKIP_DIRS or d.endswith(".egg-info"))
        )
        yield from (Path(folder) / f for f in sorted(files))


def markdown_files() -> list[Path]:
    return [p for p in repository_files() if p.suffix == ".md"]


def install_lines() -> list[tuple[str, str]]:
    """(file:line, the words after `pip install`) for every `pip install` in the Markdown files."""
    found = []
    for path in markdown_files():
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for match in re.finditer(r"pip install ([^`\n]*)", line):
                # Up to the end of the command: a comment, a pipe or the next command.
                words = re.split(r"\s+#|&&|;|\|", match.group(1))[0]
                found.append((f"{path.relative_to(ROOT)}:{number}", words))
    return found


def requirements(words: str) -> list[str]:
    """The requirement arguments of a pip install command line (options and their values dropped)."""
    out: list[str] = []
    tokens = shlex.split(words)
    skip_next = False
    for token in tokens:
        if skip_next:
            skip_next = False
        elif token in ("-e", "--editable"):
            continue  # its value is a requirement
        elif token in ("-r", "-c", "--requirement", "--constraint", "-i", "--index-url", "--extra-index-url"):
            skip_next = True
        elif not token.startswith("-"):
            out.append(token)
    return out


def extras_of(requirement: str) -> set[str]:
    match = re.search(r"\[([^\]]*)\]$", requirement)
    return {e.strip() for e in match.group(1).split(",")} if match else set()


def test_the_distribution_is_not_the_name_taken_on_the_index() -> None:
    assert normalize(NAME) != "sluice"
    assert NAME == "sluice-broker"  # the name the docs and error messages use; change them together


def test_the_package_version_is_the_distributions() -> None:
    assert sluice.__version__ == PROJECT["version"]


def test_the_docs_have_install_lines_to_check() -> None:
    # The extraction works: README's quick start and its wheel line are among them.
    lines = [words for where, words in install_lines() if where.startswith("README.md:")]
    assert "-e ." in [w.strip() for w in lines]
    assert any(WHEEL in w for w in lines), f"README.md names no wheel {WHEEL}"
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert f"`{NAME}`" in readme


@pytest.mark.parametrize(("where", "words"), install_lines(), ids=lambda v: str(v))
def test_every_install_line_installs_this_project_or_another_by_name(where: str, words: str) -> None:
    for req in requirements(words):
        if req == "." or req.startswith((".[", "./", "/", "dist/")) or ".whl" in req:
            if ".whl" in req:
                wheel = req.rsplit("/", 1)[-1].split("[", 1)[0]
                assert wheel == WHEEL, f"{where}: {req} is not the wheel this repository builds ({WHEEL})"
            unknown = extras_of(req) - EXTRAS
            assert not unknown, f"{where}: pyproject declares no extra {sorted(unknown)}"
            continue
        name = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", req)
        assert name, f"{where}: cannot read the requirement {req!r}"
        assert normalize(name.group(0)) not in ("sluice", normalize(NAME)), (
            f"{where}: `pip install {words.strip()}` asks the package index for {name.group(0)!r}, which is "
            f"another project or none: install `.` in a clone or the wheel ({WHEEL}) instead"
        )


def test_no_source_file_names_the_old_distribution() -> None:
    # Error messages, docstrings, scripts and Dockerfiles: no "sluice[extra]" requirement, no sluice-*.whl.
    old = re.compile(
        r"""(?<![\w./-])sluice\[(?:\w|,)+\]|/sluice-\*\.whl|\bpip (?:install|show) (?:-\S+ )*sluice\b(?![-_\w])"""
    )
    suffixes = {".py", ".sh", ".md", ".toml", ".yaml", ".yml", ".txt", ".cfg"}
    hits = []
    for path in repository_files():
        rel = path.relative_to(ROOT)
        if path == Path(__file__) or not (
            path.suffix in suffixes or path.name.startswith("Dockerfile") or rel.parts[0] == ".ci"
        ):
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            if old.search(line):
                hits.append(f"{rel}:{number}: {line.strip()}")
    assert not hits, "\n".join(hits)
