"""The MetadataStore contract, run against every backend.

``tests/unit/test_metadata_store.py`` runs it on the SQLite store,
``tests/k8s/test_metadata_store.py`` on the Kubernetes store against a real
API server. Each check gets a factory that opens a new store on the same
backing data, because two processes (brokers, the operator) share one store:
what one writes, the other must see, and compare-and-set must hold between
them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from sluice.metadata.store import MetadataStore, VersionConflict, update
from tests.support.waiting import wait_for

StoreFactory = Callable[[], MetadataStore]


def check_create_get_list(open_store: StoreFactory) -> None:
    store = open_store()
    assert store.get("topics/a") is None
    a = store.compare_and_set("topics/a", {"name": "a", "n": 1}, None)
    store.compare_and_set("topics/B_x", {"name": "B_x"}, None)
    store.compare_and_set("brokers/0", {"broker_id": 0}, None)
    store.compare_and_set("cluster", {"cluster_id": "c"}, None)
    got = store.get("topics/a")
    assert got is not None and got.value == {"name": "a", "n": 1} and got.version == a.version
    assert [d.key for d in store.list("topics/")] == ["topics/B_x", "topics/a"]
    assert [d.key for d in store.list("")] == ["brokers/0", "cluster", "topics/B_x", "topics/a"]
    assert [d.key for d in store.list("topics/a")] == ["topics/a"]
    # Another store on the same data sees it all.
    other = open_store()
    assert other.get("cluster") is not None and other.get("cluster").value == {"cluster_id": "c"}  # type: ignore[union-attr]
    other.close()
    store.close()


def check_compare_and_set(open_store: StoreFactory) -> None:
    store = open_store()
    first = store.compare_and_set("producer_id_block", {"block_end": 1000}, None)
    with pytest.raises(VersionConflict):
        store.compare_and_set("producer_id_block", {"block_end": 5}, None)  # exists already
    second = store.compare_and_set("producer_id_block", {"block_end": 2000}, first.version)
    assert second.version != first.version and second.revision > first.revision
    with pytest.raises(VersionConflict):
        store.compare_and_set("producer_id_block", {"block_end": 3000}, first.version)  # stale
    with pytest.raises(VersionConflict):
        store.compare_and_set("never-written", {"x": 1}, 12345)
    got = store.get("producer_id_block")
    assert got is not None and got.value == {"block_end": 2000}
    store.close()


def check_delete(open_store: StoreFactory) -> None:
    store = open_store()
    doc = store.compare_and_set("topics/gone", {"name": "gone"}, None)
    with pytest.raises(VersionConflict):
        store.delete("topics/gone", doc.version + 1000)
    store.delete("topics/gone", doc.version)
    assert store.get("topics/gone") is None
    assert store.list("topics/") == []
    with pytest.raises(VersionConflict):
        store.delete("topics/gone", doc.version)
    again = store.compare_and_set("topics/gone", {"name": "gone", "again": True}, None)  # can be re-created
    assert again.value == {"name": "gone", "again": True}
    store.close()


def check_changes_since(open_store: StoreFactory) -> None:
    """Every write and deletion shows up, in revision order, to this store and to another one."""
    writer, watcher = open_store(), open_store()
    start = max([d.revision for d in watcher.changes_since(0)], default=0)
    a = writer.compare_and_set("topics/w1", {"v": 1}, None)
    writer.compare_and_set("brokers/7", {"broker_id": 7}, None)
    a2 = writer.compare_and_set("topics/w1", {"v": 2}, a.version)
    # Read-your-writes: the writer's own poll sees its writes at once.
    mine = writer.changes_since(start)
    assert [(d.key, d.value) for d in mine] == [("brokers/7", {"broker_id": 7}), ("topics/w1", {"v": 2})]
    assert [d.revision for d in mine] == sorted(d.revision for d in mine)
    writer.delete("topics/w1", a2.version)
    gone = writer.changes_since(a2.revision, "topics/")
    assert [(d.key, d.value) for d in gone] == [("topics/w1", None)]
    assert gone[0].revision > a2.revision
    # The other store catches up (through its watch, for Kubernetes) and sees the deletion too.
    wait_for(
        lambda: any(d.key == "topics/w1" and d.value is None for d in watcher.changes_since(start)),
        10.0,
        "the watch to see topics/w1 deleted",
        interval=0.05,
    )
    seen = watcher.changes_since(start)
    assert {d.key: d.value for d in seen} == {"brokers/7": {"broker_id": 7}, "topics/w1": None}
    # Polling from the last revision seen returns nothing new.
    last = max(d.revision for d in seen)
    assert watcher.changes_since(last) == []
    later = writer.compare_and_set("topics/w2", {"v": 3}, None)
    wait_for(
        lambda: [d.key for d in watcher.changes_since(last)] == ["topics/w2"],
        10.0,
        "the watch to see topics/w2 alone",
        interval=0.05,
    )
    assert watcher.changes_since(last)[0].revision == later.revision
    writer.close()
    watcher.close()


def check_changes_since_gives_each_key_once_at_its_latest(open_store: StoreFactory) -> None:
    """Many writes to a few keys: a poll from any revision gets each key changed since once, at its
    latest value, in revision order (the Kubernetes store answers from an index of its cache)."""
    writer, watcher = open_store(), open_store()
    start = max([d.revision for d in watcher.changes_since(0)], default=0)
    versions: dict[str, int | None] = {f"topics/many-{k}": None for k in range(5)}
    revisions: list[int] = []
    for i in range(30):
        key = f"topics/many-{i % 5 if i < 20 else 0}"  # the last ten writes all go to many-0
        doc = writer.compare_and_set(key, {"i": i}, versions[key])
        versions[key] = doc.version
        revisions.append(doc.revision)
    solo = writer.compare_and_set("solo-many", {"i": -1}, None)  # a key without "/", as "controller"
    expected = {"topics/many-0": {"i": 29}, **{f"topics/many-{k}": {"i": 15 + k} for k in range(1, 5)}}
    wait_for(
        lambda: {d.key: d.value for d in watcher.changes_since(start, "topics/many-")} == expected,
        10.0,
        "the watch to see the thirty writes",
        interval=0.05,
    )
    for store in (writer, watcher):
        seen = store.changes_since(start, "topics/many-")
        assert sorted(d.key for d in seen) == sorted(expected)  # once each
        assert [d.revision for d in seen] == sorted(d.revision for d in seen)
        after = store.changes_since(revisions[19], "topics/many-")  # only many-0 changed after write 19
        assert [(d.key, d.value) for d in after] == [("topics/many-0", {"i": 29})]
        assert [d.key for d in store.changes_since(start, "solo-")] == ["solo-many"]
        everything = [d.key for d in store.changes_since(revisions[19]) if "many" in d.key]
        assert everything == ["topics/many-0", "solo-many"]  # every family, in revision order
        assert store.changes_since(solo.revision, "solo-") == []
    writer.close()
    watcher.close()


def check_concurrent_updates_lose_nothing(open_store: StoreFactory, threads: int = 4, each: int = 10) -> None:
    """Read-modify-write from several stores at once: every increment lands exactly once."""
    stores = [open_store() for _ in range(threads)]
    errors: list[BaseException] = []

    def bump(store: MetadataStore) -> None:
        try:
            for _ in range(each):
                update(store, "counter", lambda v: {"n": (v or {}).get("n", 0) + 1}, attempts=200)
        except BaseException as exc:  # reported below
            errors.append(exc)

    workers = [threading.Thread(target=bump, args=(s,)) for s in stores]
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=120)
    assert not errors, errors
    got = stores[0].get("counter")
    assert got is not None and got.value == {"n": threads * each}
    for s in stores:
        s.close()


CHECKS = [
    check_create_get_list,
    check_compare_and_set,
    check_delete,
    check_changes_since,
    check_changes_since_gives_each_key_once_at_its_latest,
    check_concurrent_updates_lose_nothing,
]
