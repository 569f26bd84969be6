"""The MetadataStore contract (tests/metadata_contract.py) on the SQLite store."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from sluice.metadata.local import SqliteMetadataStore
from sluice.metadata.store import MetadataStore
from tests.metadata_contract import CHECKS


@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__.removeprefix("check_"))
def test_sqlite_store_contract(check: Callable[[Callable[[], MetadataStore]], None], tmp_path: Path) -> None:
    path = str(tmp_path / "metadata.sqlite")
    check(lambda: SqliteMetadataStore(path))
