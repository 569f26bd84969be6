"""Two brokers in one process, talking gRPC: markers to a remote leader, remote verification.

Each broker is the real core (SQLite metadata shared by both, its own RocksDB)
plus a minimal gRPC server with the two calls the coordinator makes to other
brokers: InterBroker.WriteTxnMarkers and Broker.DescribeTransactions. A
background task refreshes both cluster views, as broker/sluice_broker/main.py's metadata
watch does.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import grpc

from sluice import tls
from sluice.api.v1 import broker_pb2 as bpb
from sluice.api.v1 import broker_pb2_grpc, interbroker_pb2_grpc
from sluice.api.v1 import interbroker_pb2 as ipb
from sluice.api.v1 import records_pb2 as pb
from sluice.broker.cluster import TRANSACTION_STATE_TOPIC, ClusterView, coordinator_partition
from sluice.broker.data_path import ProduceInput, ProducePartition
from sluice.broker.replica_manager import ReplicaManager
from sluice.broker.security import peers
from sluice.broker.servicers.broker import transaction_state
from sluice.broker.txn import TransactionCoordinator
from sluice.broker.txn.api import InitProducerIdInput, TxnHandle
from sluice.records import build_batch, parse_control
from tests.support.broker_core import InProcessBroker
from tests.support.waiting import until

TOPIC = "orders"
N = 4
CONFIG = {"transaction.state.log.num.partitions": str(N), "offsets.topic.num.partitions": "2"}
_CA = tls.generate_ca("test-cluster-ca")


class _InterBroker(interbroker_pb2_grpc.InterBrokerServicer):  # type: ignore[misc]
    def __init__(self, node: Node) -> None:
        self.node = node

    async def WriteTxnMarkers(self, request: ipb.WriteTxnMarkersRequest, _ctx: Any) -> ipb.WriteTxnMarkersResponse:
        return await self.node.replicas.write_markers(request)


class _Broker(broker_pb2_grpc.BrokerServicer):  # type: ignore[misc]
    def __init__(self, node: Node) -> None:
        self.node = node

    async def DescribeTransactions(
        self, request: bpb.DescribeTransactionsRequest, _ctx: Any
    ) -> bpb.DescribeTransactionsResponse:
        return bpb.DescribeTransactionsResponse(
            transactions=[
                transaction_state(d) for d in self.node.coord.describe_transactions(request.transactional_ids)
            ]
        )


class Node:
    """One broker's core (tests/support/broker_core.py) behind a gRPC server with the two calls
    brokers make of each other here (WriteTxnMarkers, DescribeTransactions)."""

    def __init__(self, tmp: Path, broker_id: int) -> None:
        self.tmp = tmp
        self.broker_id = broker_id
        self.port = 0
        self.server: grpc.aio.Server | None = None
        self.broker: InProcessBroker | None = None
        self.tls_dir = tmp / f"tls-{broker_id}"
        tls.write_dir(self.tls_dir, _CA.cert_pem, tls.issue_broker(_CA, broker_id, ["127.0.0.1"]))

    @property
    def cluster(self) -> ClusterView:
        assert self.broker is not None
        return self.broker.cluster

    @property
    def replicas(self) -> ReplicaManager:
        assert self.broker is not None
        return self.broker.replicas

    @property
    def coord(self) -> TransactionCoordinator:
        assert self.broker is not None
        return self.broker.txn

    async def serve(self) -> None:
        server = grpc.aio.server()
        interbroker_pb2_grpc.add_InterBrokerServicer_to_server(_InterBroker(self), server)  # type: ignore[no-untyped-call]
        broker_pb2_grpc.add_BrokerServicer_to_server(_Broker(self), server)  # type: ignore[no-untyped-call]
        # The brokers' channels go to each other's inter-broker listener, mutual TLS with the cluster CA.
        m = tls.load_dir(self.tls_dir)
        creds = peers.server_credentials(m.ca_pem, m.cert_pem, m.key_pem)
        self.port = server.add_secure_port(f"127.0.0.1:{self.port}", creds)
        await server.start()
        self.server = server

    async def halt(self) -> None:
        assert self.server is not None
        await self.server.stop(None)
        self.server = None

    async def open(self) -> None:
        await self.serve()
        self.broker = InProcessBroker(
            self.tmp, CONFIG, broker_id=self.broker_id, port=self.port, data=f"broker-{self.broker_id}",
            inter_broker_port=self.port, tls_dir=str(self.tls_dir),
        )  # fmt: skip
        await self.broker.open(internal_topics=False, wait_ready=False)
        self.coord.markers.max_backoff_s = 0.2

    async def close(self) -> None:
        if self.broker is not None:
            await self.broker.close()
        if self.server is not None:
            await self.halt()
        self.broker = None

    def markers(self, partition: int) -> list[bool]:
        return [parse_control(b)[0] for b in self.replicas.iter_batches(TOPIC, partition) if b.control]

    async def produce(self, tid: str, pid: int, epoch: int, partition: int) -> int:
        batch = build_batch([(None, b"v")], producer_id=pid, producer_epoch=epoch, base_sequence=0, transactional=True)
        (produced,) = await self.replicas.produce(
            ProduceInput([ProducePartition(TOPIC, partition, batch)], acks=-1, timeout_ms=1000, transactional_id=tid)
        )
        return produced.error_code


def test_markers_reach_a_remote_leader_and_remote_verification_works(tmp_path: Path) -> None:
    async def main() -> None:
        nodes = [Node(tmp_path, 0), Node(tmp_path, 1)]
        for node in nodes:
            await node.open()
        a, b = nodes
        a.cluster.ensure_internal_topics()
        a.cluster.create_topic(TOPIC, 2, 1, {})

        async def watch() -> None:
            while True:
                for node in nodes:
                    node.cluster.refresh()
                await asyncio.sleep(0.02)

        watcher = asyncio.create_task(watch())
        try:
            await until(lambda: all(n.coord.is_ready() and TOPIC in n.cluster.topics for n in nodes), "metadata")
            info = a.cluster.topics[TOPIC]
            assert [p.leader for p in info.partitions] == [0, 1]
            # A transactional id coordinated by broker 0.
            tid = next(f"tx-{i}" for i in range(100) if coordinator_partition(f"tx-{i}", N) % 2 == 0)
            assert a.cluster.topics[TRANSACTION_STATE_TOPIC].partitions[coordinator_partition(tid, N)].leader == 0
            init = InitProducerIdInput(transactional_id=tid, transaction_timeout_ms=60_000)
            elsewhere = await b.coord.init_producer_id(init)
            assert elsewhere.error_code == pb.NOT_COORDINATOR
            resp = await a.coord.init_producer_id(init)
            assert resp.error_code == pb.NONE
            pid, epoch = resp.producer_id, resp.producer_epoch

            # Broker 1 leads orders-1: before the add, its verification (a DescribeTransactions
            # to broker 0) refuses the write; after it, accepts it.
            assert await b.produce(tid, pid, epoch, 1) == pb.INVALID_TXN_STATE
            add = await a.coord.add_partitions_to_txn(TxnHandle(tid, pid, epoch), [(TOPIC, 0), (TOPIC, 1)])
            assert [r.error_code for r in add] == [pb.NONE, pb.NONE]
            assert await b.produce(tid, pid, epoch, 1) == pb.NONE
            assert await a.produce(tid, pid, epoch, 0) == pb.NONE

            # Broker 1 goes away before the commit: its marker waits for it.
            await b.halt()
            end = await a.coord.end_txn(TxnHandle(tid, pid, epoch), True)
            assert end.error_code == pb.NONE

            def state() -> str:
                (desc,) = a.coord.describe_transactions([tid])
                return desc.state

            await until(lambda: a.markers(0) == [True], "the local marker")
            await asyncio.sleep(0.5)
            assert state() == "PrepareCommit" and b.markers(1) == []
            await b.serve()  # back on the same port
            await until(lambda: state() == "CompleteCommit", "the remote marker after the broker returned")
            assert b.markers(1) == [True]
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
            for node in nodes:
                await node.close()

    asyncio.run(main())
