"""Authorization in a secure LocalCluster: refused without an ACL, allowed with it (Kafka's errors).

``LocalCluster(secure=True)`` runs the authorizer with deny by default and ``User:admin`` as
the super user. Each check is made against real brokers with clients holding certificates for
``User:alice`` and ``User:bob``: without an ACL the operation fails with Kafka's error class
(non-retriable, so the client does not wait for a metadata timeout); once ``admin`` creates
the ACL (Admin.create_acls, Kafka's shape) it succeeds, and deleting it refuses again.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from sluice import errors
from sluice.client import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    Admin,
    Consumer,
    Producer,
    ResourcePatternType,
    ResourceType,
    TopicPartition,
)
from sluice.testing import LocalCluster
from tests.support.waiting import wait_for

T, LIT, PRE = ResourceType.TOPIC, ResourcePatternType.LITERAL, ResourcePatternType.PREFIXED
ALLOW, DENY = AclPermissionType.ALLOW, AclPermissionType.DENY


def acl(name: str, op: AclOperation, who: str = "User:alice", *, pattern: ResourcePatternType = LIT,
        permission: AclPermissionType = ALLOW, rtype: ResourceType = T) -> AclBinding:  # fmt: skip
    return AclBinding(rtype, name, pattern, who, "*", op, permission)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(brokers=1, data_dir=tmp_path_factory.mktemp("authz"), secure=True) as c:
        yield c


@pytest.fixture
def admin(cluster: LocalCluster) -> Iterator[Admin]:
    with Admin(**cluster.client_config("admin")) as a:
        yield a
        a.delete_acls([AclBindingFilter()])  # every test starts with no ACL


def read(cluster: LocalCluster, who: str, topic: str) -> list[bytes | None]:
    consumer = Consumer(**cluster.client_config(who), group_id=None)
    try:
        consumer.assign([TopicPartition(topic, 0)])
        consumer.seek_to_beginning()
        got: list[bytes | None] = []
        for _ in range(20):
            records = consumer.poll(timeout=0.5)
            got += [r.value for r in records]
            if got and not records:
                break
        return got
    finally:
        consumer.close()


def test_produce_and_fetch_need_write_and_read(cluster: LocalCluster, admin: Admin) -> None:
    admin.create_topic("orders", 1, 1)
    producer = Producer(**cluster.client_config("alice"), request_timeout_ms=10_000)
    with producer, pytest.raises(errors.TopicAuthorizationFailedError):
        producer.send("orders", b"refused", partition=0).get(timeout=30)
    admin.create_acls([acl("orders", AclOperation.WRITE)])
    with Producer(**cluster.client_config("alice")) as producer:
        producer.send("orders", b"allowed", partition=0).get(timeout=30)
    with pytest.raises(errors.TopicAuthorizationFailedError):
        read(cluster, "bob", "orders")
    admin.create_acls([acl("ord", AclOperation.READ, "User:bob", pattern=PRE)])  # a prefixed pattern
    assert read(cluster, "bob", "orders") == [b"allowed"]
    # DENY wins over the allow, for bob only; alice (Write implies Describe) still sees the topic
    admin.create_acls([acl("orders", AclOperation.READ, "User:bob", permission=DENY)])
    with pytest.raises(errors.TopicAuthorizationFailedError):
        read(cluster, "bob", "orders")
    with Admin(**cluster.client_config("alice")) as alice:
        assert alice.describe_topic("orders").name == "orders"


def test_topic_admin_needs_create_delete_and_the_acl_api_needs_the_cluster(cluster: LocalCluster, admin: Admin) -> None:
    with Admin(**cluster.client_config("alice")) as alice:
        with pytest.raises(errors.TopicAuthorizationFailedError):
            alice.create_topic("alice.a", 1, 1)
        with pytest.raises(errors.ClusterAuthorizationFailedError):
            alice.create_acls([acl("alice.", AclOperation.ALL, pattern=PRE)])
        with pytest.raises(errors.ClusterAuthorizationFailedError):
            alice.describe_acls(AclBindingFilter())
        admin.create_acls([acl("alice.", AclOperation.ALL, pattern=PRE)])
        alice.create_topic("alice.a", 1, 1)
        with pytest.raises(errors.TopicAuthorizationFailedError):
            alice.create_topic("bob.b", 1, 1)
        admin.create_topic("shared", 1, 1)
        with pytest.raises(errors.TopicAuthorizationFailedError):
            alice.delete_topic("shared")
        alice.delete_topic("alice.a")
    listed = admin.describe_acls(AclBindingFilter(principal="User:alice"))
    assert listed == [acl("alice.", AclOperation.ALL, pattern=PRE)]
    assert admin.delete_acls([AclBindingFilter(principal="User:alice")]) == listed
    assert admin.describe_acls(AclBindingFilter()) == []


def test_internal_topics_stay_closed_even_to_the_super_user(cluster: LocalCluster, admin: Admin) -> None:
    producer = Producer(**cluster.client_config("admin"), request_timeout_ms=10_000)
    with producer, pytest.raises(errors.InvalidTopicError):
        producer.send("__consumer_offsets", b"forged", partition=0).get(timeout=30)


def test_a_broker_name_is_a_super_user_only_on_a_certificate_of_the_cluster_ca(
    cluster: LocalCluster, admin: Admin
) -> None:
    admin.create_topic("guarded", 1, 1)
    # A clients-CA certificate that calls itself broker 0 passes the mtls handshake (the clients CA
    # is trusted there), but it is an ordinary principal: refused without an ACL.
    impostor = Producer(**cluster.client_config("sluice-broker-0"), request_timeout_ms=10_000)
    with impostor, pytest.raises(errors.TopicAuthorizationFailedError):
        impostor.send("guarded", b"forged", partition=0).get(timeout=30)
    # Broker 0's own certificate, which the cluster CA signed, is a super user, as in Kafka.
    d = cluster.data_dir / "tls" / "broker-0"
    broker = {
        "bootstrap_servers": cluster.bootstrap_servers,
        "security_protocol": "SSL",
        "ssl_cafile": str(d / "ca.crt"),
        "ssl_certfile": str(d / "tls.crt"),
        "ssl_keyfile": str(d / "tls.key"),
    }
    with Producer(**broker) as producer:
        producer.send("guarded", b"by a broker", partition=0).get(timeout=30)
    assert read(cluster, "admin", "guarded") == [b"by a broker"]


def test_without_the_authorizer_acls_are_security_disabled(tmp_path: Path) -> None:
    plain = LocalCluster(brokers=1, data_dir=tmp_path / "plain")
    with plain, Admin(bootstrap_servers=plain.bootstrap_servers) as a, pytest.raises(errors.SecurityDisabledError):
        a.create_acls([acl("orders", AclOperation.READ)])


def test_transactions_need_write_on_their_transactional_id(cluster: LocalCluster, admin: Admin) -> None:
    admin.create_topic("payments", 1, 1)
    admin.create_acls([acl("payments", AclOperation.WRITE)])
    refused = Producer(**cluster.client_config("alice"), transactional_id="alice-txn")
    with refused, pytest.raises(errors.TransactionalIdAuthorizationFailedError):
        refused.init_transactions()
    admin.create_acls([acl("alice-txn", AclOperation.WRITE, rtype=ResourceType.TRANSACTIONAL_ID)])
    with Producer(**cluster.client_config("alice"), transactional_id="alice-txn") as producer:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send("payments", b"paid", partition=0)
        producer.commit_transaction()
    with Admin(**cluster.client_config("alice")) as alice:  # Write implies Describe
        assert alice.describe_transactions(["alice-txn"])[0].state in ("PrepareCommit", "CompleteCommit")
    # A transaction lists only the partitions of topics the caller may Describe (as Kafka, and as
    # the Kafka listener answers): dave may describe the id but not the topic.
    admin.create_acls([acl("alice-txn", AclOperation.DESCRIBE, "User:dave", rtype=ResourceType.TRANSACTIONAL_ID)])
    with Producer(**cluster.client_config("alice"), transactional_id="alice-txn") as producer:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send("payments", b"open", partition=0).get(timeout=30)
        with Admin(**cluster.client_config("alice")) as alice, Admin(**cluster.client_config("dave")) as dave:
            seen_by_alice = alice.describe_transactions(["alice-txn"])[0]
            seen_by_dave = dave.describe_transactions(["alice-txn"])[0]
        producer.commit_transaction()
    assert seen_by_alice.state == seen_by_dave.state == "Ongoing"
    assert [(tp.topic, tp.partition) for tp in seen_by_alice.partitions] == [("payments", 0)]
    assert seen_by_dave.partitions == []
    with Admin(**cluster.client_config("bob")) as bob, pytest.raises(errors.TransactionalIdAuthorizationFailedError):
        bob.describe_transactions(["alice-txn"])


def test_an_idempotent_producer_needs_write_on_some_topic(cluster: LocalCluster, admin: Admin) -> None:
    admin.create_topic("ids", 1, 1)
    admin.create_acls([acl("ids", AclOperation.DESCRIBE, "User:carol")])  # sees the topic, may not write
    carol = Producer(**cluster.client_config("carol"), request_timeout_ms=10_000)
    with carol, pytest.raises((errors.ClusterAuthorizationFailedError, errors.TopicAuthorizationFailedError)):
        carol.send("ids", b"x", partition=0).get(timeout=30)
    admin.create_acls([acl("ids", AclOperation.WRITE, "User:carol")])  # KIP-679: enough for idempotence
    with Producer(**cluster.client_config("carol")) as producer:
        producer.send("ids", b"x", partition=0).get(timeout=30)


def test_consumer_groups_need_read_on_the_group(cluster: LocalCluster, admin: Admin) -> None:
    admin.create_topic("events", 1, 1)
    admin.create_acls([acl("events", AclOperation.READ, "User:bob")])

    def consume_in_group() -> list[bytes | None]:
        consumer = Consumer(**cluster.client_config("bob"), group_id="bob-group", auto_offset_reset="earliest")
        try:
            consumer.subscribe(["events"])
            got: list[bytes | None] = []
            for _ in range(60):
                got += [r.value for r in consumer.poll(timeout=0.5)]
                if got:
                    consumer.commit()
                    return got
            return got
        finally:
            consumer.close()

    with Producer(**cluster.client_config("admin")) as producer:
        producer.send("events", b"e1", partition=0).get(timeout=30)
    with pytest.raises(errors.GroupAuthorizationFailedError):
        consume_in_group()
    admin.create_acls([acl("bob-group", AclOperation.READ, "User:bob", rtype=ResourceType.GROUP)])
    assert consume_in_group() == [b"e1"]
    assert admin.list_consumer_group_offsets("bob-group")[TopicPartition("events", 0)] == 1


def test_altering_a_topic_s_configs_needs_alter_configs_on_it(cluster: LocalCluster, admin: Admin) -> None:
    admin.create_topic("tuned", 1, 1)
    with Admin(**cluster.client_config("alice")) as alice:
        with pytest.raises(errors.TopicAuthorizationFailedError, match="AlterConfigs"):
            alice.alter_topic_config("tuned", {"retention.ms": "60000"})
        admin.create_acls([acl("tuned", AclOperation.ALTER, "User:alice")])  # Alter is not AlterConfigs
        with pytest.raises(errors.TopicAuthorizationFailedError):
            alice.alter_topic_config("tuned", {"retention.ms": "60000"})
        admin.create_acls([acl("tuned", AclOperation.ALTER_CONFIGS, "User:alice")])
        alice.alter_topic_config("tuned", {"retention.ms": "60000"})
    assert admin.describe_topic("tuned").config["retention.ms"] == "60000"


def test_hanging_transaction_tools_need_read_and_cluster_action(cluster: LocalCluster, admin: Admin) -> None:
    admin.create_topic("held", 1, 1)
    tp = TopicPartition("held", 0)
    with Admin(**cluster.client_config("alice")) as alice:
        with pytest.raises(errors.TopicAuthorizationFailedError, match="Describe"):  # finding its leader
            alice.describe_producers([tp])
        admin.create_acls([acl("held", AclOperation.DESCRIBE, "User:alice")])
        with pytest.raises(errors.TopicAuthorizationFailedError, match="Read"):
            alice.describe_producers([tp])
        admin.create_acls([acl("held", AclOperation.READ, "User:alice")])
        assert alice.describe_producers([tp]) == {tp: []}
        # ending another producer's transaction is ClusterAction's (Kafka's WriteTxnMarkers), not a topic right
        admin.create_acls([acl("held", AclOperation.ALL, "User:alice")])
        with pytest.raises(errors.ClusterAuthorizationFailedError, match="ClusterAction"):
            alice.abort_transaction(tp, 1, 0, -1)
    # the super user gets the broker's own answer: nothing open to abort
    with pytest.raises(errors.InvalidTxnStateError, match="nothing to abort"):
        admin.abort_transaction(tp, 1, 0, -1)


def test_partition_reassignments_need_alter_and_describe_on_the_cluster(cluster: LocalCluster, admin: Admin) -> None:
    admin.create_topic("moved", 1, 1)
    with Admin(**cluster.client_config("alice")) as alice:
        with pytest.raises(errors.ClusterAuthorizationFailedError):
            alice.alter_partition_reassignments({("moved", 0): [0]})
        with pytest.raises(errors.ClusterAuthorizationFailedError):
            alice.list_partition_reassignments()
        refused = alice.describe_log_dirs()  # each broker answers for itself: every one refuses
        assert refused and all(isinstance(d.error, errors.ClusterAuthorizationFailedError) for d in refused.values())
        assert not any(d.replica_sizes for d in refused.values())
        admin.create_acls([acl("kafka-cluster", AclOperation.DESCRIBE, rtype=ResourceType.CLUSTER)])
        assert alice.list_partition_reassignments() == {}
        assert all(d.error is None for d in alice.describe_log_dirs().values())
        wait_for(
            lambda: any(TopicPartition("moved", 0) in d.replica_sizes for d in alice.describe_log_dirs().values()),
            timeout=10,
            what="moved-0 in the log dirs",
        )
        with pytest.raises(errors.ClusterAuthorizationFailedError):
            alice.alter_partition_reassignments({("moved", 0): [0]})
        admin.create_acls([acl("kafka-cluster", AclOperation.ALTER, rtype=ResourceType.CLUSTER)])
        assert alice.alter_partition_reassignments({("moved", 0): [0]}) == {TopicPartition("moved", 0): None}
