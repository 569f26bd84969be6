"""ReplicaFetchStream: the servicer's checks on the stream, the client listener's refusal, the follower's fallback.

The leader side is the real :class:`InterBrokerService` behind a real gRPC server with mutual TLS
(so ``require_broker`` sees real certificates), in front of a stand-in replica manager that answers
each request at once. The follower side is the real :class:`ReplicaFetcherManager` with stand-in
partition logs, against that server or against one serving only the unary ReplicaFetch (a leader
of older code), which answers UNIMPLEMENTED to the stream.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
import pytest

from sluice import tls
from sluice.api.v1 import interbroker_pb2 as ipb
from sluice.api.v1 import interbroker_pb2_grpc
from sluice.api.v1 import records_pb2 as pb
from sluice.broker.events import BrokerEvents
from sluice.broker.replication import fetcher
from sluice.broker.replication.fetcher import ReplicaFetcherManager
from sluice.broker.security import peers
from sluice.broker.security.peers import CLIENT_LISTENER_REFUSAL
from sluice.broker.servicers.interbroker import InterBrokerService, refusing_handler
from tests.support.waiting import until

_CA = tls.generate_ca("stream-test-ca")
_LEADER = tls.issue_broker(_CA, 0, ["127.0.0.1"])
_FOLLOWER = tls.issue_broker(_CA, 1, ["127.0.0.1"])
_NOT_A_BROKER = tls.issue(_CA, "sluice-controller")  # signed by the cluster CA, not a broker's name
TOPIC = "t"


class FakeReplicas:
    """The replica manager's ReplicaFetch, answered at once: the partition's HW is the request's number."""

    def __init__(self) -> None:
        self.events = BrokerEvents()
        self.requests: list[ipb.ReplicaFetchRequest] = []

    async def replica_fetch(self, req: ipb.ReplicaFetchRequest) -> bytes:
        self.requests.append(req)
        resp = ipb.ReplicaFetchResponse()
        for p in req.partitions:
            resp.partitions.add(topic=p.topic, partition=p.partition, high_watermark=len(self.requests))
        return resp.SerializeToString()


class Leader:
    """A gRPC server on a loopback port with ``handler``, mutual TLS with the test CA, or plaintext."""

    def __init__(self, handler: grpc.GenericRpcHandler[Any, Any], secure: bool = True) -> None:
        self.handler = handler
        self.secure = secure
        self.port = 0
        self.server: grpc.aio.Server | None = None

    async def start(self) -> None:
        server = grpc.aio.server()
        server.add_generic_rpc_handlers([self.handler])
        address = f"127.0.0.1:{self.port}"
        if self.secure:
            creds = peers.server_credentials(_CA.cert_pem, _LEADER.cert_pem, _LEADER.key_pem)
            self.port = server.add_secure_port(address, creds)
        else:
            self.port = server.add_insecure_port(address)
        await server.start()
        self.server = server

    async def stop(self) -> None:
        if self.server is not None:
            await self.server.stop(None)
            self.server = None

    def channel(self, pair: tls.KeyPair = _FOLLOWER) -> grpc.aio.Channel:
        target = f"127.0.0.1:{self.port}"
        if not self.secure:
            return grpc.aio.insecure_channel(target)
        creds = peers.channel_credentials(_CA.cert_pem, pair.cert_pem, pair.key_pem)
        return grpc.aio.secure_channel(
            target, creds, options=[("grpc.ssl_target_name_override", tls.BROKER_SERVER_NAME)]
        )


def request(n: int = 0, **kw: Any) -> ipb.ReplicaFetchRequest:
    req = ipb.ReplicaFetchRequest(replica_id=1, max_wait_ms=0, **kw)
    req.partitions.add(topic=TOPIC, partition=0, fetch_offset=n)
    return req


def serving(replicas: FakeReplicas) -> Leader:
    return Leader(InterBrokerService(replicas).handler())  # type: ignore[arg-type]


def run(body: Callable[[], Any]) -> None:
    asyncio.run(asyncio.wait_for(body(), 60))


def stream_call(channel: grpc.aio.Channel) -> Any:
    return interbroker_pb2_grpc.InterBrokerStub(channel).ReplicaFetchStream()  # type: ignore[no-untyped-call]


