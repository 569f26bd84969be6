"""The data volume's low-space warning: the tracker's threshold and hysteresis, the config key's bounds,
and a real reading of a real (tmpfs) volume."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from sluice.broker.config import BrokerConfig, ConfigError
from sluice.broker.log.dir_space import LowSpaceTracker, SpaceReading, read_space
from sluice.broker.log.storage import RocksStorage
from sluice.testing.cluster import replication_defaults

GIB = 1 << 30


def at(percent_free: float) -> SpaceReading:
    return SpaceReading(int(GIB * percent_free / 100), GIB)


def test_low_below_the_threshold_and_not_low_only_a_point_above_it() -> None:
    tracker = LowSpaceTracker(5)
    assert tracker.observe(at(50)) is None
    assert tracker.observe(at(4.9)) is True
    assert tracker.observe(at(3)) is None  # still low: no new change
    assert tracker.observe(at(5.5)) is None  # inside the hysteresis: no flapping
    assert tracker.observe(at(6.1)) is False
    assert tracker.observe(at(7)) is None


def test_zero_turns_the_warning_off_and_the_key_is_bounded(tmp_path: Path) -> None:
    assert LowSpaceTracker(0).observe(at(0)) is None
    with pytest.raises(ConfigError, match=r"log.dir.free.space.warn.percent must be in \[0, 100\]"):
        BrokerConfig.build(0, "h", 1, str(tmp_path), "m", {"log.dir.free.space.warn.percent": "101"})
    with pytest.raises(ValueError, match="must be in"):
        LowSpaceTracker(-1)


def test_a_real_volume_reading(tmp_path: Path) -> None:
    volume = tmp_path / "v"
    volume.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(volume)], check=True)
    try:
        empty = read_space(str(volume))
        assert empty.size_bytes == 4 << 20 and empty.free_percent > 99
        (volume / "half").write_bytes(b"\0" * (2 << 20))
        half = read_space(str(volume))
        assert 45 < half.free_percent < 55
        assert "MiB free of 4.0 MiB" in half.describe()
    finally:
        subprocess.run(["umount", "-l", str(volume)], check=False)


def test_the_background_write_rate_is_a_broker_setting_with_a_floor(tmp_path: Path) -> None:
    config = BrokerConfig.build(
        0, "h", 1, str(tmp_path), "m", {"log.background.write.max.bytes.per.second": "67108864"}
    )
    assert config.int("log.background.write.max.bytes.per.second") == 64 * 1024 * 1024
    with pytest.raises(ConfigError, match=r"at least 1048576"):
        BrokerConfig.build(0, "h", 1, str(tmp_path), "m", {"log.background.write.max.bytes.per.second": "0"})
    with pytest.raises(ValueError, match="must be positive"):
        RocksStorage(str(tmp_path / "rocksdb"), 0)
    assert replication_defaults(1) == {}  # one broker alone keeps the broker default (192 MiB/s)
    assert replication_defaults(3)["log.background.write.max.bytes.per.second"] == str(64 * 1024 * 1024)
