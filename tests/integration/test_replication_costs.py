"""What a replicated write and a replicated transaction cost the brokers, counted (docs/performance.md).

Three real brokers, replication factor 3. The figures are counts from every broker's metrics
endpoint, not timings, so they hold on a busy machine:

* a parked long poll (a follower's ReplicaFetch, a consumer's Fetch) is woken only by a change
  to one of its own partitions: no wake-up finds nothing to answer (before, every append and
  every high-watermark move anywhere on the broker woke every parked request);
* a producer's next transaction starts with one AddPartitionsToTxn: the coordinator waits for
  the previous transaction's completion instead of answering CONCURRENT_TRANSACTIONS into a
  client retry loop.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sluice.client import Admin, Consumer, Producer, TopicPartition
from sluice.testing import LocalCluster, Scrape, scrape

BROKERS = 3
CONFIG = {
    # the internal topics' partitions are in every follower's fetch, as in production
    "transaction.state.log.num.partitions": 10,
    "offsets.topic.num.partitions": 10,
}


def scrape_all(cluster: LocalCluster) -> list[Scrape]:
    return [scrape(cluster.metrics_url(i)) for i in range(BROKERS)]


def total(scrapes: list[Scrape], name: str, **labels: str) -> float:
    return sum(s.total(name, **labels) for s in scrapes)


def delta(before: list[Scrape], after: list[Scrape], name: str, **labels: str) -> float:
    return total(after, name, **labels) - total(before, name, **labels)


def wait_until_every_broker_hosts(cluster: LocalCluster, topic: str, partitions: int, timeout: float = 30.0) -> None:
    """Wait (bounded) until every broker has a replica of each of ``topic``'s partitions."""
    deadline = time.monotonic() + timeout
    while True:
        hosted = [
            {labels["partition"] for labels, _v in s.series("kafka_log_log_logendoffset", topic=topic)}
            for s in scrape_all(cluster)
        ]
        if all(len(h) == partitions for h in hosted):
            return
        assert time.monotonic() < deadline, f"{topic} not on every broker after {timeout} s: {hosted}"
        time.sleep(0.05)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(brokers=BROKERS, data_dir=tmp_path_factory.mktemp("costs"), config=CONFIG) as c:
        c.wait_until_healthy(timeout=120)
        yield c


def test_long_polls_wake_only_for_their_own_partitions(cluster: LocalCluster, tmp_path: Path) -> None:
    admin = Admin(bootstrap_servers=cluster.bootstrap_servers)
    admin.create_topic("written", partitions=2, replication_factor=3)
    admin.create_topic("quiet", partitions=1, replication_factor=3)
    producer = Producer(bootstrap_servers=cluster.bootstrap_servers, acks="all", linger_ms=0)
    producer.send("written", value=b"warm-up").result(timeout=60)
    # A consumer long-polls "quiet", where nothing is written, all along.
    consumer = Consumer(bootstrap_servers=cluster.bootstrap_servers, fetch_max_wait_ms=500)
    consumer.assign([TopicPartition("quiet", 0)])
    consumer.seek(TopicPartition("quiet", 0), 0)
    stop = threading.Event()
    polled: list[int] = []

    def poll_quiet() -> None:
        while not stop.is_set():
            polled.append(len(consumer.poll(timeout=0.5)))

    poller = threading.Thread(target=poll_quiet, daemon=True)
    before = scrape_all(cluster)
    poller.start()
    try:
        for i in range(60):  # one batch at a time: every append replicated before the next one
            producer.send("written", value=b"v%d" % i, partition=i % 2).result(timeout=60)
    finally:
        stop.set()
        poller.join(timeout=30)
    after = scrape_all(cluster)
    producer.close()
    consumer.close()
    admin.close()

    assert not poller.is_alive() and sum(polled) == 0
    answered = delta(before, after, "sluice_long_poll_wakeups_total", wait="replica_fetch", result="answered")
    idle = delta(before, after, "sluice_long_poll_wakeups_total", wait="replica_fetch", result="idle")
    # Each of the 60 appends (and the coordinator-free acks=all path has no other writes) is copied
    # by two followers whose fetches were parked: woken, with data to answer.
    assert answered >= 60, answered
    # Nothing else woke a follower's fetch: not the other follower's progress, not the high
    # watermark moving, not an append to a partition the fetch does not name.
    assert idle == 0, idle
    # The consumer's fetch of "quiet" was never woken by the writes to "written".
    assert delta(before, after, "sluice_long_poll_wakeups_total", wait="fetch", result="idle") == 0
    assert delta(before, after, "sluice_long_poll_wakeups_total", wait="fetch", result="answered") == 0


def test_each_transaction_adds_its_partitions_with_one_request(cluster: LocalCluster) -> None:
    admin = Admin(bootstrap_servers=cluster.bootstrap_servers)
    admin.create_topic("txns", partitions=3, replication_factor=3)
    # CreateTopics answers before every broker has the new topic in its metadata; a coordinator
    # that has not yet answers UNKNOWN_TOPIC_OR_PARTITION (retriable), which is not what is counted
    wait_until_every_broker_hosts(cluster, "txns", partitions=3)
    producer = Producer(bootstrap_servers=cluster.bootstrap_servers, transactional_id="costs-txn", linger_ms=0)
    producer.init_transactions()
    before = scrape_all(cluster)
    transactions = 20
    for t in range(transactions):
        # begin right after the previous commit returned: its markers and CompleteCommit are
        # still being written when this transaction's AddPartitionsToTxn arrives
        producer.begin_transaction()
        # one partition per transaction (its leader moves round the brokers): exactly one partition
        # to add, so the sender cannot split it over two requests and every extra one is a retry
        producer.send("txns", value=b"t%d" % t, partition=t % 3).result(timeout=60)
        producer.send("txns", value=b"t%d-again" % t, partition=t % 3)
        producer.commit_transaction()
    after = scrape_all(cluster)
    producer.close()
    admin.close()

    assert delta(before, after, "sluice_transaction_coordinator_commits_total") == transactions
    requests = "kafka_network_requestmetrics_requests_total"
    assert delta(before, after, requests, request="EndTxn") == transactions
    # one AddPartitionsToTxn per transaction: no CONCURRENT_TRANSACTIONS retry
    assert delta(before, after, requests, request="AddPartitionsToTxn") == transactions