def test_each_request_gets_one_response_in_order_counted_as_replica_fetch() -> None:
    async def body() -> None:
        replicas = FakeReplicas()
        leader = serving(replicas)
        await leader.start()
        try:
            async with leader.channel() as channel:
                call = stream_call(channel)
                for n in range(5):
                    await call.write(request(n))
                    resp = await call.read()
                    assert [p.high_watermark for p in resp.partitions] == [n + 1]
                assert replicas.events.open_streams == {"ReplicaFetchStream": 1}
                await call.done_writing()
                assert await call.read() is grpc.aio.EOF
                assert await call.code() == grpc.StatusCode.OK
                await until(lambda: replicas.events.open_streams == {"ReplicaFetchStream": 0}, "the stream closed")
            assert [r.partitions[0].fetch_offset for r in replicas.requests] == list(range(5))
            assert replicas.events.requests == {"ReplicaFetch": 5}  # comparable with the unary calls
            assert replicas.events.request_errors == {}
            # the unary call still answers the same way
            async with leader.channel() as channel:
                stub = interbroker_pb2_grpc.InterBrokerStub(channel)  # type: ignore[no-untyped-call]
                resp = await stub.ReplicaFetch(request(9), timeout=10)
                assert resp.partitions[0].high_watermark == 6
            assert replicas.events.requests == {"ReplicaFetch": 6}
        finally:
            await leader.stop()

    run(body)


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ({"max_wait_ms": -1}, "max_wait_ms must be >= 0"),
        ({"max_wait_ms": 10**9}, "max_wait_ms must be at most"),
        ({"max_bytes": -5}, "max_bytes must be >= 0"),
        ({"replica_id": -1}, "replica_id must be a broker id"),
    ],
)
def test_an_invalid_request_ends_the_stream_with_invalid_argument(bad: dict[str, int], message: str) -> None:
    async def body() -> None:
        replicas = FakeReplicas()
        leader = serving(replicas)
        await leader.start()
        try:
            async with leader.channel() as channel:
                call = stream_call(channel)
                await call.write(request(0))
                assert (await call.read()).partitions[0].high_watermark == 1
                req = request(1)
                for field, value in bad.items():
                    setattr(req, field, value)
                await call.write(req)
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await call.read()
                assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert message in (info.value.details() or "")
            assert len(replicas.requests) == 1  # the invalid one never reached the replica manager
            # counted once the handler has ended, which may be just after the client saw the status
            await until(lambda: replicas.events.requests == {"ReplicaFetch": 2}, "both requests counted")
            assert replicas.events.request_errors == {"ReplicaFetch": 1}
        finally:
            await leader.stop()

    run(body)


def test_a_stopping_leader_ends_its_streams_instead_of_holding_its_graceful_stop() -> None:
    async def body() -> None:
        replicas = FakeReplicas()
        service = InterBrokerService(replicas)  # type: ignore[arg-type]
        leader = Leader(service.handler())
        await leader.start()
        async with leader.channel() as channel:
            call = stream_call(channel)
            await call.write(request(0))
            await call.read()
            service.end_streams()
            assert leader.server is not None
            stopping = asyncio.create_task(leader.server.stop(30))  # a stream has no end of its own
            await call.write(request(1))  # the follower's next round: the stream ends instead
            assert await call.read() is grpc.aio.EOF
            await asyncio.wait_for(stopping, 5)
            assert len(replicas.requests) == 1

    run(body)


def raw_stream(channel: grpc.aio.Channel) -> Any:
    """The stream with no serializers: whatever bytes the test writes go out as a request."""
    return channel.stream_stream(
        "/sluice.v1.InterBroker/ReplicaFetchStream",
        request_serializer=lambda b: b,
        response_deserializer=lambda b: b,
    )()


def test_malformed_bytes_end_the_stream_with_invalid_argument_not_internal() -> None:
    async def body() -> None:
        replicas = FakeReplicas()
        leader = serving(replicas)
        await leader.start()
        try:
            async with leader.channel() as channel:
                call = raw_stream(channel)
                await call.write(request(0).SerializeToString())
                assert ipb.ReplicaFetchResponse.FromString(await call.read()).partitions[0].high_watermark == 1
                await call.write(b"\xff\xff\xff\xff")  # not a protobuf message
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await call.read()
                assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert "cannot decode ReplicaFetchRequest" in (info.value.details() or "")
            assert len(replicas.requests) == 1
        finally:
            await leader.stop()

    run(body)


