#!/usr/bin/env python3
"""CPU of a replica fetch round: unary ReplicaFetch calls against rounds on one ReplicaFetchStream.

    python bench/replica_fetch_rounds.py unary 20000
    python bench/replica_fetch_rounds.py stream 20000

The real InterBroker servicer behind a gRPC server with mutual TLS, in front of a stand-in replica
manager that answers every request at once with the same 3-partition response; the follower's end
in the same process and on the same event loop. So the process's CPU time (``/usr/bin/time``,
or the ``cpu`` figure printed at the end) divided by the rounds is what a round costs both ends
together, gRPC and the servicer's checks included, the log excluded.
"""

from __future__ import annotations

import asyncio
import sys
import time
from typing import Any

import grpc

from sluice import tls
from sluice.api.v1 import interbroker_pb2 as ipb
from sluice.api.v1 import interbroker_pb2_grpc
from sluice.broker.events import BrokerEvents
from sluice.broker.security import peers
from sluice.broker.servicers.interbroker import InterBrokerService

ANSWER = ipb.ReplicaFetchResponse(
    partitions=[ipb.ReplicaFetchPartitionResponse(topic="t", partition=p, high_watermark=5) for p in range(3)]
).SerializeToString()


class Replicas:
    """What the servicer uses of the replica manager: its events, and an answer at once."""

    events = BrokerEvents()

    async def replica_fetch(self, _req: ipb.ReplicaFetchRequest) -> bytes:
        return ANSWER


async def rounds(mode: str, n: int) -> None:
    ca = tls.generate_ca("bench-ca")
    leader, follower = tls.issue_broker(ca, 0, ["127.0.0.1"]), tls.issue_broker(ca, 1, ["127.0.0.1"])
    server = grpc.aio.server()
    server.add_generic_rpc_handlers([InterBrokerService(Replicas()).handler()])  # type: ignore[arg-type]
    port = server.add_secure_port("127.0.0.1:0", peers.server_credentials(ca.cert_pem, leader.cert_pem, leader.key_pem))
    await server.start()
    creds = peers.channel_credentials(ca.cert_pem, follower.cert_pem, follower.key_pem)
    options = [("grpc.ssl_target_name_override", tls.BROKER_SERVER_NAME)]
    async with grpc.aio.secure_channel(f"127.0.0.1:{port}", creds, options=options) as channel:
        stub: Any = interbroker_pb2_grpc.InterBrokerStub(channel)  # type: ignore[no-untyped-call]
        req = ipb.ReplicaFetchRequest(replica_id=1, max_wait_ms=500)
        for p in range(3):
            req.partitions.add(topic="t", partition=p, fetch_offset=5)
        await stub.ReplicaFetch(req, timeout=10)  # connected and handshaken before the count starts
        started = time.process_time()
        if mode == "unary":
            for _ in range(n):
                await stub.ReplicaFetch(req, timeout=10.5)
        else:
            call = stub.ReplicaFetchStream()
            for _ in range(n):
                async with asyncio.timeout(10.5):
                    await call.write(req)
                    await call.read()
            call.cancel()
        cpu = time.process_time() - started
    await server.stop(None)
    print(f"{mode}: {n} rounds, cpu {cpu:.2f} s, {cpu / n * 1e6:.0f} us a round (both ends)")


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or args[0] not in ("unary", "stream"):
        print(__doc__, file=sys.stderr)
        return 2
    asyncio.run(rounds(args[0], int(args[1])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
