"""Fixtures the unit tests share.

``store``: a real metadata store (SQLite, the embedded default's backend) in the test's temporary
directory, closed afterwards. Tests that play several brokers on it register ClusterViews with
:func:`tests.support.views.registered_view`.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from sluice.metadata import open_store
from sluice.metadata.store import MetadataStore


@pytest.fixture
def store(tmp_path: Path) -> Iterator[MetadataStore]:
    s = open_store(str(tmp_path / "metadata.sqlite"))
    yield s
    s.close()
