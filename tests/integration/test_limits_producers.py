"""Producer states and transactional ids on a real broker: expiry (producer.id.expiration.ms) and caps."""

from __future__ import annotations

from pathlib import Path

import pytest

from sluice import errors
from sluice.api.v1 import records_pb2 as pb
from sluice.client import Admin, Producer
from sluice.testing import LocalCluster
from tests.support.waiting import wait_for

from .helpers import read_topic, values
from .wire import Wire, batch_of


def test_idle_producer_states_expire_and_the_producer_goes_on(tmp_path: Path) -> None:
    config = {"producer.id.expiration.ms": 2000, "producer.id.expiration.check.interval.ms": 300}
    with LocalCluster(brokers=1, data_dir=tmp_path / "c", config=config) as cluster:
        admin = Admin(bootstrap_servers=cluster.bootstrap_servers)
        admin.create_topic("orders", partitions=1, replication_factor=1)
        admin.create_topic("probe", partitions=1, replication_factor=1)
        producer = Producer(bootstrap_servers=cluster.bootstrap_servers, linger_ms=0)
        for i in range(3):
            producer.send("orders", value=b"v%d" % i, partition=0).result(timeout=30)
        # A probe producer on the wire: its next sequence is refused once its state has expired.
        wire = Wire(cluster.bootstrap_servers)
        pid, epoch = wire.init_producer_id()
        seq = [0]

        def probe() -> int:
            resp = wire.produce(
                "probe", 0, batch_of([b"p"], producer_id=pid, producer_epoch=epoch, base_sequence=seq[0])
            )
            if resp.error_code == pb.NONE:
                seq[0] += 1
            return resp.error_code

        assert probe() == pb.NONE  # sequence 0 creates its state
        # each probe that finds the state writes (and so renews it): probe less often than it expires
        wait_for(
            lambda: probe() == pb.UNKNOWN_PRODUCER_ID, timeout=40, interval=3.0, what="the probe's state to expire"
        )
        # the expiry is persisted: a restarted broker does not bring the state back
        cluster.restart(0)
        wire.close()
        wire = Wire(cluster.bootstrap_servers)
        codes: list[int] = []

        def settled() -> bool:  # the restarted broker leads the partition again (bounded wait)
            codes.append(probe())
            return (
                codes[-1] == pb.NONE
                or not errors.error_class(codes[-1]).retriable
                or codes[-1] == pb.UNKNOWN_PRODUCER_ID
            )

        wait_for(settled, timeout=30, interval=0.5, what="the restarted broker to lead the partition again")
        assert codes[-1] == pb.UNKNOWN_PRODUCER_ID, codes
        # the real producer's state expired too: its next record is sent with a new epoch, not failed
        producer.send("orders", value=b"v3", partition=0).result(timeout=60)
        producer.close()
        assert values(read_topic(cluster.bootstrap_servers, "orders")) == [b"v0", b"v1", b"v2", b"v3"]
        wire.close()
        admin.close()


def test_producer_states_per_partition_are_capped(tmp_path: Path) -> None:
    key = "producer.id.max.count.per.partition"
    with LocalCluster(brokers=1, data_dir=tmp_path / "c", config={key: 2}) as cluster:
        admin = Admin(bootstrap_servers=cluster.bootstrap_servers)
        admin.create_topic("capped", partitions=2, replication_factor=1)
        producers = [Producer(bootstrap_servers=cluster.bootstrap_servers, linger_ms=0) for _ in range(3)]
        try:
            producers[0].send("capped", value=b"a", partition=0).result(timeout=30)
            producers[1].send("capped", value=b"b", partition=0).result(timeout=30)
            with pytest.raises(errors.PolicyViolationError) as info:
                producers[2].send("capped", value=b"c", partition=0).result(timeout=30)
            assert key in str(info.value) and not info.value.retriable
            producers[2].send("capped", value=b"d", partition=1).result(timeout=30)  # another partition has room
            producers[0].send("capped", value=b"e", partition=0).result(timeout=30)  # known producers go on
        finally:
            for p in producers:
                p.close()
        assert sorted(values(read_topic(cluster.bootstrap_servers, "capped"))) == [b"a", b"b", b"d", b"e"]
        admin.close()


def test_transactional_ids_per_coordinator_are_capped(tmp_path: Path) -> None:
    key = "transactional.id.max.count"
    with LocalCluster(brokers=1, data_dir=tmp_path / "c", config={key: 2}) as cluster:
        producers = [
            Producer(bootstrap_servers=cluster.bootstrap_servers, transactional_id=f"tx-{i}") for i in range(3)
        ]
        try:
            producers[0].init_transactions()
            producers[1].init_transactions()
            with pytest.raises(errors.PolicyViolationError) as info:
                producers[2].init_transactions()
            assert key in str(info.value) and "'tx-2'" in str(info.value)
            # an id the coordinator holds is not new: a second instance of it is served
            again = Producer(bootstrap_servers=cluster.bootstrap_servers, transactional_id="tx-0")
            again.init_transactions()
            again.close()
        finally:
            for p in producers:
                p.close()
