"""What the Kubernetes controller's status projection and Event owner lookup read and write (issue 28).

The metadata simulation (bench/metadata_scale.py) found the projection LISTing every Topic for each
batch of changed documents, the Event owner lookup LISTing them for every Event, and status patches
equal to what was there. Here the CustomObjectsApi is a fake that counts calls; the store is SQLite.
"""

from __future__ import annotations

import copy
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sluice.metadata import keys, open_store
from sluice.metadata.store import MetadataStore
from sluice.operator.controller.decisions import new_topic
from sluice.operator.controller.kubernetes import KubernetesController


class NotFound(Exception):
    status = 404  # as the kubernetes client's ApiException says it


class FakeCustom:
    """Topic objects in memory; counts LIST, GET and status PATCH calls."""

    def __init__(self, topics: dict[str, dict[str, Any]]) -> None:
        self.objects: dict[str, dict[str, dict[str, Any]]] = {"topics": topics, "coordinators": {}}
        self.calls: Counter[str] = Counter()

    def list_namespaced_custom_object(self, group: str, version: str, ns: str, plural: str) -> dict[str, Any]:
        self.calls["list"] += 1
        return {"items": [copy.deepcopy(o) for o in self.objects[plural].values()]}

    def get_namespaced_custom_object(self, group: str, version: str, ns: str, plural: str, name: str) -> Any:
        self.calls["get"] += 1
        if name not in self.objects[plural]:
            raise NotFound()
        return copy.deepcopy(self.objects[plural][name])

    def patch_namespaced_custom_object_status(
        self, group: str, version: str, ns: str, plural: str, name: str, body: dict[str, Any]
    ) -> None:
        self.calls["patch"] += 1
        self.objects[plural][name]["status"].update(copy.deepcopy(body["status"]))


def topic_object(name: str, topic: str | None = None) -> dict[str, Any]:
    spec = {"partitions": 2} | ({"topicName": topic} if topic else {})
    return {"metadata": {"name": name, "uid": f"uid-{name}"}, "spec": spec, "status": {"observedGeneration": 1}}


def write_topic(store: MetadataStore, name: str, leader_of_0: int | None = None) -> None:
    doc = new_topic(name, f"id-{name}", 2, 1, {}, [(0, "")])
    if leader_of_0 is not None:
        doc = doc.with_partition(0, doc.partitions[0].__class__([0], leader_of_0, 1, [0]))
    current = store.get(keys.topic(name))
    store.compare_and_set(keys.topic(name), doc.to_json(), None if current is None else current.version)


@pytest.fixture
def setup(tmp_path: Path) -> Iterator[tuple[KubernetesController, FakeCustom, MetadataStore]]:
    from kubernetes import client

    store = open_store(str(tmp_path / "metadata.sqlite"))
    custom = FakeCustom({"orders": topic_object("orders"), "pay": topic_object("pay", "payments")})
    controller = KubernetesController(store, client.ApiClient(), "ns")
    controller.custom = custom
    controller.resources.custom = custom
    try:
        yield controller, custom, store
    finally:
        controller.events.close()


def test_projection_reads_changed_topics_by_name_and_lists_once(setup: Any) -> None:
    controller, custom, store = setup
    for name in ("orders", "payments"):
        write_topic(store, name)
    assert controller.project_once() == 2
    assert custom.calls == Counter({"list": 1, "get": 2, "patch": 2})
    assert custom.objects["topics"]["pay"]["status"]["topicName"] == "payments"
    custom.calls.clear()
    write_topic(store, "orders", leader_of_0=-1)  # a change: patched, no LIST
    assert controller.project_once() == 1
    assert custom.calls == Counter({"get": 1, "patch": 1})
    assert custom.objects["topics"]["orders"]["status"]["partitions"][0]["leader"] == -1


def test_a_status_patch_equal_to_the_status_is_not_sent(setup: Any) -> None:
    controller, custom, store = setup
    write_topic(store, "orders")
    assert controller.project_once() == 1
    custom.calls.clear()
    write_topic(store, "orders")  # a new revision of the same document
    assert controller.project_once() == 0
    assert custom.calls["patch"] == 0


def test_event_owner_lookups_share_one_list(setup: Any) -> None:
    controller, custom, _ = setup
    for _ in range(10):
        assert controller.owner_of("payments") == {
            "apiVersion": "sluice.dev/v1alpha1",
            "kind": "Topic",
            "name": "pay",
            "namespace": "ns",
            "uid": "uid-pay",
        }
        assert controller.owner_of("orders") is not None
    assert custom.calls["list"] == 1


def test_a_topic_without_a_resource_is_dropped_after_one_list_and_a_new_one_is_found(setup: Any) -> None:
    controller, custom, store = setup
    write_topic(store, "orders")
    write_topic(store, "admin-made")  # created through the Kafka admin API: no Topic object
    assert controller.project_once() == 1
    assert controller.project_once() == 0
    assert custom.calls["list"] == 1
    # a Topic created later is found by a LIST once RELIST_S has passed
    custom.objects["topics"]["late"] = topic_object("late")
    write_topic(store, "late")
    controller.resources.clock = lambda: 1e12
    assert controller.project_once() == 1
    assert custom.calls["list"] == 2


def test_a_topic_made_again_under_its_name_is_followed(setup: Any) -> None:
    controller, custom, store = setup
    write_topic(store, "orders")
    controller.project_once()
    custom.objects["topics"]["orders"] = {**topic_object("orders"), "metadata": {"name": "orders", "uid": "new"}}
    write_topic(store, "orders", leader_of_0=-1)
    assert controller.project_once() == 1
    owner = controller.owner_of("orders")
    assert owner is not None and owner["uid"] == "new"
    del custom.objects["topics"]["orders"]  # deleted: forgotten, and not projected
    write_topic(store, "orders")
    assert controller.project_once() == 0
    controller.resources.clock = lambda: 1e12
    assert controller.owner_of("orders") is None