def test_a_peer_without_a_broker_certificate_is_refused_when_the_stream_opens() -> None:
    async def body() -> None:
        replicas = FakeReplicas()
        leader = serving(replicas)
        await leader.start()
        try:
            async with leader.channel(_NOT_A_BROKER) as channel:
                call = stream_call(channel)
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await call.write(request(0))  # raises when the refusal came first
                    await call.read()
                assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
                assert "not a broker" in (info.value.details() or "")
            assert replicas.requests == []
            await until(lambda: replicas.events.request_errors == {"ReplicaFetch": 1}, "the refusal counted")
        finally:
            await leader.stop()

    run(body)


def test_the_client_listener_refuses_the_stream_without_decoding_anything() -> None:
    async def body() -> None:
        leader = Leader(refusing_handler(), secure=False)  # the client listener, plaintext by default
        await leader.start()
        try:
            async with leader.channel() as channel:
                for payload in (request(0).SerializeToString(), b"\xff\xff\xff\xff"):
                    call = raw_stream(channel)
                    with pytest.raises(grpc.aio.AioRpcError) as info:
                        await call.write(payload)  # raises when the refusal came first
                        await call.read()
                    assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
                    assert info.value.details() == CLIENT_LISTENER_REFUSAL
                # the unary methods as before
                stub = interbroker_pb2_grpc.InterBrokerStub(channel)  # type: ignore[no-untyped-call]
                with pytest.raises(grpc.aio.AioRpcError) as unary:
                    await stub.ReplicaFetch(request(0), timeout=10)
                assert unary.value.code() == grpc.StatusCode.PERMISSION_DENIED
        finally:
            await leader.stop()

    run(body)


# -- the follower ---------------------------------------------------------------------------------


class FakeLog:
    """What the fetch loop reads and writes of a partition log it follows (no batches come here)."""

    def __init__(self) -> None:
        self.topic, self.partition = TOPIC, 0
        self.log_end_offset = 1_000_000  # above every HW the fake leaders answer: each answer moves the HW
        self.latest_epoch = -1
        self.topic_id = ""
        self.high_watermark = 0


class Channels:
    def __init__(self, channel: grpc.aio.Channel | None) -> None:
        self.channel = channel

    def get(self, _broker_id: int) -> grpc.aio.Channel | None:
        return self.channel


class UnaryOnlyLeader:
    """A leader of older code: sluice.v1.InterBroker with the unary ReplicaFetch alone."""

    def __init__(self) -> None:
        self.calls = 0

    async def fetch(self, req: ipb.ReplicaFetchRequest, _ctx: Any) -> ipb.ReplicaFetchResponse:
        self.calls += 1
        resp = ipb.ReplicaFetchResponse()
        for p in req.partitions:
            resp.partitions.add(topic=p.topic, partition=p.partition, high_watermark=self.calls, error_code=pb.NONE)
        return resp

    def handler(self) -> grpc.GenericRpcHandler[Any, Any]:
        return grpc.method_handlers_generic_handler(
            "sluice.v1.InterBroker",
            {
                "ReplicaFetch": grpc.unary_unary_rpc_method_handler(
                    self.fetch,
                    request_deserializer=ipb.ReplicaFetchRequest.FromString,
                    response_serializer=ipb.ReplicaFetchResponse.SerializeToString,
                )
            },
        )


async def following(leader: Leader, rounds: Callable[[], int], until_rounds: int) -> ReplicaFetcherManager:
    """A fetcher following partition 0 of broker 0 at ``leader`` until ``rounds()`` reaches ``until_rounds``."""
    part = FakeLog()
    manager = ReplicaFetcherManager(1, {(TOPIC, 0): part}, Channels(leader.channel()), 1 << 20, lambda _keys: None)  # type: ignore[arg-type, dict-item]
    manager.follow((TOPIC, 0), 0, 0)
    manager.start()
    await until(lambda: rounds() >= until_rounds, f"{until_rounds} fetch rounds")
    await until(lambda: part.high_watermark >= until_rounds - 1, "the follower to apply the answers")
    return manager


