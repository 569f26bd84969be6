"""Topic configuration: every accepted key is read; Kafka keys without meaning here are refused by name."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from sluice import errors
from sluice.api.v1 import broker_pb2 as bpb
from sluice.api.v1 import records_pb2 as pb
from sluice.broker.cluster import ClusterView
from sluice.broker.config import (
    DEFAULTS,
    TOPIC_KEYS,
    UNSUPPORTED_BROKER_KEYS,
    UNSUPPORTED_TOPIC_KEYS,
    BrokerConfig,
    ConfigError,
    validate_topic_config,
)
from sluice.broker.servicers.broker import admin_result
from sluice.metadata import open_store


@pytest.mark.parametrize("key", sorted(k for k in UNSUPPORTED_TOPIC_KEYS if k.startswith("segment.")))
def test_segment_keys_are_refused_with_the_reason(key: str) -> None:
    with pytest.raises(ConfigError, match=f"'{key}' is not supported: .*no segments"):
        validate_topic_config({key: "1000"})


def test_compression_type_is_refused_with_the_reason() -> None:
    """A Kafka user's common topic setting: refused saying where compression is chosen, not 'unknown'."""
    with pytest.raises(ConfigError, match=r"'compression\.type' is not supported: the broker never recompresses"):
        validate_topic_config({"compression.type": "zstd"})


def test_every_accepted_topic_key_has_a_type_and_a_default() -> None:
    assert set(DEFAULTS) >= TOPIC_KEYS
    assert not TOPIC_KEYS & set(UNSUPPORTED_TOPIC_KEYS)
    assert validate_topic_config({"min.compaction.lag.ms": "5000"}) == {"min.compaction.lag.ms": "5000"}
    with pytest.raises(ConfigError, match=r"min\.compaction\.lag\.ms must be >= 0"):
        validate_topic_config({"min.compaction.lag.ms": "-1"})


def test_create_topics_answers_invalid_config_naming_the_key(tmp_path: Path) -> None:
    store = open_store(str(tmp_path / "metadata.sqlite"))
    try:
        config = BrokerConfig.build(0, "127.0.0.1", 1, str(tmp_path), str(tmp_path / "metadata.sqlite"))
        cluster = ClusterView(store, config)
        cluster.register()
        with pytest.raises(errors.InvalidConfigError, match=r"segment\.bytes"):
            cluster.create_topic("t", 1, 1, {"segment.bytes": "1048576"})
        assert "t" not in cluster.topics
        # What the servicer answers for it: INVALID_CONFIG with the message.
        result = bpb.CreateTopicsResponse().topics.add(name="t")
        asyncio.run(admin_result(cluster, result, lambda: cluster.create_topic("t", 1, 1, {"segment.ms": "600000"})))
        assert result.error_code == pb.INVALID_CONFIG and "segment.ms" in result.error_message
        assert cluster.create_topic("t", 1, 1, {"retention.ms": "1000"})  # the accepted keys still work
    finally:
        store.close()


@pytest.mark.parametrize("key", sorted(UNSUPPORTED_BROKER_KEYS))
def test_broker_keys_without_an_implementation_are_refused_by_name(key: str) -> None:
    with pytest.raises(ConfigError, match=f"broker config '{key}' is not supported: "):
        BrokerConfig.build(0, "127.0.0.1", 9092, "/tmp/unused", "sqlite:///unused", {key: "12345"})


def test_auto_create_topics_is_kafkas_key_off_by_default() -> None:
    assert BrokerConfig.build(0, "h", 9092, "/tmp/unused", "x", {}).get("auto.create.topics.enable") is False
    on = BrokerConfig.build(0, "h", 9092, "/tmp/unused", "x", {"auto.create.topics.enable": "true"})
    assert on.get("auto.create.topics.enable") is True


def test_message_max_bytes_is_kafkas_broker_name_of_the_max_message_bytes_default() -> None:
    config = BrokerConfig.build(0, "127.0.0.1", 9092, "/tmp/unused", "x", {"message.max.bytes": "2048"})
    assert config.topic_value({}, "max.message.bytes") == 2048
    assert config.topic_value({"max.message.bytes": "100"}, "max.message.bytes") == 100
    with pytest.raises(ConfigError, match="name the same setting"):
        BrokerConfig.build(0, "h", 9092, "/tmp/unused", "x", {"message.max.bytes": "1", "max.message.bytes": "2"})
