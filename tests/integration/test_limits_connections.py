"""Connections per client address on a real broker: max.connections.per.ip, its overrides, gRPC and Kafka."""

from __future__ import annotations

import socket
import struct
import time
from pathlib import Path

import grpc

from sluice import errors
from sluice.api.v1 import broker_pb2 as bpb
from sluice.api.v1 import broker_pb2_grpc
from sluice.client import Admin
from sluice.testing import LocalCluster
from tests.support.waiting import wait_for


def _channel(address: str) -> grpc.Channel:
    # a subchannel pool of its own: channels to one address in one process otherwise share a connection
    return grpc.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1)])


def _metadata(channel: grpc.Channel) -> grpc.StatusCode | None:
    stub = broker_pb2_grpc.BrokerStub(channel)  # type: ignore[no-untyped-call]
    try:
        stub.Metadata(bpb.MetadataRequest(), timeout=10)
    except grpc.RpcError as exc:
        assert isinstance(exc, grpc.Call)
        if exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
            assert "max.connections.per.ip" in (exc.details() or ""), exc.details()
            assert "127.0.0.1" in (exc.details() or "")
        return exc.code()
    return None


def test_grpc_connections_per_address_are_capped_and_freed_when_closed(tmp_path: Path) -> None:
    # one address gets 2 by its override, every other 1 (loopback is all these tests have)
    config = {"max.connections.per.ip": 1, "max.connections.per.ip.overrides": "127.0.0.1:2"}
    with LocalCluster(brokers=1, data_dir=tmp_path / "c", config=config) as cluster:
        address = cluster.bootstrap_servers
        first, second, third = _channel(address), _channel(address), _channel(address)
        assert _metadata(first) is None and _metadata(second) is None
        assert _metadata(third) == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert _metadata(first) is None  # the admitted connections go on being served
        # the client library: a refused connection is a retriable BrokerNotAvailableError naming the key
        admin = Admin(bootstrap_servers=address, request_timeout_ms=2000)
        try:
            admin.describe_cluster(timeout=2.0)
            raise AssertionError("a connection beyond the cap was served")
        except errors.BrokerNotAvailableError as exc:
            assert exc.retriable and "max.connections.per.ip" in str(exc), exc
        admin.close()
        # closing a connection frees its place (the kernel's table says it is gone), long before
        # the idle close (connections.max.idle.ms, 10 minutes)
        first.close()
        wait_for(lambda: _metadata(third) is None, timeout=20, interval=0.5, what="the freed place taken")
        second.close()
        third.close()


def _api_versions(sock: socket.socket) -> bool:
    """ApiVersions v0 over a raw socket: True when answered, False when the broker closed it."""
    body = struct.pack(">hhi", 18, 0, 7) + struct.pack(">h", -1)  # key, version, correlation id, null client id
    try:
        sock.sendall(struct.pack(">i", len(body)) + body)
        head = sock.recv(4)
    except OSError:
        return False
    return len(head) == 4


def test_kafka_listener_closes_connections_beyond_the_cap(tmp_path: Path) -> None:
    config = {"max.connections.per.ip": 2}
    with LocalCluster(brokers=1, data_dir=tmp_path / "c", config=config, kafka_listener=True) as cluster:
        host, port = cluster.kafka_bootstrap_servers.rsplit(":", 1)
        socks = [socket.create_connection((host, int(port)), timeout=10) for _ in range(3)]
        try:
            assert _api_versions(socks[0]) and _api_versions(socks[1])
            assert not _api_versions(socks[2])  # closed at accept, as Kafka does
            socks[0].close()
            deadline = time.monotonic() + 20
            admitted = False
            while not admitted and time.monotonic() < deadline:  # bounded: the close reaches the broker
                retry = socket.create_connection((host, int(port)), timeout=10)
                socks.append(retry)
                admitted = _api_versions(retry)
                if not admitted:
                    time.sleep(0.2)
            assert admitted, "a connection closed by its client did not free its place"
        finally:
            for s in socks:
                s.close()
        log = (tmp_path / "c" / "broker-0.log").read_text()
        assert "max.connections.per.ip=2" in log
