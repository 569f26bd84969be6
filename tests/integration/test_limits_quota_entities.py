"""Client quota entities beyond users on real brokers: client ids and users with client ids
(KIP-55's order), on gRPC and on the Kafka listener; their administration through Admin, the
Kafka listener's DescribeClientQuotas/AlterClientQuotas and `sluice configs`; who may change them.

As the other quota tests, the throttle is checked through the throttle time the broker reports
(its value tells which entity's rate applied: the first request of a fresh bucket overdraws it
by a known amount) and through lower bounds on time only.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaProducer
from kafka.protocol.admin import (
    AlterClientQuotasRequest,
    AlterClientQuotasResponse,
    DescribeClientQuotasRequest,
    DescribeClientQuotasResponse,
)

from sluice import errors
from sluice.acls import AclBinding, AclOperation, AclPermissionType, ResourcePatternType, ResourceType
from sluice.api.v1 import broker_pb2 as bpb
from sluice.api.v1 import records_pb2 as pb
from sluice.cli.app import main as cli
from sluice.client import (
    Admin,
    ClientQuotaAlteration,
    ClientQuotaEntity,
    ClientQuotaFilter,
    ClientQuotaFilterComponent,
    Producer,
)
from sluice.client._network import Cluster
from sluice.client._network import rpc as rpcs
from sluice.testing import LocalCluster

from .test_kafka_listener import connect
from .test_kafka_listener import read_frame as read_kafka_frame
from .test_kafka_security import tls_connect, tls_context
from .test_kafka_security_quotas import big_batch
from .test_kafka_security_quotas import produce_request as kafka_produce_request
from .test_limits_quotas import produce_request, throttle_of

P, C = "producer_byte_rate", "consumer_byte_rate"
INVALID_REQUEST, CLUSTER_AUTHORIZATION_FAILED = 42, 31
Op = ClientQuotaAlteration.Op


def entity(user: str | None = "", client: str | None = "") -> ClientQuotaEntity:
    """An entity: "" leaves a component out, None is the default entity of its type."""
    entries: dict[str, str | None] = {}
    if user != "":
        entries["user"] = user
    if client != "":
        entries["client-id"] = client
    return ClientQuotaEntity(entries)


def alter(admin: Admin, target: ClientQuotaEntity, key: str, value: float | None) -> None:
    admin.alter_client_quotas([ClientQuotaAlteration(target, [Op(key, value)])])


def expected_ms(nbytes: int, rate: int) -> int:
    """The throttle time of the first request of ``nbytes`` into a fresh bucket of ``rate`` B/s."""
    return int((nbytes - rate) * 1000 / rate) + 1


def kafka_ask(cluster: LocalCluster, request: Any, response_class: Any, client_id: str, who: str | None = None) -> Any:
    """One request to the Kafka listener with ``client_id`` in its header (TLS as ``User:<who>`` if given)."""
    with tls_connect(cluster, tls_context(cluster, who)) if who else connect(cluster) as sock:
        request.with_header(correlation_id=7, client_id=client_id)
        sock.sendall(bytes(request.encode(header=True, framed=True)))
        return response_class.decode(read_kafka_frame(sock), header=True)


@pytest.fixture(scope="module")
def pcluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """One plaintext broker with a Kafka listener and no broker-wide quota (principal User:ANONYMOUS)."""
    with LocalCluster(brokers=1, data_dir=tmp_path_factory.mktemp("entities"), kafka_listener=True) as c:
        with Admin(bootstrap_servers=c.bootstrap_servers) as admin:
            admin.create_topic("e", partitions=1, replication_factor=1)
        yield c


@pytest.fixture
def admin(pcluster: LocalCluster) -> Iterator[Admin]:
    """An Admin; every quota is removed after the test (tests share the cluster)."""
    a = Admin(bootstrap_servers=pcluster.bootstrap_servers)
    yield a
    for target, values in a.describe_client_quotas().items():
        a.alter_client_quotas([ClientQuotaAlteration(target, [Op(k, None) for k in values])])
    a.close()


def test_a_client_id_quota_throttles_that_client_id_and_not_another(pcluster: LocalCluster, admin: Admin) -> None:
    rate = 200_000
    alter(admin, entity(client="slow-app"), P, rate)
    addr = pcluster.bootstrap_servers
    slow, fast = Cluster(addr, client_id="slow-app"), Cluster(addr, client_id="fast-app")
    try:
        assert throttle_of(fast, addr, "e", 0, 300_000) == 0
        assert throttle_of(fast, addr, "e", 0, 300_000) == 0  # no quota for this client id
        assert throttle_of(slow, addr, "e", 0, 300_000) > 0
    finally:
        slow.close()
        fast.close()
    # a Sluice Producer sends its client_id: with the client id's quota it cannot go faster
    producer = Producer(bootstrap_servers=addr, client_id="slow-app", linger_ms=0, max_in_flight=1)
    started = time.monotonic()
    for i in range(12):  # 600 kB at 200 kB/s, the bucket overdrawn above: at least 2 s
        producer.send("e", value=bytes([i]) * 50_000, partition=0).result(timeout=60)
    took = time.monotonic() - started
    producer.close()
    assert took >= 1.5, f"600 kB at {rate} B/s took only {took:.1f} s"


def fetch_throttle(cluster: Cluster, addr: str, topic: str) -> tuple[int, int]:
    """One raw Fetch from offset 0: (bytes of records, throttle time)."""
    wanted = bpb.FetchPartition(partition=0, fetch_offset=0, partition_max_bytes=1 << 20, current_leader_epoch=-1)
    request = bpb.FetchRequest(
        max_wait_ms=0, min_bytes=1, isolation_level=pb.READ_UNCOMMITTED, replica_id=-1,
        topics=[bpb.FetchTopic(name=topic, partitions=[wanted])],
    )  # fmt: skip
    resp = cluster.call(addr, rpcs.FETCH, request, 60)
    part = resp.topics[0].partitions[0]
    assert part.error_code == pb.NONE, resp
    return sum(len(b.records) for b in part.batches), int(resp.throttle_time_ms)


def test_a_client_id_consumer_quota_throttles_fetches_of_that_client_id(pcluster: LocalCluster, admin: Admin) -> None:
    addr = pcluster.bootstrap_servers
    admin.create_topic("ef", partitions=1, replication_factor=1)
    writer = Cluster(addr, client_id="writer")
    throttle_of(writer, addr, "ef", 0, 400_000)
    writer.close()
    alter(admin, entity(client="slow-reader"), C, 100_000)
    slow, other = Cluster(addr, client_id="slow-reader"), Cluster(addr, client_id="other-reader")
    try:
        size, ms = fetch_throttle(other, addr, "ef")
        assert size >= 400_000 and ms == 0
        size, ms = fetch_throttle(slow, addr, "ef")
        assert size >= 400_000 and ms > 0
    finally:
        slow.close()
        other.close()


def test_user_and_client_over_user_over_client_and_the_quota_is_the_entitys(
    pcluster: LocalCluster, admin: Admin
) -> None:
    addr = pcluster.bootstrap_servers
    size = produce_request("e", 0, 600_000).ByteSize()
    rates = {entity("ANONYMOUS", "app1"): 100_000, entity("ANONYMOUS"): 200_000, entity(client="app1"): 300_000}
    for target, rate in rates.items():
        alter(admin, target, P, rate)
    app1 = Cluster(addr, client_id="app1")
    try:
        for target, rate in rates.items():  # each removal lets the next entity in the order apply
            assert throttle_of(app1, addr, "e", 0, 600_000) == expected_ms(size, rate), target
            alter(admin, target, P, None)
        assert throttle_of(app1, addr, "e", 0, 600_000) == 0
        # a client-id quota is shared by every connection with that client id, as Kafka's
        alter(admin, entity(client="app2"), P, 400_000)
        first, second = Cluster(addr, client_id="app2"), Cluster(addr, client_id="app2")
        assert throttle_of(first, addr, "e", 0, 300_000) == 0
        assert throttle_of(second, addr, "e", 0, 300_000) > 0
        first.close()
        second.close()
        # a default client id quota applies to each client id on its own
        alter(admin, entity(client=None), P, 250_000)
        for client in ("x1", "x2"):
            one = Cluster(addr, client_id=client)
            assert throttle_of(one, addr, "e", 0, 600_000) == expected_ms(size, 250_000)
            one.close()
    finally:
        app1.close()


def test_kafka_clients_are_throttled_by_their_client_id(pcluster: LocalCluster, admin: Admin) -> None:
    rate = 50_000
    alter(admin, entity(client="kp-slow"), P, rate)
    records = big_batch(2 * rate)  # the first request overdraws a fresh bucket
    request = kafka_produce_request("e", records, version=9)
    other = kafka_ask(pcluster, request, response_class(request), "kp-other")
    assert other.throttle_time_ms == 0
    throttled = kafka_ask(pcluster, kafka_produce_request("e", records, version=9), response_class(request), "kp-slow")
    assert throttled.throttle_time_ms > 0
    # kafka-python sees it: its throttle-time metric records the broker's throttle_time_ms
    producer = KafkaProducer(**pcluster.kafka_client_config(), client_id="kp-slow", acks=1, linger_ms=5)
    for _ in range(2 * rate // 1000):
        producer.send("e", bytes(1000), partition=0)
    producer.flush(timeout=60)
    metrics = producer.metrics()
    producer.close()
    seen = [v for group in metrics.values() for k, v in group.items() if k == "throttle-time-max"]
    assert seen and max(seen) > 0, metrics


def response_class(request: Any) -> Any:
    from .test_kafka_security import response_class as of

    return of(request)


def kafka_alter(cluster: LocalCluster, components: list[tuple[str, str | None]], ops: list[tuple[str, float, bool]],
                who: str | None = None) -> Any:  # fmt: skip
    entry = AlterClientQuotasRequest.EntryData(
        entity=[AlterClientQuotasRequest.EntryData.EntityData(entity_type=t, entity_name=n) for t, n in components],
        ops=[AlterClientQuotasRequest.EntryData.OpData(key=k, value=v, remove=r) for k, v, r in ops],
    )
    request = AlterClientQuotasRequest[1](entries=[entry], validate_only=False)
    [result] = kafka_ask(cluster, request, AlterClientQuotasResponse[1], "quota-admin", who).entries
    return result


def kafka_describe(cluster: LocalCluster, components: list[tuple[str, int, str | None]], strict: bool = False,
                   who: str | None = None) -> Any:  # fmt: skip
    data = DescribeClientQuotasRequest.ComponentData
    request = DescribeClientQuotasRequest[1](
        components=[data(entity_type=t, match_type=m, match=n) for t, m, n in components], strict=strict
    )
    return kafka_ask(cluster, request, DescribeClientQuotasResponse[1], "quota-admin", who)


def described(response: Any) -> dict[tuple[tuple[str, str | None], ...], dict[str, float]]:
    assert response.error_code == 0, response
    return {
        tuple((e.entity_type, e.entity_name) for e in entry.entity): {v.key: v.value for v in entry.values}
        for entry in response.entries
    }


def test_the_kafka_listener_alters_and_describes_client_quotas(pcluster: LocalCluster, admin: Admin) -> None:
    result = kafka_alter(pcluster, [("user", "alice"), ("client-id", "app1")], [(P, 1024.0, False), (C, 2048.0, False)])
    assert result.error_code == 0, result
    assert kafka_alter(pcluster, [("client-id", None)], [(C, 4096.0, False)]).error_code == 0
    # the gRPC admin reads what the Kafka listener wrote, and the other way round
    assert admin.describe_client_quotas() == {
        entity("alice", "app1"): {P: 1024.0, C: 2048.0},
        entity(client=None): {C: 4096.0},
    }
    alter(admin, entity(user=None, client="app9"), P, 8192)
    assert described(kafka_describe(pcluster, [("client-id", 0, "app9")])) == {
        (("user", None), ("client-id", "app9")): {P: 8192.0}
    }
    assert described(kafka_describe(pcluster, [("client-id", 1, None)], strict=True)) == {
        (("client-id", None),): {C: 4096.0}
    }
    assert set(described(kafka_describe(pcluster, [("user", 2, None)]))) == {(("user", "alice"), ("client-id", "app1"))}
    assert kafka_alter(pcluster, [("user", "alice"), ("client-id", "app1")], [(P, 0.0, True)]).error_code == 0
    assert admin.describe_client_quotas(
        ClientQuotaFilter.contains_only(
            [
                ClientQuotaFilterComponent.of_entity("user", "alice"),
                ClientQuotaFilterComponent.of_entity("client-id", "app1"),
            ]
        )
    ) == {entity("alice", "app1"): {C: 2048.0}}
    # bad inputs: INVALID_REQUEST naming what is wrong, nothing written
    for components, ops, word in (
        ([("client-id", "c")], [("request_percentage", 50.0, False)], "request_percentage"),
        ([("client-id", "c")], [("producer_byte_rat", 5.0, False)], "producer_byte_rat"),
        ([("client-id", "c")], [(P, -5.0, False)], "positive"),
        ([("group", "g")], [(P, 5.0, False)], "unknown quota entity type 'group'"),
        ([("ip", "10.0.0.1")], [(P, 5.0, False)], "ip"),
    ):
        result = kafka_alter(pcluster, components, ops)
        assert result.error_code == INVALID_REQUEST and word in result.error_message, result
    response = kafka_describe(pcluster, [("users", 0, "alice")])
    assert response.error_code == INVALID_REQUEST and "users" in response.error_message
    assert entity(client="c") not in admin.describe_client_quotas()


def test_admin_refuses_bad_inputs_by_name(admin: Admin) -> None:
    for target, key, value, word in (
        (entity(client="c"), "request_percentage", 50, "request_percentage"),
        (entity(client="c"), P, -1, "positive"),
        (entity(client="c"), P, 1.5, "whole"),
        (ClientQuotaEntity({"ip": None}), P, 10, "ip"),
        (ClientQuotaEntity({"clients": "c"}), P, 10, "unknown quota entity type 'clients'"),
    ):
        with pytest.raises(errors.InvalidRequestError, match=word):
            alter(admin, target, key, value)
    with pytest.raises(errors.InvalidRequestError, match="unknown quota entity type"):
        admin.describe_client_quotas(ClientQuotaFilter.contains([ClientQuotaFilterComponent.of_entity("host", "h")]))
    assert admin.describe_client_quotas() == {}


def test_sluice_configs_takes_kafka_configs_entity_options(
    pcluster: LocalCluster, admin: Admin, capsys: pytest.CaptureFixture[str]
) -> None:
    common = ["--bootstrap-server", pcluster.bootstrap_servers]
    assert cli(["configs", "--alter", "--entity-type", "users", "--entity-name", "alice", "--entity-type", "clients",
                "--entity-name", "app1", "--add-config", "producer_byte_rate=1048576,consumer_byte_rate=2048",
                *common]) == 0  # fmt: skip
    assert cli(["configs", "--alter", "--entity-type", "clients", "--entity-default",
                "--add-config", "consumer_byte_rate=4096", *common]) == 0  # fmt: skip
    assert cli(["configs", "--alter", "--entity-type", "clients", "--entity-name", "app2",
                "--add-config", "producer_byte_rate=512", *common]) == 0  # fmt: skip
    assert admin.describe_client_quotas() == {
        entity("alice", "app1"): {P: 1048576.0, C: 2048.0},
        entity(client=None): {C: 4096.0},
        entity(client="app2"): {P: 512.0},
    }
    capsys.readouterr()
    assert cli(["configs", "--describe", "--entity-type", "users", "--entity-type", "clients", "--json", *common]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert sorted((r["user"], r["client_id"], r["key"], r["value"]) for r in rows) == [
        ("alice", "app1", C, 2048.0),
        ("alice", "app1", P, 1048576.0),
    ]
    assert cli(["configs", "--describe", "--entity-type", "users", "--entity-type", "clients", *common]) == 0
    out = capsys.readouterr().out
    assert "1048576" in out and "2048" in out and "e+" not in out  # rates as written, not 1.04858e+06
    assert cli(["configs", "--describe", "--entity-type", "clients", *common]) == 0  # named client ids only
    out = capsys.readouterr().out
    assert "app2" in out and "512" in out and "<default>" not in out and "alice" not in out
    assert cli(["configs", "--describe", "--entity-type", "clients", "--entity-default", *common]) == 0
    out = capsys.readouterr().out
    assert "<default>" in out and "4096" in out and "app2" not in out
    assert cli(["configs", "--alter", "--entity-type", "users", "--entity-name", "alice", "--entity-type", "clients",
                "--entity-name", "app1", "--delete-config", "producer_byte_rate", *common]) == 0  # fmt: skip
    assert admin.describe_client_quotas()[entity("alice", "app1")] == {C: 2048.0}
    # refused: by the broker (named in the message), or as usage errors
    assert cli(["configs", "--alter", "--entity-type", "clients", "--entity-name", "c",
                "--add-config", "request_percentage=50", *common]) == 1  # fmt: skip
    assert "request_percentage" in capsys.readouterr().err
    assert cli(["configs", "--alter", "--entity-type", "clients", "--entity-name", "c",
                "--add-config", "producer_byte_rate=-5", *common]) == 1  # fmt: skip
    assert "positive" in capsys.readouterr().err
    assert cli(["configs", "--alter", "--entity-type", "users", "--entity-type", "clients", "--entity-name", "c",
                "--add-config", "producer_byte_rate=5", *common]) == 2  # fmt: skip
    assert "after each --entity-type" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli(["configs", "--describe", "--entity-type", "ips", *common])
    assert entity(client="c") not in admin.describe_client_quotas()


def test_only_who_may_alter_configs_changes_client_quotas_on_both_protocols(tmp_path: Path) -> None:
    with LocalCluster(brokers=1, data_dir=tmp_path / "s", secure=True, kafka_listener=True) as cluster:
        with Admin(**cluster.client_config("admin")) as admin:
            admin.create_acls(
                [AclBinding(ResourceType.CLUSTER, "kafka-cluster", ResourcePatternType.LITERAL, "User:ops", "*", op,
                            AclPermissionType.ALLOW)
                 for op in (AclOperation.ALTER_CONFIGS, AclOperation.DESCRIBE_CONFIGS)]
            )  # fmt: skip
        # gRPC: alice may not, ops may (within the ACL watch)
        with Admin(**cluster.client_config("alice")) as alice:
            with pytest.raises(errors.ClusterAuthorizationFailedError):
                alter(alice, entity(client="app1"), P, 1000)
            with pytest.raises(errors.ClusterAuthorizationFailedError):
                alice.describe_client_quotas()
        deadline = time.monotonic() + 20
        with Admin(**cluster.client_config("ops")) as ops:
            while True:
                try:
                    alter(ops, entity(client="app1"), P, 1000)
                    break
                except errors.ClusterAuthorizationFailedError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)
            assert ops.describe_client_quotas() == {entity(client="app1"): {P: 1000.0}}
        # Kafka listener: the same rules, Kafka's error codes
        refused = kafka_alter(cluster, [("client-id", "app1")], [(P, 5.0, False)], who="alice")
        assert refused.error_code == CLUSTER_AUTHORIZATION_FAILED and "AlterConfigs" in refused.error_message
        assert kafka_describe(cluster, [], who="alice").error_code == CLUSTER_AUTHORIZATION_FAILED
        assert kafka_alter(cluster, [("client-id", "app1")], [(C, 5.0, False)], who="ops").error_code == 0
        assert described(kafka_describe(cluster, [], who="ops")) == {(("client-id", "app1"),): {P: 1000.0, C: 5.0}}


def test_kafka_configs_sh_alters_and_describes_client_id_quotas(pcluster: LocalCluster, admin: Admin) -> None:
    """Apache Kafka's own kafka-configs (kafka.admin.ConfigCommand) against the Kafka listener."""
    from .test_kafka_alter_configs import config_command

    out = config_command(pcluster, "--alter", "--entity-type", "users", "--entity-name", "alice",
                         "--entity-type", "clients", "--entity-name", "app1",
                         "--add-config", "producer_byte_rate=1024,consumer_byte_rate=2048")  # fmt: skip
    assert "Completed updating config" in out, out
    assert admin.describe_client_quotas() == {entity("alice", "app1"): {P: 1024.0, C: 2048.0}}
    config_command(pcluster, "--alter", "--entity-type", "clients", "--entity-default",
                   "--add-config", "producer_byte_rate=4096")  # fmt: skip
    shown = config_command(pcluster, "--describe", "--entity-type", "clients", "--entity-default")
    assert "producer_byte_rate=4096" in shown, shown
    shown = config_command(pcluster, "--describe", "--entity-type", "users", "--entity-name", "alice",
                           "--entity-type", "clients", "--entity-name", "app1")  # fmt: skip
    assert "producer_byte_rate=1024" in shown and "consumer_byte_rate=2048" in shown, shown
    config_command(pcluster, "--alter", "--entity-type", "users", "--entity-name", "alice", "--entity-type",
                   "clients", "--entity-name", "app1", "--delete-config", "producer_byte_rate")  # fmt: skip
    assert admin.describe_client_quotas()[entity("alice", "app1")] == {C: 2048.0}
