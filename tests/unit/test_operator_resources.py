"""Statuses and conditions of the custom resources (sluice.operator.resources)."""

from __future__ import annotations

import dataclasses

from sluice.metadata.documents import TopicDocument
from sluice.operator.resources import (
    coordinator_rows,
    is_paused,
    leadership_condition,
    partition_rows,
    pod_ordinal,
    set_condition,
    topic_name,
    transaction_status,
)

DOC = TopicDocument.from_json(
    {
        "name": "orders",
        "topic_id": "t1",
        "partitions": [
            {"replicas": [0, 1, 2], "leader": 0, "leader_epoch": 3, "isr": [0, 1, 2]},
            {"replicas": [1, 2, 0], "leader": 2, "leader_epoch": 1, "isr": [2, 0]},
        ],
    }
)


def test_names_ordinals_and_pause() -> None:
    assert topic_name({"metadata": {"name": "orders"}, "spec": {}}) == "orders"
    assert topic_name({"metadata": {"name": "orders"}, "spec": {"topicName": "Orders_V2"}}) == "Orders_V2"
    assert pod_ordinal("sluice-broker-12") == 12 and pod_ordinal("sluice-operator") is None
    assert is_paused({"annotations": {"sluice.dev/paused": "true"}})
    assert not is_paused({"annotations": {"sluice.dev/paused": "false"}}) and not is_paused({})


def test_conditions_keep_their_transition_time_while_the_status_holds() -> None:
    c = set_condition(None, "Ready", "False", "Creating", "x", 1, now="2026-01-01T00:00:00Z")
    c = set_condition(c, "Ready", "False", "StillCreating", "y", 2, now="2026-01-01T00:01:00Z")
    assert c == [
        {
            "type": "Ready",
            "status": "False",
            "reason": "StillCreating",
            "message": "y",
            "lastTransitionTime": "2026-01-01T00:00:00Z",
            "observedGeneration": 2,
        }
    ]
    c = set_condition(c, "Ready", "True", "Ready", "", 2, now="2026-01-01T00:02:00Z")
    c = set_condition(c, "Paused", "False", "NotPaused", "", 2, now="2026-01-01T00:02:00Z")
    assert [(x["type"], x["status"], x["lastTransitionTime"]) for x in c] == [
        ("Ready", "True", "2026-01-01T00:02:00Z"),
        ("Paused", "False", "2026-01-01T00:02:00Z"),
    ]


def test_partition_rows_and_readiness_follow_the_document() -> None:
    assert partition_rows(DOC) == [
        {"partition": 0, "leader": 0, "leaderEpoch": 3, "replicas": [0, 1, 2], "isr": [0, 1, 2]},
        {"partition": 1, "leader": 2, "leaderEpoch": 1, "replicas": [1, 2, 0], "isr": [2, 0]},
    ]
    assert coordinator_rows(DOC)[1] == {
        "partition": 1, "coordinator": 2, "coordinatorEpoch": 1, "replicas": [1, 2, 0], "isr": [2, 0]
    }  # fmt: skip
    ready = leadership_condition(None, DOC, 1, "topic orders")
    assert ready[0]["status"] == "True"
    leaderless = DOC.with_partitions([dataclasses.replace(DOC.partitions[0], leader=-1)])
    assert leadership_condition(ready, leaderless, 1, "topic orders")[0]["reason"] == "LeaderNotAvailable"


def test_transaction_status_and_hanging() -> None:
    described = {
        "state": "Ongoing",
        "producer_id": 7,
        "producer_epoch": 2,
        "transaction_timeout_ms": 10_000,
        "transaction_start_time_ms": 1_000_000,
        "partitions": ["out-1", "out-0"],
        "coordinator_id": 1,
        "last_update_time_ms": 1_000_500,
    }
    fine = transaction_status(described, None, None, 1_005_000, 1)
    assert fine["state"] == "Ongoing" and fine["producerId"] == 7 and fine["producerEpoch"] == 2
    assert fine["coordinator"] == 1 and fine["partitions"] == ["out-0", "out-1"]
    assert fine["transactionStartTime"] == "1970-01-01T00:16:40Z"
    assert fine["conditions"][0]["type"] == "Hanging" and fine["conditions"][0]["status"] == "False"
    hanging = transaction_status(described, fine["conditions"], None, 1_011_000, 1)
    assert hanging["conditions"][0]["status"] == "True" and hanging["conditions"][0]["reason"] == "TransactionTimedOut"
    # The declared timeout wins over the producer's.
    declared = transaction_status(described, None, 2_000, 1_005_000, 1)
    assert declared["conditions"][0]["status"] == "True"
    unused = transaction_status(None, None, None, 0, 1)
    assert unused["state"] == "Unknown" and unused["producerId"] == -1