def test_the_follower_fetches_on_one_stream() -> None:
    async def body() -> None:
        replicas = FakeReplicas()
        leader = serving(replicas)
        await leader.start()
        try:
            manager = await following(leader, lambda: len(replicas.requests), 20)
            assert list(manager._streams) == [0]
            assert manager._unary_until == {}
            await manager.stop()
            assert manager._streams == {}
        finally:
            await leader.stop()

    run(body)


def test_a_leader_without_the_stream_is_fetched_from_with_unary_calls(monkeypatch: pytest.MonkeyPatch) -> None:
    async def body() -> None:
        old = UnaryOnlyLeader()
        leader = Leader(old.handler())
        await leader.start()
        try:
            manager = await following(leader, lambda: old.calls, 20)
            assert manager._streams == {}  # UNIMPLEMENTED once, then unary calls
            assert 0 in manager._unary_until
            await manager.stop()
        finally:
            await leader.stop()

    run(body)


def test_the_stream_is_tried_again_after_the_leader_is_upgraded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fetcher, "STREAM_RETRY_S", 0.5)

    async def body() -> None:
        old = UnaryOnlyLeader()
        leader = Leader(old.handler())
        await leader.start()
        manager = await following(leader, lambda: old.calls, 5)
        try:
            await leader.stop()  # the same address, now served by new code
            replicas = FakeReplicas()
            leader.handler = InterBrokerService(replicas).handler()  # type: ignore[arg-type]
            await leader.start()
            # unary calls until STREAM_RETRY_S has passed since the UNIMPLEMENTED, then the stream
            opened = lambda: replicas.events.open_streams.get("ReplicaFetchStream") == 1  # noqa: E731
            await until(opened, "a stream after the upgrade")
            stream, done = manager._streams[0], len(replicas.requests)
            await until(lambda: len(replicas.requests) >= done + 5, "fetches on the stream")
            assert manager._streams[0] is stream and opened()
        finally:
            await manager.stop()
            await leader.stop()

    run(body)


def test_a_broken_stream_is_opened_again_when_the_leader_restarts() -> None:
    async def body() -> None:
        replicas = FakeReplicas()
        leader = serving(replicas)
        await leader.start()
        manager = await following(leader, lambda: len(replicas.requests), 5)
        try:
            first = manager._streams[0]
            await leader.stop()
            await until(lambda: 0 not in manager._streams, "the broken stream to be dropped")
            fresh = FakeReplicas()
            leader.handler = InterBrokerService(fresh).handler()  # type: ignore[arg-type]
            await leader.start()  # same port: the channel reconnects by itself
            await until(lambda: len(fresh.requests) >= 5, "fetches on a new stream", timeout=30)
            assert manager._streams[0] is not first
            assert manager._unary_until == {}  # a broken stream is not a reason to give it up
        finally:
            await manager.stop()
            await leader.stop()

    run(body)


class SilentLeader:
    """A leader that takes the stream and never answers (paused, or cut off by a partition)."""

    def __init__(self) -> None:
        self.opened = 0

    async def stream(self, requests: AsyncIterator[bytes], _ctx: Any) -> AsyncIterator[bytes]:
        self.opened += 1
        async for _request in requests:
            await asyncio.sleep(3600)
        yield b""  # pragma: no cover

    def handler(self) -> grpc.GenericRpcHandler[Any, Any]:
        return grpc.method_handlers_generic_handler(
            "sluice.v1.InterBroker", {"ReplicaFetchStream": grpc.stream_stream_rpc_method_handler(self.stream)}
        )


def test_a_stream_that_does_not_answer_is_given_up_and_opened_again(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fetcher, "FETCH_TIMEOUT_S", 0.3)

    async def body() -> None:
        silent = SilentLeader()
        leader = Leader(silent.handler())
        await leader.start()
        part = FakeLog()
        manager = ReplicaFetcherManager(1, {(TOPIC, 0): part}, Channels(leader.channel()), 1 << 20, lambda _k: None)  # type: ignore[arg-type, dict-item]
        manager.follow((TOPIC, 0), 0, 0)
        manager.start()
        try:
            await until(lambda: silent.opened >= 3, "three streams, each given up after the timeout", timeout=20)
            assert manager._unary_until == {}
        finally:
            await manager.stop()
            await leader.stop()

    run(body)
