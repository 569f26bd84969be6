"""Writes that would not change a document are not made (issue 28: each one is a whole document
into etcd and to every watcher). Real SQLite store, its compare-and-set counted."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sluice.broker.cluster import ClusterView
from sluice.broker.config import BrokerConfig
from sluice.metadata import keys, open_store
from sluice.metadata.store import MetadataStore, update
from sluice.operator.controller.decisions import new_topic


class CountingWrites:
    def __init__(self, store: MetadataStore) -> None:
        self.store = store
        self.writes = 0

    def compare_and_set(self, *args: Any, **kwargs: Any) -> Any:
        self.writes += 1
        return self.store.compare_and_set(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)


def test_an_isr_write_of_the_isr_already_there_writes_nothing(tmp_path: Path) -> None:
    path = str(tmp_path / "metadata.sqlite")
    store = CountingWrites(open_store(path))
    doc = new_topic("orders", "id", 1, 3, {}, [(0, ""), (1, ""), (2, "")])
    store.compare_and_set(keys.topic("orders"), doc.to_json(), None)
    view = ClusterView(store, BrokerConfig.build(0, "127.0.0.1", 1, str(tmp_path), path, {}))  # type: ignore[arg-type]
    p = doc.partitions[0]
    store.writes = 0
    same = view.write_isr("orders", 0, p.leader, p.leader_epoch, list(reversed(p.isr)))  # the same set
    assert same is not None and store.writes == 0
    assert same.value == doc.to_json() and same.version == 1
    shrunk = view.write_isr("orders", 0, p.leader, p.leader_epoch, p.isr[:2])
    assert shrunk is not None and store.writes == 1 and shrunk.version > 1
    assert view.write_isr("orders", 0, p.leader, p.leader_epoch + 1, p.isr) is None  # not this leader's


def test_a_read_modify_write_that_changes_nothing_writes_nothing(tmp_path: Path) -> None:
    store = CountingWrites(open_store(str(tmp_path / "metadata.sqlite")))
    update(store, "k", lambda _: {"a": 1})
    assert store.writes == 1
    doc = update(store, "k", lambda v: dict(v or {}))
    assert store.writes == 1 and doc is not None and doc.value == {"a": 1} and doc.version == 1
    update(store, "k", lambda v: {**(v or {}), "a": 2})
    assert store.writes == 2

    def nested_in_place(v: Any) -> Any:  # as callers do: change a nested value of what they were given
        v["p"][0]["leader"] = 1
        return v

    update(store, "k", lambda v: {**(v or {}), "p": [{"leader": 0}]})
    assert store.writes == 3
    doc = update(store, "k", nested_in_place)
    assert store.writes == 4 and doc is not None and doc.value is not None and doc.value["p"] == [{"leader": 1}]
