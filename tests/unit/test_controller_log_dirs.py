"""The controller fences a broker whose log directory is offline (issue 13, section 2), and reports
one whose data volume runs low on space without fencing it.

The broker records the failure in its ``brokers/<id>`` document; the controller loop, over a real
SQLite MetadataStore with health checks that keep saying SERVING, treats it as dead: its
leaderships move, it leaves every ISR, ``dead_brokers`` names it, and the change is reported once
to ``on_log_dir``. A restart writes the document without the field, and the broker counts again.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from sluice.metadata import documents, keys, open_store
from sluice.metadata.documents import BrokerDocument
from sluice.metadata.store import MetadataStore
from sluice.operator.controller.decisions import new_topic
from sluice.operator.controller.loop import ControllerLoop
from sluice.operator.liveness.brokers import FailureDetector


def always_serving(targets: Mapping[int, str]) -> dict[int, str]:
    return dict.fromkeys(targets, "SERVING")


def set_failure(store: MetadataStore, broker_id: int, failure: str) -> None:
    doc = BrokerDocument(broker_id, "127.0.0.1", 9000 + broker_id, log_dir_failure=failure)
    documents.update_document(store, keys.broker(broker_id), BrokerDocument, lambda _v: doc)


def partitions(store: MetadataStore) -> list[dict[str, Any]]:
    doc = store.get(keys.topic("orders"))
    assert doc is not None and doc.value is not None
    return list(doc.value["partitions"])


def test_a_broker_with_an_offline_log_dir_is_fenced_until_it_restarts(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = open_store(str(tmp_path / "metadata.sqlite"))
    for b in range(3):
        set_failure(store, b, "")
    doc = new_topic("orders", "id", 3, 3, {}, [(0, ""), (1, ""), (2, "")])
    store.compare_and_set(keys.topic("orders"), doc.to_json(), None)
    reported: list[tuple[int, str]] = []
    controller = ControllerLoop(
        store,
        FailureDetector(always_serving, timeout_ms=1000),
        on_log_dir=lambda b, why: reported.append((b, why)),
        preferred_leader_delay_ms=0,
    )
    controller.claim()
    controller.run_round()
    assert [p["leader"] for p in partitions(store)] == [0, 1, 2]

    set_failure(store, 0, "IO error: No space left on device")
    with caplog.at_level(logging.INFO, logger="sluice.operator.controller"):
        controller.run_round()
        controller.run_round()  # a second round changes nothing and reports nothing again
    p0, p1, p2 = partitions(store)
    assert p0["leader"] != 0 and p0["leader_epoch"] == 1
    assert all(0 not in p["isr"] for p in (p0, p1, p2))
    assert reported == [(0, "IO error: No space left on device")]
    assert "broker 0's log directory is offline (IO error: No space left on device)" in caplog.text
    ctl = store.get(keys.CONTROLLER)
    assert ctl is not None and ctl.value is not None
    assert ctl.value["dead_brokers"] == [0] and 0 not in ctl.value["live_brokers"]

    # restarted with space freed: the document is written anew; back in sync, it leads again
    set_failure(store, 0, "")
    controller.run_round()
    assert reported[-1] == (0, "")
    doc2 = store.get(keys.topic("orders"))
    assert doc2 is not None and doc2.value is not None
    value = dict(doc2.value)
    value["partitions"][0]["isr"] = [*value["partitions"][0]["isr"], 0]  # the leader re-admitted it
    store.compare_and_set(doc2.key, value, doc2.version)
    controller.run_round()
    assert partitions(store)[0]["leader"] == 0
    store.close()


def test_low_space_is_reported_once_per_change_and_fences_nobody(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = open_store(str(tmp_path / "metadata.sqlite"))
    for b in range(3):
        set_failure(store, b, "")
    doc = new_topic("orders", "id", 3, 3, {}, [(0, ""), (1, ""), (2, "")])
    store.compare_and_set(keys.topic("orders"), doc.to_json(), None)
    heard: list[tuple[int, bool, int, int]] = []
    controller = ControllerLoop(
        store, FailureDetector(always_serving, timeout_ms=1000), on_log_dir_space=lambda *a: heard.append(a)
    )
    controller.claim()
    controller.run_round()
    low = BrokerDocument(1, "127.0.0.1", 9001, log_dir_low_space=True, log_dir_free_bytes=3 << 20,
                         log_dir_size_bytes=100 << 20)  # fmt: skip
    assert BrokerDocument.from_json(low.to_json()) == low
    documents.update_document(store, keys.broker(1), BrokerDocument, lambda _v: low)
    with caplog.at_level(logging.INFO, logger="sluice.operator.controller"):
        controller.run_round()
        controller.run_round()
    assert heard == [(1, True, 3 << 20, 100 << 20)]
    assert "broker 1's data volume is low on space: 3.0 MiB free of 100.0 MiB" in caplog.text
    assert [p["leader"] for p in partitions(store)] == [0, 1, 2]  # a warning, not a fence
    set_failure(store, 1, "")
    controller.run_round()
    assert heard[-1] == (1, False, -1, -1)
    store.close()
