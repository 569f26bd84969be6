"""Kafka's incremental config operations on topic overrides (IncrementalAlterConfigs' core).

The pure rules (:func:`apply_changes`) and the cluster view's operation over a real SQLite
metadata store: compare-and-set, validate_only, all or nothing, internal and unknown topics.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from sluice import errors
from sluice.broker.cluster import CONSUMER_OFFSETS_TOPIC, ClusterView
from sluice.broker.config import BrokerConfig
from sluice.broker.topic_config_ops import ConfigChange, ConfigOp, apply_changes
from sluice.metadata import keys
from sluice.metadata.documents import TopicDocument, read, replace
from sluice.metadata.store import Document, MetadataStore

SET, DELETE, APPEND, SUBTRACT = ConfigOp.SET, ConfigOp.DELETE, ConfigOp.APPEND, ConfigOp.SUBTRACT
BROKER = {"cleanup.policy": "delete", "retention.ms": "604800000", "max.message.bytes": "1048588"}


def apply(overrides: dict[str, str], *changes: tuple[str, int, str | None]) -> dict[str, str]:
    return apply_changes(overrides, [ConfigChange(*c) for c in changes], BROKER.__getitem__)


# -- the operations ------------------------------------------------------------------------------


def test_set_adds_or_replaces_an_override_and_keeps_the_others() -> None:
    assert apply({}, ("retention.ms", SET, "60000")) == {"retention.ms": "60000"}
    before = {"retention.ms": "60000", "max.message.bytes": "2048"}
    assert apply(before, ("retention.ms", SET, "120000")) == {"retention.ms": "120000", "max.message.bytes": "2048"}
    assert before == {"retention.ms": "60000", "max.message.bytes": "2048"}  # the input is not changed


def test_set_normalises_as_create_topics_does() -> None:
    assert apply({}, ("unclean.leader.election.enable", SET, "TRUE"), ("retention.ms", SET, " 5 ")) == {
        "unclean.leader.election.enable": "true",
        "retention.ms": "5",
    }


def test_delete_returns_the_key_to_the_broker_value_and_ignores_the_value_sent() -> None:
    before = {"retention.ms": "60000", "max.message.bytes": "2048"}
    assert apply(before, ("retention.ms", DELETE, "anything")) == {"max.message.bytes": "2048"}
    assert apply(before, ("cleanup.policy", DELETE, None)) == before  # no override: nothing to remove


def test_append_starts_from_the_value_in_force_and_adds_only_what_is_missing() -> None:
    # no override: the broker's value (delete) is the list appended to
    assert apply({}, ("cleanup.policy", APPEND, "compact")) == {"cleanup.policy": "delete,compact"}
    assert apply({"cleanup.policy": "compact"}, ("cleanup.policy", APPEND, "delete")) == {
        "cleanup.policy": "compact,delete"
    }
    assert apply({"cleanup.policy": "compact"}, ("cleanup.policy", APPEND, "compact, compact")) == {
        "cleanup.policy": "compact"
    }
    assert apply({}, ("cleanup.policy", APPEND, None)) == {"cleanup.policy": "delete"}


def test_subtract_removes_items_and_keeps_the_result_as_an_override() -> None:
    assert apply({"cleanup.policy": "delete,compact"}, ("cleanup.policy", SUBTRACT, "compact")) == {
        "cleanup.policy": "delete"
    }
    assert apply({}, ("cleanup.policy", SUBTRACT, "compact")) == {"cleanup.policy": "delete"}


def test_subtracting_everything_leaves_a_policy_sluice_refuses() -> None:
    with pytest.raises(errors.InvalidConfigError, match=r"cleanup\.policy must be delete, compact or both"):
        apply({}, ("cleanup.policy", SUBTRACT, "delete"))


@pytest.mark.parametrize("op", [APPEND, SUBTRACT])
def test_append_and_subtract_on_a_key_that_is_no_list_are_invalid_config(op: ConfigOp) -> None:
    with pytest.raises(errors.InvalidConfigError, match=rf"cannot {op.name} topic config 'retention\.ms'.*not a list"):
        apply({}, ("retention.ms", op, "1000"))


def test_append_of_a_value_the_list_does_not_take_is_invalid_config() -> None:
    with pytest.raises(errors.InvalidConfigError, match=r"cleanup\.policy must be"):
        apply({}, ("cleanup.policy", APPEND, "shred"))


# -- refusals: all or nothing --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "code", "named"),
    [
        (("no.such.key", SET, "1"), errors.InvalidConfigError, "no.such.key"),
        (("no.such.key", DELETE, None), errors.InvalidConfigError, "no.such.key"),
        (("segment.bytes", SET, "1048576"), errors.InvalidConfigError, "segment.bytes"),  # Kafka's, refused
        (("retention.ms", SET, "soon"), errors.InvalidConfigError, "retention.ms"),
        (("retention.ms", SET, "-2"), errors.InvalidConfigError, "retention.ms"),
        (("max.message.bytes", SET, "0"), errors.InvalidConfigError, "max.message.bytes"),
        (("retention.ms", SET, None), errors.InvalidConfigError, "retention.ms"),
        (("message.timestamp.type", SET, "WallClock"), errors.InvalidConfigError, "message.timestamp.type"),
        (("retention.ms", 7, "1"), errors.InvalidRequestError, "retention.ms"),  # no such operation
    ],
)
def test_a_refused_change_names_its_key(
    change: tuple[str, int, str | None], code: type[errors.SluiceError], named: str
) -> None:
    with pytest.raises(code) as refused:
        apply({"retention.ms": "60000"}, ("delete.retention.ms", SET, "1000"), change)
    assert named in refused.value.message


def test_a_key_named_twice_is_invalid_request() -> None:
    with pytest.raises(errors.InvalidRequestError, match="more than once"):
        apply({}, ("retention.ms", SET, "1"), ("retention.ms", DELETE, None))


# -- the cluster view: the document, compare-and-set, validate_only ------------------------------


def make_cluster(store: MetadataStore, tmp_path: Path) -> ClusterView:
    config = BrokerConfig.build(0, "127.0.0.1", 1, str(tmp_path), "x", {"message.max.bytes": "5000"})
    cluster = ClusterView(store, config)
    cluster.register()
    return cluster


def overrides(store: MetadataStore, name: str) -> dict[str, str]:
    doc = read(store, keys.topic(name), TopicDocument)
    assert doc is not None
    return doc.value.config


def test_alter_writes_the_document_and_the_view_sees_it(store: MetadataStore, tmp_path: Path) -> None:
    cluster = make_cluster(store, tmp_path)
    cluster.create_topic("t", 1, 1, {"retention.ms": "60000"})
    got = cluster.alter_topic_config("t", [ConfigChange("max.message.bytes", SET, "2048")])
    assert (
        got
        == overrides(store, "t")
        == cluster.topics["t"].config
        == {"retention.ms": "60000", "max.message.bytes": "2048"}
    )
    # APPEND starts from this broker's value when there is no override (message.max.bytes is not a list,
    # cleanup.policy's broker value is the default "delete")
    cluster.alter_topic_config("t", [ConfigChange("cleanup.policy", APPEND, "compact")])
    assert overrides(store, "t")["cleanup.policy"] == "delete,compact"
    cluster.alter_topic_config("t", [ConfigChange("retention.ms", DELETE, None)])
    assert "retention.ms" not in overrides(store, "t")


def test_validate_only_checks_and_writes_nothing(store: MetadataStore, tmp_path: Path) -> None:
    cluster = make_cluster(store, tmp_path)
    cluster.create_topic("t", 1, 1, {})
    version = store.get(keys.topic("t")).version  # type: ignore[union-attr]
    got = cluster.alter_topic_config("t", [ConfigChange("retention.ms", SET, "1")], validate_only=True)
    assert got == {"retention.ms": "1"}
    assert overrides(store, "t") == {} and store.get(keys.topic("t")).version == version  # type: ignore[union-attr]
    with pytest.raises(errors.InvalidConfigError):
        cluster.alter_topic_config("t", [ConfigChange("retention.ms", SET, "x")], validate_only=True)


def test_a_refused_change_leaves_every_override_as_it_was(store: MetadataStore, tmp_path: Path) -> None:
    cluster = make_cluster(store, tmp_path)
    cluster.create_topic("t", 1, 1, {"retention.ms": "60000"})
    version = store.get(keys.topic("t")).version  # type: ignore[union-attr]
    with pytest.raises(errors.InvalidConfigError, match=r"no\.such\.key"):
        cluster.alter_topic_config(
            "t", [ConfigChange("max.message.bytes", SET, "2048"), ConfigChange("no.such.key", SET, "1")]
        )
    assert overrides(store, "t") == {"retention.ms": "60000"}
    assert store.get(keys.topic("t")).version == version  # type: ignore[union-attr]


def test_unknown_and_internal_topics_are_refused(store: MetadataStore, tmp_path: Path) -> None:
    cluster = make_cluster(store, tmp_path)
    with pytest.raises(errors.UnknownTopicOrPartitionError, match="nope"):
        cluster.alter_topic_config("nope", [ConfigChange("retention.ms", SET, "1")])
    cluster.ensure_internal_topics()
    before = overrides(store, CONSUMER_OFFSETS_TOPIC)
    with pytest.raises(errors.InvalidTopicError, match="internal topic"):
        cluster.alter_topic_config(CONSUMER_OFFSETS_TOPIC, [ConfigChange("cleanup.policy", SET, "delete")])
    assert overrides(store, CONSUMER_OFFSETS_TOPIC) == before == {"cleanup.policy": "compact", "retention.ms": "-1"}


class RacingStore:
    """The real store, with another writer that moves ``key`` on right after our first read of it."""

    def __init__(self, store: MetadataStore, key: str) -> None:
        self.store, self.key, self.raced = store, key, False

    def __getattr__(self, name: str) -> object:
        return getattr(self.store, name)

    def get(self, key: str) -> Document | None:
        doc = self.store.get(key)
        if key == self.key and not self.raced and doc is not None and doc.value is not None:
            self.raced = True
            topic = TopicDocument.from_json(doc.value)
            shrunk = topic.with_partition(0, dataclasses.replace(topic.partitions[0], isr=[]))
            replace(self.store, key, shrunk, doc.version)  # an ISR update, written between our read and write
        return doc


def test_a_concurrent_change_of_the_document_is_kept(store: MetadataStore, tmp_path: Path) -> None:
    """Compare-and-set on the document's version: the concurrent ISR update is not lost, nor is ours."""
    make_cluster(store, tmp_path).create_topic("t", 1, 1, {})
    racing = RacingStore(store, keys.topic("t"))
    cluster = make_cluster(racing, tmp_path)  # type: ignore[arg-type]
    cluster.alter_topic_config("t", [ConfigChange("retention.ms", SET, "1")])
    doc = read(store, keys.topic("t"), TopicDocument)
    assert racing.raced and doc is not None
    assert doc.value.config == {"retention.ms": "1"} and doc.value.partitions[0].isr == []
