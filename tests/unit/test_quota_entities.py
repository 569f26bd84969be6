"""Client quota entities: Kafka's resolution order, shared buckets, the store's keys, validation."""

from __future__ import annotations

from pathlib import Path

import pytest

from sluice.broker.security import quota_admin
from sluice.broker.security.limits import ByteRateQuota
from sluice.broker.security.quota_admin import EXACT, MATCH_DEFAULT, SPECIFIED, QuotaRequestError
from sluice.broker.security.quota_resolution import resolve
from sluice.broker.security.quota_watch import ClientQuotas
from sluice.metadata import quota_store
from sluice.metadata.local import SqliteMetadataStore
from sluice.metadata.quota_store import DEFAULT, QuotaEntity
from sluice.metadata.store import MetadataStore

P = "producer_byte_rate"

# every level of KIP-55's order, each with its own rate: level n has rate n
LEVELS = [
    QuotaEntity("alice", "app1"),
    QuotaEntity("alice", DEFAULT),
    QuotaEntity("alice", None),
    QuotaEntity(DEFAULT, "app1"),
    QuotaEntity(DEFAULT, DEFAULT),
    QuotaEntity(DEFAULT, None),
    QuotaEntity(None, "app1"),
    QuotaEntity(None, DEFAULT),
]


def test_the_first_entity_in_kafkas_order_wins() -> None:
    quotas = {e: {P: float(n + 1)} for n, e in enumerate(LEVELS)}
    for n, entity in enumerate(LEVELS):
        found = resolve(quotas, P, "alice", "app1")
        assert found is not None and found[0] == entity and found[2] == n + 1
        del quotas[entity]
    assert resolve(quotas, P, "alice", "app1") is None


def test_the_bucket_is_the_matched_entity_shared_by_its_connections() -> None:
    assert resolve({QuotaEntity("alice", None): {P: 1}}, P, "alice", "app1") == (QuotaEntity("alice"), ("alice", ""), 1)
    assert resolve({QuotaEntity(None, "app1"): {P: 1}}, P, "bob", "app1")[1] == ("", "app1")  # type: ignore[index]
    # a default stands for the caller's own name: one bucket per user (or client id)
    assert resolve({QuotaEntity(DEFAULT, None): {P: 1}}, P, "bob", "x")[1] == ("bob", "")  # type: ignore[index]
    assert resolve({QuotaEntity(None, DEFAULT): {P: 1}}, P, "bob", "x")[1] == ("", "x")  # type: ignore[index]
    assert resolve({QuotaEntity(DEFAULT, DEFAULT): {P: 1}}, P, "bob", "x")[1] == ("bob", "x")  # type: ignore[index]
    # another key does not count
    assert resolve({QuotaEntity("alice", None): {"consumer_byte_rate": 1}}, P, "alice", "app1") is None


def _store(tmp_path: Path) -> MetadataStore:
    return SqliteMetadataStore(str(tmp_path / "meta.sqlite"))


def test_entities_are_stored_followed_and_applied_to_the_data_path(tmp_path: Path) -> None:
    store = _store(tmp_path)
    quotas = ClientQuotas(store)
    quota_store.alter_quotas(store, QuotaEntity(client_id="app1"), {P: 100.0})
    quota_store.alter_quotas(store, QuotaEntity("alice", "app1"), {P: 1000.0})
    quota_store.alter_quotas(store, QuotaEntity("a/clients/b"), {P: 7.0})  # escaped: not a user+client
    quotas.refresh()
    assert quota_store.list_quotas(store)[QuotaEntity("a/clients/b")] == {P: 7.0}
    now = [0.0]
    bytes_quota = ByteRateQuota("quota.producer.default", 0, clock=lambda: now[0], rates=quotas.rates(P))
    assert bytes_quota.rate_of("User:alice", "app1") == 1000
    assert bytes_quota.rate_of("User:bob", "app1") == 100
    assert bytes_quota.rate_of("User:bob", "other") == 0
    # bob and carol's app1 connections share the client-id entity's bucket
    assert bytes_quota.record("User:bob", 100, "app1") == 0
    assert bytes_quota.record("User:carol", 50, "app1") == 501
    assert bytes_quota.delay("User:bob", "app1") == pytest.approx(0.5)
    assert bytes_quota.record("User:alice", 500, "app1") == 0  # its own entity, its own bucket
    quota_store.alter_quotas(store, QuotaEntity(client_id="app1"), {P: None})  # removed: the document goes
    quotas.refresh()
    assert QuotaEntity(client_id="app1") not in quota_store.list_quotas(store)
    assert bytes_quota.rate_of("User:bob", "app1") == 0


