"""The status a round computes for one TransactionalId (sluice.operator.transactional_id_statuses):
only the fields that change, nothing without an answer, "Unknown" for an id never used."""

from __future__ import annotations

from typing import Any

from sluice import errors
from sluice.api.v1 import records_pb2
from sluice.client.admin import TransactionDescription
from sluice.client.types import TopicPartition
from sluice.operator.transactional_id_statuses import status_changes

NOW_MS = 1_800_000_000_000


def item(status: dict[str, Any], **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "app", "generation": 1, "resourceVersion": "7"},
        "spec": {"transactionalId": "app", **spec},
        "status": {"observedGeneration": 1, **status},
    }


def ongoing(started_ms: int) -> TransactionDescription:
    return TransactionDescription(
        transactional_id="app",
        state="Ongoing",
        producer_id=4,
        producer_epoch=2,
        transaction_timeout_ms=60_000,
        transaction_start_time_ms=started_ms,
        partitions=[TopicPartition("orders", 1)],
        coordinator_id=0,
        last_update_time_ms=started_ms,
    )


def test_an_id_never_used_is_unknown_and_a_missing_answer_changes_nothing() -> None:
    never = errors.error_for(records_pb2.TRANSACTIONAL_ID_NOT_FOUND, "no transactional id 'app'")
    change = status_changes(item({}), never, NOW_MS)
    assert change is not None and (change["state"], change["producerId"]) == ("Unknown", -1)
    assert status_changes(item({}), None, NOW_MS) is None
    unavailable = errors.error_for(records_pb2.COORDINATOR_NOT_AVAILABLE, "moving")
    assert status_changes(item({"state": "Empty"}), unavailable, NOW_MS) is None


def test_only_the_fields_that_differ_and_none_when_the_status_is_current() -> None:
    answer = ongoing(NOW_MS - 5_000)
    first = status_changes(item({}), answer, NOW_MS)
    assert first is not None and first["state"] == "Ongoing" and first["partitions"] == ["orders-1"]
    current = item(first)
    assert status_changes(current, answer, NOW_MS + 1_000) == {}  # a second later: nothing to write
    later = status_changes(current, answer, NOW_MS + 120_000)  # past its timeout: Hanging turns True
    assert later is not None and set(later) == {"conditions"}
    hanging = [c for c in later["conditions"] if c["type"] == "Hanging"]
    assert hanging[0]["status"] == "True" and hanging[0]["reason"] == "TransactionTimedOut"
