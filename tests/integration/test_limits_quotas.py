"""Byte-rate quotas on real brokers: clients wait out throttle_time_ms (KIP-219), per-user overrides
(Admin.alter_client_quotas, `sluice configs`) followed by every broker, and who may change them."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

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
    Consumer,
    Producer,
    TopicPartition,
)
from sluice.client._network import Cluster
from sluice.client._network import rpc as rpcs
from sluice.client._network.security import ClientSecurity
from sluice.records import build_batch
from sluice.testing import LocalCluster
from tests.support.waiting import wait_for

HELD = "did not wait out its throttle time"


def produce_request(topic: str, partition: int, size: int) -> bpb.ProduceRequest:
    data = bpb.ProducePartitionData(partition=partition, batch=build_batch([(None, b"q" * size)]))
    return bpb.ProduceRequest(acks=1, timeout_ms=30_000, topics=[bpb.ProduceTopicData(name=topic, partitions=[data])])


def throttle_of(cluster: Cluster, addr: str, topic: str, partition: int, size: int) -> int:
    """One raw Produce's throttle time. Like a client, it retries while the leader has not yet
    learned of a topic just created (each broker polls the metadata; CreateTopics does not wait)."""
    deadline = time.monotonic() + 10
    while True:
        resp = cluster.call(addr, rpcs.PRODUCE, produce_request(topic, partition, size), 60)
        code = resp.topics[0].partitions[0].error_code
        if code in (pb.UNKNOWN_TOPIC_OR_PARTITION, pb.NOT_LEADER_OR_FOLLOWER) and time.monotonic() < deadline:
            time.sleep(0.1)
            continue
        assert code == pb.NONE, resp
        return int(resp.throttle_time_ms)


def test_producer_and_consumer_wait_out_the_throttle_time(tmp_path: Path) -> None:
    rate = 200_000
    config = {"quota.producer.default": rate, "quota.consumer.default": rate}
    with LocalCluster(brokers=1, data_dir=tmp_path / "c", config=config) as cluster:
        log = tmp_path / "c" / "broker-0.log"
        admin = Admin(bootstrap_servers=cluster.bootstrap_servers)
        admin.create_topic("q", partitions=1, replication_factor=1)
        producer = Producer(bootstrap_servers=cluster.bootstrap_servers, linger_ms=0, max_in_flight=1)
        started = time.monotonic()
        for i in range(12):  # 600 kB at 200 kB/s: 200 kB of burst, then about 2 s
            producer.send("q", value=bytes([i]) * 50_000, partition=0).result(timeout=60)
        took = time.monotonic() - started
        producer.close()
        assert took >= 1.5, f"600 kB at {rate} B/s took only {took:.1f} s"
        consumer = Consumer(
            bootstrap_servers=cluster.bootstrap_servers, group_id=None, max_partition_fetch_bytes=100_000
        )
        consumer.assign([TopicPartition("q", 0)])
        consumer.seek(TopicPartition("q", 0), 0)
        got = 0
        deadline = time.monotonic() + 60
        while got < 12 and time.monotonic() < deadline:
            got += len(consumer.poll(timeout=1.0))
        consumer.close()
        assert got == 12
        # The broker never had to hold a request back: both clients waited themselves (KIP-219).
        assert HELD not in log.read_text()
        # A client that does not wait (the raw wire) is held back by the broker instead.
        raw = Cluster(cluster.bootstrap_servers)
        for _ in range(4):
            throttle_of(raw, cluster.bootstrap_servers, "q", 0, 100_000)
        raw.close()
        wait_for(lambda: HELD in log.read_text(), timeout=10, what="the broker's log line")
        assert "held a Produce of User:ANONYMOUS" in log.read_text()
        admin.close()


def test_user_quotas_are_altered_described_and_followed_by_every_broker(tmp_path: Path) -> None:
    with LocalCluster(brokers=2, data_dir=tmp_path / "c") as cluster:
        admin = Admin(bootstrap_servers=cluster.bootstrap_servers)
        admin.create_topic("u", partitions=2, replication_factor=1)
        leaders = {p.partition: p.leader for p in admin.describe_topic("u").partitions}
        addrs = cluster.bootstrap_servers.split(",")
        raw = Cluster(cluster.bootstrap_servers)
        for p, b in leaders.items():  # no quota: never throttled
            assert throttle_of(raw, addrs[b], "u", p, 300_000) == 0
        anonymous = ClientQuotaEntity({"user": "ANONYMOUS"})  # the principal of plaintext clients
        admin.alter_client_quotas(
            [ClientQuotaAlteration(anonymous, [ClientQuotaAlteration.Op("producer_byte_rate", 100_000)])]
        )
        assert admin.describe_client_quotas() == {anonymous: {"producer_byte_rate": 100_000.0}}
        assert (
            admin.describe_client_quotas(
                ClientQuotaFilter.contains([ClientQuotaFilterComponent.of_entity("user", "bob")])
            )
            == {}
        )
        for p, b in leaders.items():  # every broker follows it (within its metadata poll)
            wait_for(
                lambda p=p, b=b: throttle_of(raw, addrs[b], "u", p, 300_000) > 0,  # type: ignore[misc]
                timeout=20,
                interval=0.5,
                what=f"broker {b} to apply the quota",
            )
        admin.alter_client_quotas(
            [ClientQuotaAlteration(anonymous, [ClientQuotaAlteration.Op("producer_byte_rate", None)])]
        )
        assert admin.describe_client_quotas() == {}
        for p, b in leaders.items():
            wait_for(
                lambda p=p, b=b: throttle_of(raw, addrs[b], "u", p, 300_000) == 0,  # type: ignore[misc]
                timeout=20,
                interval=0.5,
                what=f"broker {b} to drop the quota",
            )
        # what Sluice does not keep is refused by name
        op = ClientQuotaAlteration.Op
        for bad, word in (
            (ClientQuotaAlteration(anonymous, [op("request_percentage", 50)]), "request_percentage"),
            (ClientQuotaAlteration(ClientQuotaEntity({"ip": "10.0.0.1"}), [op("producer_byte_rate", 1)]), "ip"),
            (ClientQuotaAlteration(anonymous, [op("producer_byte_rate", -5)]), "positive"),
        ):
            with pytest.raises(errors.InvalidRequestError, match=word):
                admin.alter_client_quotas([bad])
        raw.close()
        admin.close()


def test_only_who_may_alter_configs_sets_quotas_and_a_user_quota_applies_to_that_user(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with LocalCluster(brokers=1, data_dir=tmp_path / "c", secure=True) as cluster:
        admin = Admin(**cluster.client_config("admin"))
        admin.create_topic("s", partitions=1, replication_factor=1)
        for user in ("alice", "bob"):
            admin.create_acls([AclBinding(ResourceType.TOPIC, "s", ResourcePatternType.LITERAL, f"User:{user}", "*",
                                          AclOperation.WRITE, AclPermissionType.ALLOW)])  # fmt: skip
        alice_admin = Admin(**cluster.client_config("alice"))
        entity = ClientQuotaEntity({"user": "alice"})
        with pytest.raises(errors.ClusterAuthorizationFailedError):
            alice_admin.alter_client_quotas(
                [ClientQuotaAlteration(entity, [ClientQuotaAlteration.Op("producer_byte_rate", 1)])]
            )
        with pytest.raises(errors.ClusterAuthorizationFailedError):
            alice_admin.describe_client_quotas()
        # the super user sets it with the CLI, as with kafka-configs.sh
        props = tmp_path / "admin.properties"
        cfg = cluster.client_config("admin")
        props.write_text(
            f"security.protocol=SSL\nssl.ca.location={cfg['ssl_cafile']}\n"
            f"ssl.certificate.location={cfg['ssl_certfile']}\nssl.key.location={cfg['ssl_keyfile']}\n"
        )
        common = ["--bootstrap-server", cluster.bootstrap_servers, "--command-config", str(props)]
        assert cli(["configs", "--alter", "--entity-type", "users", "--entity-name", "alice",
                    "--add-config", "producer_byte_rate=100000", *common]) == 0  # fmt: skip
        assert cli(["configs", "--describe", "--entity-type", "users", *common]) == 0
        out = capsys.readouterr().out
        assert "alice" in out and "producer_byte_rate" in out and "100000" in out
        clients = {}
        for user in ("alice", "bob"):
            c = cluster.client_config(user)
            clients[user] = Cluster(
                c["bootstrap_servers"],
                security=ClientSecurity.build("SSL", c["ssl_cafile"], c["ssl_certfile"], c["ssl_keyfile"]),
            )
        addr = cluster.bootstrap_servers
        assert throttle_of(clients["alice"], addr, "s", 0, 300_000) > 0
        assert throttle_of(clients["bob"], addr, "s", 0, 300_000) == 0
        for c2 in clients.values():
            c2.close()
        alice_admin.close()
        admin.close()
