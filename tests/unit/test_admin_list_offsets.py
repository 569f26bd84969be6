"""Admin.list_offsets refuses bad arguments before any request (a ValueError naming what is allowed)."""

from __future__ import annotations

import pytest

from sluice.client import Admin, TopicPartition


def test_bad_isolation_level_and_offset_spec_are_refused_up_front() -> None:
    admin = Admin(bootstrap_servers="127.0.0.1:1", request_timeout_ms=500)
    try:
        tp = TopicPartition("t", 0)
        with pytest.raises(ValueError, match="isolation_level must be one of"):
            admin.list_offsets({tp: Admin.LATEST}, isolation_level="read_dirty")
        with pytest.raises(ValueError, match="use EARLIEST, LATEST, MAX_TIMESTAMP or a timestamp"):
            admin.list_offsets({tp: -4})
    finally:
        admin.close()


def test_offset_specs_are_kafkas() -> None:
    assert (Admin.EARLIEST, Admin.LATEST, Admin.MAX_TIMESTAMP) == (-2, -1, -3)
