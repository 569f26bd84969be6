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
