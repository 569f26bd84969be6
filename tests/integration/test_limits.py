"""Limits against a real broker: new producer ids per principal per minute."""

from __future__ import annotations

from pathlib import Path

from sluice import errors
from sluice.api.v1 import broker_pb2 as bpb
from sluice.api.v1 import records_pb2 as pb
from sluice.testing import LocalCluster

from .wire import Wire


def test_producer_ids_per_principal_are_rate_limited(tmp_path: Path) -> None:
    key = "producer.id.rate.per.principal.per.minute"
    with LocalCluster(brokers=1, data_dir=tmp_path / "c", config={key: 3}) as cluster:
        wire = Wire(cluster.bootstrap_servers)
        codes = []
        for _ in range(5):
            resp = wire.stub.InitProducerId(
                bpb.InitProducerIdRequest(transaction_timeout_ms=60_000, producer_id=-1, producer_epoch=-1), timeout=30
            )
            codes.append(resp.error_code)
        assert codes == [pb.NONE] * 3 + [pb.THROTTLING_QUOTA_EXCEEDED] * 2
        assert key in resp.error_message and "User:ANONYMOUS" in resp.error_message
        assert errors.error_class(resp.error_code) is errors.ThrottlingQuotaExceededError
        assert errors.ThrottlingQuotaExceededError.retriable  # clients back off and retry
        wire.close()


def test_byte_rate_quotas_hold_responses_back_and_report_the_throttle_time(tmp_path: Path) -> None:
    import time

    from sluice.records import build_batch

    rate = 400_000  # bytes/s, produce and fetch
    config = {"quota.producer.default": rate, "quota.consumer.default": rate}
    with LocalCluster(brokers=1, data_dir=tmp_path / "c", config=config) as cluster:
        wire = Wire(cluster.bootstrap_servers)
        wire.create_topic("quota")
        value = b"v" * 100_000
        throttles = []
        started = time.monotonic()
        for _ in range(16):  # 1.6 MB: 0.4 MB of burst, then 1.2 MB at 0.4 MB/s, about 3 s
            data = bpb.ProducePartitionData(partition=0, batch=build_batch([(None, value)]))
            request = bpb.ProduceRequest(
                acks=-1, timeout_ms=30_000, topics=[bpb.ProduceTopicData(name="quota", partitions=[data])]
            )
            resp = wire.stub.Produce(request, timeout=60)
            assert resp.topics[0].partitions[0].error_code == pb.NONE
            throttles.append(resp.throttle_time_ms)
        elapsed = time.monotonic() - started
        assert throttles[0] == 0 and max(throttles) > 0
        assert elapsed >= 2.5, f"16 x 100 kB at {rate} B/s took only {elapsed:.1f} s"
        fetched, fetch_throttles = 0, []
        offset = 0
        for _ in range(100):  # bounded; about 12 fetches of 100 kB
            if fetched >= 1_200_000:
                break
            wanted = bpb.FetchPartition(
                partition=0, fetch_offset=offset, partition_max_bytes=200_000, current_leader_epoch=-1
            )
            fetch = bpb.FetchRequest(
                max_wait_ms=0,
                min_bytes=1,
                isolation_level=pb.READ_UNCOMMITTED,
                replica_id=-1,
                topics=[bpb.FetchTopic(name="quota", partitions=[wanted])],
            )
            resp_f = wire.stub.Fetch(fetch, timeout=60)
            part = resp_f.topics[0].partitions[0]
            assert part.error_code == pb.NONE
            fetched += sum(len(b.records) for b in part.batches)
            offset = part.next_fetch_offset
            fetch_throttles.append(resp_f.throttle_time_ms)
        assert fetched >= 1_200_000 and max(fetch_throttles) > 0
        wire.close()
