"""Read one offset range of one partition over gRPC, as Arrow batches (the executor side).

A Spark task reads ``[start, end)`` of one partition. The range was fixed on
the driver (never past the last stable offset for read_committed, never past
the high watermark for read_uncommitted), so the data in it no longer changes
and a re-run of the task, or of a micro-batch after a restart, returns
exactly the same records.

* Fetch requests go straight to the partition's leader with a large byte
  budget (``fetchMaxBytes``, 16 MiB by default), and the next one is sent
  before the current response is decoded, so the broker and the decoder work
  at the same time.
* For read_committed the broker leaves out aborted batches and control
  batches, and ``next_fetch_offset`` steps over them: a range may hold
  aborted records and markers, and the range is read to its end all the same
  (only committed data records come out). For read_uncommitted the control
  batches arrive and are skipped by :func:`sluice.spark.arrow.decode_batches`.
* Leader changes (a broker killed, a failover) are retried: the leader is
  looked up again and the fetch repeated from the same offset, until no
  progress was made for ``pollTimeoutMs``; then the task fails with an error
  that says where it stood.
* Data loss: when ``start`` is below the partition's log start offset
  (retention removed it), ``failOnDataLoss=true`` fails the task; with
  ``false`` the lost part is skipped with a warning, as Spark's Kafka source does.

This module talks to brokers through the client's connection layer
(:class:`sluice.client._network.Cluster`: channels, metadata, leader lookup)
rather than :class:`~sluice.client.Consumer`, because the consumer builds a
Python object per record and the whole point here is not to.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

import grpc
import pyarrow as pa

from sluice import errors
from sluice.api.v1 import broker_pb2, records_pb2
from sluice.client._network import METADATA_REFRESH_CODES, Backoff, Cluster, Deadline, map_rpc_error
from sluice.client._network import rpc as rpcs
from sluice.spark.arrow import decode_batches
from sluice.spark.security import PLAINTEXT, SecurityOptions, client_security

__all__ = ["DataLossError", "RangeReader"]

log = logging.getLogger("sluice.spark")

_LONG_POLL_MS = 500


class DataLossError(errors.SluiceError):
    """Records of a range are gone (below the log start offset) and failOnDataLoss is true."""

    retriable = False


class RangeReader:
    """Reads offset ranges of partitions from their leaders; one per task, closed at its end."""

    def __init__(
        self,
        bootstrap_servers: str,
        *,
        read_committed: bool,
        fail_on_data_loss: bool,
        poll_timeout_ms: int,
        fetch_max_bytes: int,
        schema: pa.Schema,
        security: SecurityOptions = PLAINTEXT,
    ) -> None:
        self._cluster = Cluster(bootstrap_servers, security=client_security(security))
        self._isolation = records_pb2.READ_COMMITTED if read_committed else records_pb2.READ_UNCOMMITTED
        self._fail_on_data_loss = fail_on_data_loss
        self._poll_timeout = poll_timeout_ms / 1000.0
        self._max_bytes = fetch_max_bytes
        self._schema = schema

    def close(self) -> None:
        self._cluster.close()

    def __enter__(self) -> RangeReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _request(self, topic: str, partition: int, offset: int, epoch: int) -> broker_pb2.FetchRequest:
        return broker_pb2.FetchRequest(
            max_wait_ms=_LONG_POLL_MS,
            min_bytes=1,
            max_bytes=self._max_bytes,
            isolation_level=self._isolation,
            replica_id=-1,
            kafka_v2_records=True,  # the Arrow decoder reads Kafka clients' batches as stored
            topics=[
                broker_pb2.FetchTopic(
                    name=topic,
                    partitions=[
                        broker_pb2.FetchPartition(
                            partition=partition,
                            fetch_offset=offset,
                            partition_max_bytes=self._max_bytes,
                            current_leader_epoch=epoch if epoch >= 0 else -1,
                        )
                    ],
                )
            ],
        )

    def _start(
        self, topic: str, partition: int, offset: int
    ) -> tuple[str, grpc.Future[broker_pb2.FetchResponse]] | None:
        """Send a fetch to the leader; (address, future), or None when the leader is not known yet."""
        leader = self._cluster.leader(topic, partition)
        if leader is None:
            self._cluster.refresh_if_stale([topic], min_age=0.2)
            leader = self._cluster.leader(topic, partition)
            if leader is None:
                return None
        addr, epoch = leader
        request = self._request(topic, partition, offset, epoch)
        return addr, self._cluster.call_future(addr, rpcs.FETCH, request, _LONG_POLL_MS / 1000.0 + 30.0)

    def read(self, topic: str, partition: int, start: int, end: int) -> Iterator[pa.RecordBatch]:
        """Arrow batches of the records of ``topic``-``partition`` with ``start <= offset < end``."""
        where = f"{topic}-{partition}"
        offset = start
        backoff = Backoff(maximum=0.5)
        stalled_since = time.monotonic()
        last_problem = "no answer yet"
        pending = self._start(topic, partition, offset) if offset < end else None
        while offset < end:
            if pending is None:
                if time.monotonic() - stalled_since > self._poll_timeout:
                    raise errors.KafkaTimeoutError(
                        f"reading {where} [{start}, {end}): no progress at offset {offset} for "
                        f"{self._poll_timeout:.0f} s ({last_problem})"
                    )
                backoff.sleep(Deadline(1.0))
                pending = self._start(topic, partition, offset)
                last_problem = "the partition has no known leader"
                continue
            addr, future = pending
            pending = None
            try:
                response: broker_pb2.FetchResponse = future.result()
            except grpc.RpcError as rpc_exc:
                exc = map_rpc_error(rpc_exc, addr, rpcs.FETCH.name)
                if not exc.retriable:
                    raise exc from None
                last_problem = str(exc)
                self._cluster.forget_leader(topic, partition)
                continue
            p = response.topics[0].partitions[0]
            if p.error_code != records_pb2.NONE:
                if p.error_code == records_pb2.OFFSET_OUT_OF_RANGE and 0 <= offset < p.log_start_offset:
                    offset = self._lost(where, offset, p.log_start_offset, end)
                    stalled_since = time.monotonic()
                    if offset < end:
                        pending = self._start(topic, partition, offset)
                    continue
                err = errors.error_for(p.error_code, p.error_message)
                if not err.retriable and p.error_code != records_pb2.OFFSET_OUT_OF_RANGE:
                    raise err
                # OFFSET_OUT_OF_RANGE above the log: a new leader whose high watermark has not
                # caught up with the range yet. Wait for it, like for any retriable error.
                last_problem = f"{records_pb2.ErrorCode.Name(p.error_code)}: {p.error_message}"
                if p.error_code in METADATA_REFRESH_CODES:
                    self._cluster.forget_leader(topic, partition)
                continue
            next_offset = p.next_fetch_offset
            if next_offset > offset:
                if next_offset < end:
                    pending = self._start(topic, partition, next_offset)  # fetch ahead while decoding
                batch = decode_batches(p.batches, topic, partition, offset, end, self._schema)
                offset = next_offset
                stalled_since = time.monotonic()
                backoff.reset()
                if batch is not None:
                    yield batch
            else:
                # Nothing past ``offset`` yet: the fetch waited _LONG_POLL_MS at the leader's end.
                stable = p.last_stable_offset if self._isolation == records_pb2.READ_COMMITTED else p.high_watermark
                last_problem = f"the partition ends at {stable} on broker {addr}"
                if time.monotonic() - stalled_since > self._poll_timeout:
                    raise errors.KafkaTimeoutError(
                        f"reading {where} [{start}, {end}): no progress at offset {offset} for "
                        f"{self._poll_timeout:.0f} s ({last_problem})"
                    )
                pending = self._start(topic, partition, offset)

    def _lost(self, where: str, offset: int, log_start: int, end: int) -> int:
        message = (
            f"{where}: offsets {offset}..{min(log_start, end) - 1} are no longer in the log (its start offset is "
            f"{log_start}); records were removed by retention before they were read"
        )
        if self._fail_on_data_loss:
            raise DataLossError(message + ". Set failOnDataLoss=false to skip them.")
        log.warning("%s; skipped (failOnDataLoss=false)", message)
        return log_start
