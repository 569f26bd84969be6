"""Leaders ask the controller for ISR changes (Kafka's AlterPartition), and write them themselves when
it does not answer: three real brokers and the local controller over the SQLite store.

The controller's failure timeout is long (60 s), so a paused follower is never found dead by the
controller: only its leader's lag check takes it out of the ISR, and every ISR change here is a
leader's. ``metadata.cut`` (a test hook) cuts the controller from the store for the fallback.
"""

from __future__ import annotations

from pathlib import Path

from sluice.client import Admin, Producer
from sluice.metadata import documents, keys
from sluice.metadata.documents import IsrRequestsDocument
from sluice.testing import LocalCluster
from tests.support.waiting import wait_for

from .helpers import checked, read_topic, values

CONFIG = {"replica.lag.time.max.ms": "1500", "min.insync.replicas": "2", "sluice.test.hooks": "metadata.cut"}
TOPIC = "asked"


def _isr(admin: Admin) -> list[int]:
    return sorted(admin.describe_topic(TOPIC).partitions[0].isr)


def _produce(cluster: LocalCluster, first: int, count: int) -> None:
    producer = Producer(bootstrap_servers=cluster.bootstrap_servers, acks="all", linger_ms=1)
    for f in [producer.send(TOPIC, value=b"v%d" % i) for i in range(first, first + count)]:
        f.result(timeout=30)
    producer.close()


def test_isr_changes_go_through_the_controller_and_without_it_after_the_timeout(tmp_path: Path) -> None:
    with checked(LocalCluster(brokers=3, data_dir=tmp_path, config=CONFIG, failure_timeout_ms=60_000)) as cluster:
        admin = Admin(bootstrap_servers=cluster.bootstrap_servers)
        admin.create_topic(TOPIC, partitions=1, replication_factor=3)
        _produce(cluster, 0, 100)
        leader = cluster.leader(TOPIC, 0)
        follower = next(b for b in range(3) if b != leader)
        controller_log = cluster.data_dir / "controller.log"

        # A follower stops fetching: its leader asks the controller to take it out of the ISR.
        cluster.pause(follower)
        wait_for(lambda: follower not in _isr(admin), timeout=20, what="the ISR to shrink")
        asked = documents.read(cluster.metadata, keys.isr_requests(leader), IsrRequestsDocument)
        assert asked is not None and asked.value.broker_id == leader
        assert any(r.topic == TOPIC and follower not in r.isr for r in asked.value.requests)
        assert f"(asked by broker {leader})" in controller_log.read_text()
        _produce(cluster, 100, 50)  # acks=all with two in-sync replicas

        # It comes back and catches up: the leader asks for it back.
        cluster.resume(follower)
        wait_for(lambda: _isr(admin) == [0, 1, 2], timeout=30, what="the follower back in the ISR")
        epoch = cluster.partition_state(TOPIC, 0).get("partition_epoch", 0)
        assert epoch >= 2  # every change counted one partition epoch

        # The controller is cut off from the store: requests go unanswered, and after
        # ISR_REQUEST_TIMEOUT_S the leader writes the change itself.
        cluster.cut_metadata(None)
        try:
            cluster.pause(follower)
            wait_for(lambda: follower not in _isr(admin), timeout=30, what="the ISR to shrink without the controller")
            assert "writing them directly" in cluster.broker(leader).log_path.read_text()
            _produce(cluster, 150, 50)
        finally:
            cluster.cut_metadata(None, cut=False)
            cluster.resume(follower)
        wait_for(lambda: _isr(admin) == [0, 1, 2], timeout=30, what="the follower back in the ISR")
        assert values(read_topic(cluster.bootstrap_servers, TOPIC)) == [b"v%d" % i for i in range(200)]