def test_old_user_documents_keep_their_keys() -> None:
    assert quota_store.key_of(QuotaEntity("alice")) == "quotas/users/alice"
    assert quota_store.key_of(QuotaEntity(DEFAULT)) == "quotas/users/<default>"
    assert quota_store.key_of(QuotaEntity("alice", DEFAULT)) == "quotas/users/alice/clients/<default>"
    for entity in [*LEVELS, QuotaEntity("50%/x", "a/b")]:
        assert quota_store.entity_of(quota_store.key_of(entity)) == entity


@pytest.mark.parametrize(
    ("components", "message"),
    [
        ([], "at least one component"),
        ([("group", "g")], "unknown quota entity type 'group'"),
        ([("user", "a"), ("user", "b")], "given twice"),
        ([("ip", "10.0.0.1")], "ip quota entities are not kept"),
        ([("user", "a"), ("ip", None)], "ip quota entities are not kept"),
        ([("client-id", "")], "client-id name '' is not valid"),
        ([("user", DEFAULT)], "is not valid"),
    ],
)
def test_entities_sluice_does_not_keep_are_refused(components: list[tuple[str, str | None]], message: str) -> None:
    with pytest.raises(QuotaRequestError, match=message):
        quota_admin.entity_from(components)


def test_entities_and_ops_that_are_kept() -> None:
    assert quota_admin.entity_from([("client-id", "x"), ("user", None)]) == QuotaEntity(DEFAULT, "x")
    assert quota_admin.components_of(QuotaEntity(DEFAULT, "x")) == [("user", None), ("client-id", "x")]
    assert quota_admin.changes_from([(P, 5.0, False), ("consumer_byte_rate", 0.0, True)]) == {
        P: 5.0,
        "consumer_byte_rate": None,
    }


@pytest.mark.parametrize(
    ("ops", "message"),
    [
        ([("request_percentage", 50.0, False)], "'request_percentage' is not supported"),
        ([("producer_byte_rat", 5.0, False)], "not supported"),
        ([(P, -1.0, False)], "positive whole number"),
        ([(P, 0.0, False)], "positive whole number"),
        ([(P, 1.5, False)], "positive whole number"),
        ([(P, float("inf"), False)], "positive whole number"),
        ([(P, 1.0, False), (P, 2.0, False)], "twice"),
    ],
)
def test_bad_ops_are_refused(ops: list[tuple[str, float, bool]], message: str) -> None:
    with pytest.raises(QuotaRequestError, match=message):
        quota_admin.changes_from(ops)


def test_describe_filters_as_kafka() -> None:
    quotas = {e: {P: float(n + 1)} for n, e in enumerate(LEVELS)}
    quotas[QuotaEntity("bob")] = {P: 9.0}

    def found(components: list[tuple[str, int, str | None]], strict: bool = False) -> set[QuotaEntity]:
        return {e for e, _ in quota_admin.describe(quotas, components, strict)}

    assert found([]) == set(quotas)
    assert found([], strict=True) == set()
    assert found([("user", EXACT, "alice")]) == {LEVELS[0], LEVELS[1], LEVELS[2]}
    assert found([("user", EXACT, "alice")], strict=True) == {LEVELS[2]}
    assert found([("user", SPECIFIED, None)], strict=True) == {LEVELS[2], QuotaEntity("bob")}
    assert found([("user", MATCH_DEFAULT, None), ("client-id", SPECIFIED, None)]) == {LEVELS[3]}
    assert found([("client-id", MATCH_DEFAULT, None)], strict=True) == {LEVELS[7]}
    with pytest.raises(QuotaRequestError, match="unknown quota entity type 'users'"):
        found([("users", EXACT, "alice")])
