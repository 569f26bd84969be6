"""A handler's status patch carries only what changes: an idle resource's timer costs no PATCH (issue 28:
10,000 TransactionalIds with a status timer every 5 s were 2,000 PATCHes a second)."""

from __future__ import annotations

from typing import Any

import kopf

from sluice.operator.handlers.runtime import _sends_only_changes
from sluice.operator.handlers.status import drop_unchanged_status
from sluice.operator.resources import TRUE, set_condition

BODY: dict[str, Any] = {
    "metadata": {"name": "t", "generation": 3},
    "status": {
        "observedGeneration": 3,
        "state": "Empty",
        "conditions": set_condition([], "Ready", TRUE, "Declared", "declared", 3),
    },
}


def status_timer(body: Any, patch: kopf.Patch, **_: Any) -> None:
    """As the TransactionalId timer does: sets every field, changed or not."""
    patch.status["observedGeneration"] = body["metadata"]["generation"]
    patch.status["conditions"] = set_condition(body["status"]["conditions"], "Ready", TRUE, "Declared", "declared", 3)
    patch.status["state"] = body["status"]["state"]


def test_an_idle_resources_timer_sends_no_patch() -> None:
    patch = kopf.Patch()
    _sends_only_changes(status_timer)(body=BODY, patch=patch)
    assert not patch  # Kopf sends no PATCH for an empty patch


def test_only_the_changed_fields_are_sent() -> None:
    patch = kopf.Patch()
    patch.status["observedGeneration"] = 3
    patch.status["state"] = "Ongoing"
    patch.status["partitions"] = ["a-0"]
    patch.spec["x"] = 1  # not the status: left alone
    drop_unchanged_status(patch, BODY)
    assert dict(patch) == {"status": {"state": "Ongoing", "partitions": ["a-0"]}, "spec": {"x": 1}}


def test_a_changed_condition_is_sent_whole() -> None:
    patch = kopf.Patch()
    patch.status["conditions"] = set_condition(BODY["status"]["conditions"], "Hanging", TRUE, "TimedOut", "open", 3)
    drop_unchanged_status(patch, BODY)
    assert [c["type"] for c in patch["status"]["conditions"]] == ["Ready", "Hanging"]
