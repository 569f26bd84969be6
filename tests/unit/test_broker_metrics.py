"""The broker's metrics against the real broker core, in one process, scraped over HTTP.

Wired as broker/sluice_broker/main.py wires a broker (SQLite metadata, ClusterView, RocksStorage,
ReplicaManager, both coordinators, then :class:`BrokerMetrics` on a loopback port); requests go
straight to the core. The values asserted are the ones the broker's own state says they must be.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import SimpleNamespace

from prometheus_client import CollectorRegistry, generate_latest

from sluice.api.v1 import broker_pb2 as bpb
from sluice.api.v1 import records_pb2 as pb
from sluice.broker.config import ConfigError
from sluice.broker.data_path import FetchInput, FetchPartition, ProduceInput, ProducePartition
from sluice.broker.events import BrokerEvents, FetchTally, Histogram
from sluice.broker.group import GroupCoordinator
from sluice.broker.group.api import CommitOffset, OffsetCommitInput
from sluice.broker.main import parse_metrics_listen
from sluice.broker.metrics.collectors import ReplicaCollector, compaction_stats, stall_seconds
from sluice.broker.metrics.exporter import BrokerMetrics
from sluice.broker.replica_manager import ReplicaManager
from sluice.broker.replication.throttle import ReplicationThrottle
from sluice.broker.txn import TransactionCoordinator
from sluice.broker.txn.api import InitProducerIdInput, TxnHandle
from sluice.metadata import documents, keys, reassignment
from sluice.metadata.documents import PartitionState, ReplicationThrottleDocument, TopicDocument
from sluice.records import build_batch
from sluice.testing import Scrape, free_port
from tests.support.broker_core import InProcessBroker
from tests.support.waiting import until

TOPIC = "orders"


async def http_get(port: int, path: str = "/metrics", method: str = "GET") -> tuple[int, bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"{method} {path} HTTP/1.1\r\nHost: x\r\nAccept: text/plain\r\n\r\n".encode())
    await writer.drain()
    data = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


def run(
    tmp: Path, test: Callable[[ReplicaManager, TransactionCoordinator, GroupCoordinator, int], Awaitable[None]]
) -> None:
    async def main() -> None:
        config = {"transaction.state.log.num.partitions": "2", "offsets.topic.num.partitions": "2"}
        broker = await InProcessBroker(tmp, config).open(topics={TOPIC: 2})
        metrics = BrokerMetrics(
            broker.config, broker.storage, broker.cluster, broker.replicas, broker.txn, broker.groups
        )
        port = free_port()
        await metrics.start("127.0.0.1", port)
        try:
            await test(broker.replicas, broker.txn, broker.groups, port)
        finally:
            await metrics.stop()
            await broker.close()

    asyncio.run(main())


async def scrape(port: int) -> Scrape:
    status, body = await http_get(port)
    assert status == 200, body
    return Scrape.parse(body.decode())


def produce_request(batch: bpb.RecordBatch, partition: int = 0, tid: str = "") -> ProduceInput:
    return ProduceInput([ProducePartition(TOPIC, partition, batch)], acks=-1, timeout_ms=1000, transactional_id=tid)


def test_scrape_reads_partitions_transactions_groups_and_events(tmp_path: Path) -> None:
    async def test(rm: ReplicaManager, txn: TransactionCoordinator, groups: GroupCoordinator, port: int) -> None:
        before = await scrape(port)
        assert before.value("kafka_server_replicamanager_partitioncount") == 2 + 2 + 2
        assert before.value("kafka_server_replicamanager_leadercount") == 6
        assert before.value("kafka_server_replicamanager_underreplicatedpartitions") == 0
        assert before.value("kafka_controller_kafkacontroller_offlinepartitionscount") == 0
        assert before.value("sluice_transaction_coordinator_open_transactions") == 0
        assert before.value("sluice_coordinator_partitions", coordinator="transaction", status="active") == 2
        assert (before.value("sluice_data_volume_free_bytes") or 0) > 0
        assert (before.value("sluice_rocksdb_memtable_bytes") or 0) > 0
        assert before.value("sluice_rocksdb_write_stall_seconds_total") == 0

        # Plain produce: bytes and messages in, offsets.
        batch = build_batch([(None, b"x" * 100), (None, b"y" * 100)])
        sent = batch.ByteSize()  # the core assigns offsets in the batch it is given
        (produced,) = await rm.produce(produce_request(batch))
        assert produced.error_code == pb.NONE
        # A transaction left open on partition 1.
        init = await txn.init_producer_id(InitProducerIdInput(transactional_id="t", transaction_timeout_ms=60_000))
        pid, epoch = init.producer_id, init.producer_epoch
        added = await txn.add_partitions_to_txn(TxnHandle("t", pid, epoch), [(TOPIC, 1)])
        assert added[0].error_code == pb.NONE
        tb = build_batch([(None, b"t")], producer_id=pid, producer_epoch=epoch, base_sequence=0, transactional=True)
        sent += tb.ByteSize()
        (produced,) = await rm.produce(produce_request(tb, partition=1, tid="t"))
        assert produced.error_code == pb.NONE
        # A group with a committed offset behind the end of partition 0.
        commit = await groups.offset_commit(OffsetCommitInput("g", (CommitOffset(TOPIC, 0, 1),), member_epoch=0))
        assert commit[0].error_code == pb.NONE
        # A consumer fetch of partition 0.
        (fetched,) = await rm.fetch(FetchInput([FetchPartition(TOPIC, 0, fetch_offset=0, max_bytes=1 << 20)]))
        assert fetched.error_code == pb.NONE and len(fetched.batches) == 1

        await asyncio.sleep(0.05)
        m = await scrape(port)
        # bytes in: the batches as the producer sent them; bytes out: as stored (offsets assigned)
        assert m.value("kafka_server_brokertopicmetrics_bytesin_total", topic=TOPIC) == sent
        assert m.value("kafka_server_brokertopicmetrics_messagesin_total", topic=TOPIC) == 3
        assert m.value("kafka_server_brokertopicmetrics_messagesin_total") == 3  # all topics
        assert (
            m.value("kafka_server_brokertopicmetrics_bytesout_total", topic=TOPIC)
            == rm.partitions[(TOPIC, 0)].read(0, 1 << 20, False).size
        )
        assert m.value("kafka_server_brokertopicmetrics_totalfetchrequests_total", topic=TOPIC) == 1
        assert m.value("kafka_log_log_logendoffset", topic=TOPIC, partition="0") == 2
        # partition 0 holds the one fetched batch: its stored bytes, what Fetch sent
        assert m.value("kafka_log_log_size", topic=TOPIC, partition="0") == sum(map(len, fetched.raw)) > 0
        assert m.value("sluice_log_high_watermark", topic=TOPIC, partition="1") == 1
        assert m.value("sluice_log_last_stable_offset", topic=TOPIC, partition="1") == 0
        assert m.value("kafka_cluster_partition_laststableoffsetlag", topic=TOPIC, partition="1") == 1
        assert m.value("sluice_log_open_transactions", topic=TOPIC, partition="1") == 1
        assert m.value("sluice_transaction_coordinator_open_transactions") == 1
        assert m.value("sluice_transaction_coordinator_transactional_ids", state="Ongoing") == 1
        assert (m.value("sluice_transaction_coordinator_oldest_open_transaction_age_seconds") or 0) > 0
        assert m.value("kafka_consumergroup_current_offset", consumergroup="g", topic=TOPIC, partition="0") == 1
        assert m.value("kafka_consumergroup_lag", consumergroup="g", topic=TOPIC, partition="0") == 2 - 1
        assert m.value("kafka_consumergroup_lag_sum", consumergroup="g", topic=TOPIC) == 1
        assert m.value("kafka_network_requestmetrics_requests_total", request="Produce") is None  # no gRPC here
        assert "process_cpu_seconds_total" in m.names()

        assert m.value("sluice_transaction_coordinator_open_transactions_past_timeout") == 0
        # Two minutes later (the coordinator's clock), the 60 s transaction is past its timeout.
        real_clock = txn.clock
        txn.clock = lambda: real_clock() + 120_000
        later = await scrape(port)
        txn.clock = real_clock
        assert later.value("sluice_transaction_coordinator_open_transactions_past_timeout") == 1
        assert (later.value("sluice_transaction_coordinator_oldest_open_transaction_age_seconds") or 0) >= 120

        # Commit: the transaction is counted, the LSO catches up, markers were timed.
        ended = await txn.end_txn(TxnHandle("t", pid, epoch), True)
        assert ended.error_code == pb.NONE
        await until(lambda: rm.events.txn_commits == 1, "the commit to complete")
        m = await scrape(port)
        assert m.value("sluice_transaction_coordinator_commits_total") == 1
        assert m.value("sluice_transaction_coordinator_open_transactions") == 0
        assert m.value("sluice_transaction_coordinator_marker_send_seconds_count") == 1
        assert m.value("kafka_cluster_partition_laststableoffsetlag", topic=TOPIC, partition="1") == 0

    run(tmp_path, test)


def test_http_answers_only_get_metrics(tmp_path: Path) -> None:
    async def test(rm: ReplicaManager, txn: TransactionCoordinator, groups: GroupCoordinator, port: int) -> None:
        assert (await http_get(port, "/"))[0] == 404
        assert (await http_get(port, "/metrics", method="POST"))[0] == 405
        status, body = await http_get(port, "/metrics?x=1")
        assert status == 200 and b"kafka_server_replicamanager_leadercount" in body

    run(tmp_path, test)


def test_events_and_histogram() -> None:
    h = Histogram((1, 5))
    for v in (0.5, 1, 3, 100):
        h.observe(v)
    assert h.cumulative() == [("1", 2.0), ("5", 3.0), ("+Inf", 4.0)]
    assert h.count == 4 and h.sum == 104.5
    ev = BrokerEvents()
    ev.produced("a", 10, 2)
    ev.produce_failed("a", known=True)
    ev.produce_failed("no-such-topic", known=False)  # counted for all topics only: no label value made up
    tally = FetchTally()
    tally.read("a", 7)
    tally.read("b", 0)
    tally.error("b", known=True)
    tally.error("typo", known=False)
    ev.fetched(tally)
    assert (ev.topics["a"].bytes_in, ev.topics["a"].messages_in, ev.topics["a"].failed_produce_requests) == (10, 2, 1)
    assert (
        ev.topics["a"].bytes_out == 7
        and ev.topics["b"].fetch_requests == 2
        and ev.topics["b"].failed_fetch_requests == 1
    )
    assert ev.all_topics.fetch_requests == 4 and ev.all_topics.bytes_out == 7
    assert ev.all_topics.failed_produce_requests == 2 and ev.all_topics.failed_fetch_requests == 2
    assert set(ev.topics) == {"a", "b"}
    assert ev.topics["a"].produce_requests == 2  # the failed one included, as Kafka counts it
    ev.isr_changed([0, 1, 2], [0, 1])
    ev.isr_changed([0, 1], [0, 1, 2])
    assert (ev.isr_shrinks, ev.isr_expands) == (1, 1)
    ev.request("Produce", 3.0, failed=False)
    ev.request("Produce", 30.0, failed=True)
    assert ev.requests["Produce"] == 2 and ev.request_errors["Produce"] == 1
    ev.forget_topic("a")
    assert "a" not in ev.topics and ev.all_topics.bytes_in == 10


def test_stall_time_is_read_from_rocksdb_stats() -> None:
    stats = "Cumulative stall: 01:02:3.500 H:M:S, 0.1 percent\nInterval stall: 00:00:1.000 H:M:S, 0.0 percent"
    assert stall_seconds(stats) == 3723.5
    assert stall_seconds("no stats") is None


def test_compaction_bytes_and_stall_causes_are_read_from_cfstats() -> None:
    stats = (
        "Cumulative compaction: 1.25 GB write, 3.10 MB/s write, 1.00 GB read, 2.50 MB/s read, 10.2 seconds\n"
        "Write Stall (count): cf-l0-file-count-limit-delays-with-ongoing-compaction: 0, l0-file-count-limit-delays: 4, "
        "memtable-limit-stops: 2, total-delays: 4, total-stops: 2\n"
    )
    written, causes = compaction_stats(stats) or (0.0, {})
    assert written == 1.25e9
    assert causes == {
        "cf-l0-file-count-limit-delays-with-ongoing-compaction": 0,
        "l0-file-count-limit-delays": 4,
        "memtable-limit-stops": 2,
    }
    assert compaction_stats("no stats") is None


def test_metrics_listen_is_parsed_or_refused() -> None:
    assert parse_metrics_listen(None) is None
    assert parse_metrics_listen("0.0.0.0:9404") == ("0.0.0.0", 9404)
    assert parse_metrics_listen("[::1]:9404") == ("::1", 9404)
    for bad in ("9404", "host:", "host:0", "host:70000", ":9404"):
        try:
            parse_metrics_listen(bad)
        except ConfigError as exc:
            assert "--metrics-listen" in str(exc)
        else:
            raise AssertionError(f"{bad!r} was accepted")


def _collect(collector: ReplicaCollector) -> Scrape:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return Scrape.parse(generate_latest(registry).decode())


def test_replica_gauges_follow_the_cluster_view() -> None:
    """Leader-side counts from the ISR in the metadata; offline partitions from the lowest live broker only."""

    def part(leo: int, hw: int, lso: int, open_txns: int) -> SimpleNamespace:
        return SimpleNamespace(
            log_end_offset=leo,
            log_start_offset=0,
            size_bytes=leo * 100,
            high_watermark=hw,
            last_stable_offset=lso,
            open_txns=dict.fromkeys(range(open_txns), lso),
            config=lambda key: 2,  # min.insync.replicas
        )

    def p(leader: int, isr: list[int]) -> PartitionState:
        return PartitionState(leader=leader, replicas=[0, 1, 2], isr=isr)

    topics = {
        "t": SimpleNamespace(partitions=[p(0, [0, 1]), p(1, [1, 0, 2])]),  # t-0 at min ISR, t-1 led by 1
        "u": SimpleNamespace(partitions=[p(0, [0])]),  # under min ISR
        "v": SimpleNamespace(partitions=[p(-1, [2])]),  # offline (no leader), no replica here
    }
    replicas = SimpleNamespace(
        partitions={("t", 0): part(10, 8, 5, 1), ("t", 1): part(10, 10, 10, 0), ("u", 0): part(3, 3, 3, 0)},
        leader_of={("t", 0), ("u", 0)},
        reassignment_throttle=ReplicationThrottle(-1),
        fetchers=SimpleNamespace(throttle=ReplicationThrottle(-1)),
    )
    cluster = SimpleNamespace(topics=topics, brokers={0: None, 1: None, 2: None}, dead_brokers=set())

    def collector(me: int) -> ReplicaCollector:
        return ReplicaCollector(replicas, cluster, SimpleNamespace(broker_id=me))  # type: ignore[arg-type]

    m = _collect(collector(0))
    assert m.value("kafka_server_replicamanager_partitioncount") == 3
    assert m.value("kafka_server_replicamanager_leadercount") == 2
    assert m.value("kafka_server_replicamanager_underreplicatedpartitions") == 2
    assert m.value("kafka_server_replicamanager_underminisrpartitioncount") == 1
    assert m.value("kafka_server_replicamanager_atminisrpartitioncount") == 1
    assert m.value("kafka_controller_kafkacontroller_offlinepartitionscount") == 1
    assert m.value("kafka_cluster_partition_laststableoffsetlag", topic="t", partition="0") == 3
    assert m.value("sluice_log_open_transactions", topic="t", partition="0") == 1
    assert m.value("kafka_cluster_partition_underreplicated", topic="u", partition="0") == 1
    # a follower reports its log, not the leader's gauges
    assert m.value("kafka_log_log_logendoffset", topic="t", partition="1") == 10
    assert m.value("sluice_log_last_stable_offset", topic="t", partition="1") is None
    # only the lowest live broker counts offline partitions: not 1 while 0 is alive, 1 once 0 is dead
    assert _collect(collector(1)).value("kafka_controller_kafkacontroller_offlinepartitionscount") == 0
    cluster.dead_brokers = {0}
    assert _collect(collector(1)).value("kafka_controller_kafkacontroller_offlinepartitionscount") == 1


def test_a_reassignment_led_here_is_counted_and_its_bytes_out(tmp_path: Path) -> None:
    async def test(rm: ReplicaManager, txn: TransactionCoordinator, groups: GroupCoordinator, port: int) -> None:
        before = await scrape(port)
        assert before.value("kafka_server_replicamanager_reassigningpartitions") == 0
        assert before.value("kafka_server_brokertopicmetrics_reassignmentbytesout_total") == 0
        assert before.value("kafka_server_brokertopicmetrics_reassignmentbytesin_total") == 0

        # Partition 0 starts moving to [0, 7] (broker 7 being added), as AlterPartitionReassignments writes it.
        def moving(topic: TopicDocument | None) -> TopicDocument | None:
            assert topic is not None
            return topic.with_partition(0, reassignment.start(topic.partitions[0], [0, 7]))

        documents.update_document(rm.cluster.store, keys.topic(TOPIC), TopicDocument, moving)
        rm.cluster.refresh()
        await until(lambda: rm.cluster.topics[TOPIC].partitions[0].adding_replicas == [7], "the move seen")
        rm.reassignment_throttle.charge(4096)  # what the leader charges for a ReplicaFetch answer to broker 7
        m = await scrape(port)
        assert m.value("kafka_server_replicamanager_reassigningpartitions") == 1
        assert m.value("kafka_server_brokertopicmetrics_reassignmentbytesout_total") == 4096

    run(tmp_path, test)


def test_a_rebalance_throttle_document_sets_the_rate_in_force_until_it_is_removed(tmp_path: Path) -> None:
    async def test(rm: ReplicaManager, txn: TransactionCoordinator, groups: GroupCoordinator, port: int) -> None:
        def rates(m: Scrape) -> tuple[float | None, float | None]:
            side = "sluice_replication_throttle_rate_bytes"
            return m.value(side, side="leader"), m.value(side, side="follower")

        assert rates(await scrape(port)) == (-1, -1)  # nothing configured: off
        doc = ReplicationThrottleDocument(5_000_000, "ns/grow", 1)
        documents.update_document(
            rm.cluster.store, keys.REPLICATION_THROTTLE, ReplicationThrottleDocument, lambda _d: doc
        )
        rm.cluster.refresh()
        await until(lambda: rm.cluster.replication_throttle == 5_000_000, "the throttle seen")
        assert rm.reassignment_throttle.enabled and rm.fetchers.throttle.enabled
        assert rates(await scrape(port)) == (5_000_000, 5_000_000)
        found = rm.cluster.store.get(keys.REPLICATION_THROTTLE)
        assert found is not None
        rm.cluster.store.delete(keys.REPLICATION_THROTTLE, found.version)
        rm.cluster.refresh()
        await until(lambda: rm.cluster.replication_throttle is None, "the throttle removed")
        assert not rm.reassignment_throttle.enabled and rates(await scrape(port)) == (-1, -1)

    run(tmp_path, test)
