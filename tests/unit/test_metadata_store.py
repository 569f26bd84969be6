"""The MetadataStore contract (tests/metadata_contract.py) on the SQLite store, and the typed documents."""

from __future__ import annotations

import ast
import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from sluice.metadata import documents, keys, open_store
from sluice.metadata.documents import (
    INTERNAL_TOPICS,
    BrokerDocument,
    ClusterDocument,
    ControllerDocument,
    IsrRequestsDocument,
    ProducerIdBlock,
    TopicDocument,
    TransactionalIdDocument,
)
from sluice.metadata.local import SqliteMetadataStore
from sluice.metadata.store import MetadataStore, VersionConflict
from tests.metadata_contract import CHECKS


@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__.removeprefix("check_"))
def test_sqlite_store_contract(check: Callable[[Callable[[], MetadataStore]], None], tmp_path: Path) -> None:
    path = str(tmp_path / "metadata.sqlite")
    check(lambda: SqliteMetadataStore(path))


# -- typed documents (sluice.metadata.documents) over the SQLite store -------------------------------

# Each kind as the previous version wrote it: decoding and encoding again gives the same JSON.
STORED: list[tuple[type[Any], dict[str, Any]]] = [
    (ClusterDocument, {"cluster_id": "c0ffee"}),
    (BrokerDocument, {"broker_id": 2, "host": "127.0.0.1", "port": 9092, "rack": "a", "started_ms": 17}),
    (
        TopicDocument,
        {
            "name": "orders",
            "topic_id": "t1",
            "internal": False,
            "config": {"retention.ms": "1000"},
            "replication_factor": 2,
            "partitions": [{"replicas": [0, 1], "leader": 1, "leader_epoch": 3, "isr": [1]}],
        },
    ),
    (ProducerIdBlock, {"broker_id": 0, "block_start": 1001, "block_end": 2000}),
    (
        ControllerDocument,
        {"controller_id": -1, "epoch": 4, "live_brokers": [0, 2], "dead_brokers": [1], "updated_ms": 5},
    ),
    (TransactionalIdDocument, {"transactional_id": "app", "resource": "ns/app"}),
    # this version's additions, as it writes them
    (
        ControllerDocument,
        {
            "controller_id": -1,
            "epoch": 5,
            "live_brokers": [0],
            "dead_brokers": [],
            "updated_ms": 6,
            "isr_requests": True,
        },
    ),
    (
        IsrRequestsDocument,
        {
            "broker_id": 1,
            "requests": [
                {
                    "topic": "orders",
                    "topic_id": "t1",
                    "partition": 0,
                    "leader_epoch": 3,
                    "partition_epoch": 7,
                    "base": [1, 0],
                    "isr": [1],
                }
            ],
            "updated_ms": 8,
        },
    ),
    (
        BrokerDocument,
        {"broker_id": 2, "host": "h", "port": 1, "rack": "", "started_ms": 1, "records_formats": ["sluice"]},
    ),
]


@pytest.mark.parametrize(("kind", "value"), STORED, ids=lambda v: getattr(v, "__name__", ""))
def test_documents_decode_and_encode_to_the_same_json(kind: type[Any], value: dict[str, Any]) -> None:
    doc = kind.from_json(value)
    assert doc.to_json() == value
    assert json.dumps(doc.to_json(), sort_keys=True) == json.dumps(value, sort_keys=True)
    assert kind.from_json(doc.to_json()) == doc


def test_unknown_fields_survive_a_read_modify_write(tmp_path: Path) -> None:
    store = SqliteMetadataStore(str(tmp_path / "metadata.sqlite"))
    value = dict(STORED[2][1], future_field={"x": 1})
    value["partitions"] = [dict(value["partitions"][0], partition_epoch=9, future_partition_field="y")]
    store.compare_and_set(keys.topic("orders"), value, None)

    def shrink(topic: TopicDocument | None) -> TopicDocument | None:
        assert topic is not None
        return topic.with_partition(0, dataclasses.replace(topic.partitions[0], isr=[1, 0]))

    documents.update_document(store, keys.topic("orders"), TopicDocument, shrink)
    stored = store.get(keys.topic("orders"))
    assert stored is not None and stored.value is not None
    assert stored.value["future_field"] == {"x": 1}
    # the change counted one more partition epoch
    expected = {"replicas": [0, 1], "leader": 1, "leader_epoch": 3, "isr": [1, 0], "partition_epoch": 10}
    assert stored.value["partitions"][0] == {**expected, "future_partition_field": "y"}
    store.close()


def test_typed_read_create_replace_and_list(tmp_path: Path) -> None:
    store = SqliteMetadataStore(str(tmp_path / "metadata.sqlite"))
    assert documents.read(store, keys.CONTROLLER, ControllerDocument) is None
    version = documents.create(store, keys.CONTROLLER, ControllerDocument(epoch=1))
    with pytest.raises(VersionConflict):
        documents.create(store, keys.CONTROLLER, ControllerDocument(epoch=9))
    found = documents.read(store, keys.CONTROLLER, ControllerDocument)
    assert found is not None and found.version == version and found.value == ControllerDocument(epoch=1)
    documents.replace(store, keys.CONTROLLER, ControllerDocument(epoch=2, dead_brokers=[1]), version)
    with pytest.raises(VersionConflict):
        documents.replace(store, keys.CONTROLLER, ControllerDocument(epoch=3), version)
    assert store.get(keys.CONTROLLER).value["dead_brokers"] == [1]  # type: ignore[union-attr]
    for i in (1, 0):
        documents.create(store, keys.broker(i), BrokerDocument(i, "::1" if i else "127.0.0.1", 9000 + i))
    brokers = documents.list_documents(store, keys.BROKERS, BrokerDocument)
    assert [b.value.address for b in brokers] == ["127.0.0.1:9000", "[::1]:9001"]
    store.close()


def test_internal_topic_names_are_defined_once() -> None:
    from sluice.broker import cluster

    assert INTERNAL_TOPICS == ("__transaction_state", "__consumer_offsets")
    assert cluster.TRANSACTION_STATE_TOPIC is documents.TRANSACTION_STATE_TOPIC
    assert cluster.CONSUMER_OFFSETS_TOPIC is documents.CONSUMER_OFFSETS_TOPIC


def test_the_store_interface_imports_no_backend(tmp_path: Path) -> None:
    """store.py is the interface; only the factory imports the backends (no import cycle)."""
    import sluice.metadata.store as interface

    tree = ast.parse(Path(interface.__file__).read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert not {m for m in imported if m and m.startswith("sluice.metadata.")}, imported
    opened = open_store(str(tmp_path / "m.sqlite"))
    assert isinstance(opened, SqliteMetadataStore)
    opened.close()
