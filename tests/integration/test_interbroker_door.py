"""Only brokers speak broker: forged inter-broker RPCs are refused and change nothing.

A caller with nothing but the published stubs tries what issue 12 found open: a forged
WriteTxnMarkers COMMIT that would expose an aborted (or still open) transaction to
read_committed readers, a forged ABORT with a huge coordinator epoch that would hide a committed
one and wedge its coordinator, and forged ReplicaFetch calls (and ReplicaFetchStream requests)
posing as followers that would move the high watermark past what the real followers hold. Each is
sent through every door a LocalCluster with default arguments has:

* the client port: refused PERMISSION_DENIED (the methods exist there only to refuse);
* the inter-broker port in plaintext, over TLS without a certificate, and over TLS with a
  certificate from another CA that even carries a broker's name: the TLS handshake fails (the
  listener requires a certificate from the cluster CA), so the call ends UNAVAILABLE before any
  request byte is read;
* the inter-broker port with a certificate the cluster CA did sign, but not for a broker (the
  local controller's): PERMISSION_DENIED from the per-call check.

After each attempt the state is read back from the brokers: the records visible to
read_committed, the LSO and the high watermark (ListOffsets), the ISR (the metadata), the
transaction's state at its coordinator, and that the real producer still commits afterwards.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

from sluice import tls
from sluice.api.v1 import broker_pb2 as bpb
from sluice.api.v1 import interbroker_pb2 as ipb
from sluice.api.v1 import interbroker_pb2_grpc
from sluice.api.v1 import records_pb2 as pb
from sluice.client import Admin, Producer
from sluice.testing import LocalCluster
from sluice.testing.certs import controller_tls_dir

from .wire import Wire, batch_of

TOPIC = "door"
REFUSED_AT_HANDSHAKE = grpc.StatusCode.UNAVAILABLE


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    # Default arguments but the ones that keep a paused follower in the ISR for the test's length.
    config = {"replica.lag.time.max.ms": 120_000}
    with LocalCluster(
        brokers=3, data_dir=tmp_path_factory.mktemp("door"), config=config, failure_timeout_ms=120_000
    ) as c:
        with Admin(bootstrap_servers=c.bootstrap_servers) as admin:
            admin.create_topic(TOPIC, 1, 3)
        c.wait_for_partition(TOPIC, 0, lambda p: len(p["isr"]) == 3, what="a full ISR")
        with Producer(bootstrap_servers=c.bootstrap_servers) as p:  # retries until the leader serves the topic
            p.send(TOPIC, b"first", partition=0).get(timeout=60)
        yield c


def _stranger_material(tmp: Path) -> tls.TlsMaterial:
    """A certificate named like broker 1, from a CA the cluster never saw."""
    ca = tls.generate_ca("not-this-cluster")
    pair = tls.issue_broker(ca, 1, ["127.0.0.1"])
    return tls.TlsMaterial(ca.cert_pem, pair.cert_pem, pair.key_pem)


def doors(cluster: LocalCluster, broker: int, tmp: Path) -> list[tuple[str, grpc.Channel, grpc.StatusCode]]:
    """(what, channel, the refusal expected) for every way a non-broker can reach ``broker``."""
    b = cluster.broker(broker)
    assert b.inter_broker_port is not None and b.tls_dir is not None
    ib = f"{b.host}:{b.inter_broker_port}"
    cluster_ca = (b.tls_dir / tls.CA_FILE).read_bytes()  # the CA certificate is public: no secret
    override = [("grpc.ssl_target_name_override", tls.BROKER_SERVER_NAME)]
    stranger = _stranger_material(tmp)
    # Signed by the cluster CA but not a broker's name (the local controller's certificate): the
    # handshake passes, the per-call check refuses.
    component = tls.load_dir(controller_tls_dir(cluster.data_dir))
    return [
        ("client port", grpc.insecure_channel(b.address), grpc.StatusCode.PERMISSION_DENIED),
        ("inter-broker port, plaintext", grpc.insecure_channel(ib), REFUSED_AT_HANDSHAKE),
        (
            "inter-broker port, TLS without a certificate",
            grpc.secure_channel(ib, grpc.ssl_channel_credentials(cluster_ca), options=override),
            REFUSED_AT_HANDSHAKE,
        ),
        (
            "inter-broker port, a broker-named certificate from another CA",
            grpc.secure_channel(
                ib, grpc.ssl_channel_credentials(cluster_ca, stranger.key_pem, stranger.cert_pem), options=override
            ),
            REFUSED_AT_HANDSHAKE,
        ),
        (
            "inter-broker port, a cluster-CA certificate that is not a broker's",
            grpc.secure_channel(
                ib, grpc.ssl_channel_credentials(cluster_ca, component.key_pem, component.cert_pem), options=override
            ),
            grpc.StatusCode.PERMISSION_DENIED,
        ),
    ]


def attempt_everywhere(
    cluster: LocalCluster, broker: int, tmp: Path, call: Callable[[interbroker_pb2_grpc.InterBrokerStub], object]
) -> None:
    """Make ``call`` through every door of ``broker``; each must be refused with its expected code."""
    for what, channel, expected in doors(cluster, broker, tmp):
        with channel:
            stub = interbroker_pb2_grpc.InterBrokerStub(channel)  # type: ignore[no-untyped-call]
            with pytest.raises(grpc.RpcError) as info:
                call(stub)
            code = info.value.code()  # type: ignore[attr-defined]
            assert code == expected, f"{what}: {code} {info.value.details()}"  # type: ignore[attr-defined]
            if expected == grpc.StatusCode.PERMISSION_DENIED:
                assert "inter-broker" in info.value.details()  # type: ignore[attr-defined]


def offsets(wire: Wire) -> tuple[int, int]:
    """(LSO, high watermark) of partition 0 at the leader."""
    out = []
    for level in (pb.READ_COMMITTED, pb.READ_UNCOMMITTED):
        resp = wire.stub.ListOffsets(
            bpb.ListOffsetsRequest(
                isolation_level=level,
                topics=[
                    bpb.ListOffsetsTopic(name=TOPIC, partitions=[bpb.ListOffsetsPartition(partition=0, timestamp=-1)])
                ],
            ),
            timeout=10,
        )
        p = resp.topics[0].partitions[0]
        assert p.error_code == pb.NONE, p.error_message
        out.append(int(p.offset))
    return out[0], out[1]


def marker(pid: int, epoch: int, committed: bool, coordinator_epoch: int = 0) -> ipb.WriteTxnMarkersRequest:
    return ipb.WriteTxnMarkersRequest(
        markers=[
            ipb.TxnMarker(
                producer_id=pid,
                producer_epoch=epoch,
                committed=committed,
                coordinator_epoch=coordinator_epoch,
                partitions=[pb.TopicPartition(topic=TOPIC, partition=0)],
                transactional_id="forged",
            )
        ]
    )


def state_of(admin: Admin, txn_id: str) -> tuple[str, int, int]:
    (d,) = admin.describe_transactions([txn_id], timeout=30)
    return d.state, d.producer_id, d.producer_epoch


def settled(admin: Admin, txn_id: str, want: str) -> tuple[str, int, int]:
    """The transaction's state once its markers are written (EndTxn answers at Prepare*): at most 60 s."""
    for _ in range(600):
        state = state_of(admin, txn_id)
        if state[0] == want:
            return state
        time.sleep(0.1)
    raise AssertionError(f"{txn_id} did not reach {want}: {state}")


def test_forged_markers_move_no_transaction(cluster: LocalCluster, tmp_path: Path) -> None:
    leader = cluster.leader(TOPIC, 0)
    wire = Wire(cluster.address(leader))
    admin = Admin(bootstrap_servers=cluster.bootstrap_servers)
    visible = [v for _o, v in wire.read_all(TOPIC, 0)]

    # 1. An aborted transaction must stay invisible whatever COMMIT marker is forged for it.
    aborted = Producer(bootstrap_servers=cluster.bootstrap_servers, transactional_id="door-aborted")
    aborted.init_transactions()
    aborted.begin_transaction()
    aborted.send(TOPIC, b"aborted-1", partition=0)
    aborted.send(TOPIC, b"aborted-2", partition=0)
    aborted.flush()  # in the log, then aborted: the records are there for a forged COMMIT to expose
    aborted.abort_transaction()
    _state, pid, epoch = settled(admin, "door-aborted", "CompleteAbort")
    before = offsets(wire)
    attempt_everywhere(
        cluster, leader, tmp_path, lambda s: s.WriteTxnMarkers(marker(pid, epoch, True, 2**31 - 1), timeout=10)
    )
    assert offsets(wire) == before
    assert [v for _o, v in wire.read_all(TOPIC, 0)] == visible
    assert state_of(admin, "door-aborted") == ("CompleteAbort", pid, epoch)

    # 2. An open transaction: a forged COMMIT neither exposes it nor moves the LSO; a forged ABORT
    #    with a huge coordinator epoch does not end it, and its producer still commits it after.
    open_txn = Producer(bootstrap_servers=cluster.bootstrap_servers, transactional_id="door-open")
    open_txn.init_transactions()
    open_txn.begin_transaction()
    open_txn.send(TOPIC, b"open-1", partition=0)
    open_txn.flush()
    state, pid, epoch = state_of(admin, "door-open")
    assert state == "Ongoing"
    lso, hw = offsets(wire)
    assert lso < hw  # the open transaction holds the LSO back
    for committed in (True, False):
        attempt_everywhere(
            cluster,
            leader,
            tmp_path,
            lambda s, c=committed: s.WriteTxnMarkers(marker(pid, epoch, c, 2**31 - 1), timeout=10),
        )
        assert offsets(wire) == (lso, hw)
        assert [v for _o, v in wire.read_all(TOPIC, 0)] == visible
        assert state_of(admin, "door-open") == ("Ongoing", pid, epoch)
    open_txn.commit_transaction()
    _state, pid, epoch = settled(admin, "door-open", "CompleteCommit")
    visible += [b"open-1"]
    assert [v for _o, v in wire.read_all(TOPIC, 0)] == visible

    # 3. A committed transaction stays visible after a forged ABORT with a huge coordinator epoch,
    #    and its coordinator is not wedged: the same producer runs and commits the next one.
    before = offsets(wire)
    attempt_everywhere(
        cluster, leader, tmp_path, lambda s: s.WriteTxnMarkers(marker(pid, epoch, False, 2**31 - 1), timeout=10)
    )
    assert offsets(wire) == before
    assert [v for _o, v in wire.read_all(TOPIC, 0)] == visible
    open_txn.begin_transaction()
    open_txn.send(TOPIC, b"open-2", partition=0)
    open_txn.commit_transaction(timeout=60)
    settled(admin, "door-open", "CompleteCommit")
    assert [v for _o, v in wire.read_all(TOPIC, 0)] == [*visible, b"open-2"]
    for p in (aborted, open_txn):
        p.close()
    admin.close()
    wire.close()


def test_forged_replica_fetch_moves_no_high_watermark_or_isr(cluster: LocalCluster, tmp_path: Path) -> None:
    leader = cluster.leader(TOPIC, 0)
    followers = [b for b in range(3) if b != leader]
    wire = Wire(cluster.address(leader))
    isr = sorted(cluster.partition_state(TOPIC, 0)["isr"])
    assert len(isr) == 3
    for f in followers:
        cluster.pause(f)
    try:
        # acks=1: the leader appends, the high watermark waits for followers that are paused.
        _lso, hw = offsets(wire)
        resp = wire.produce(TOPIC, 0, batch_of([b"unreplicated"]), acks=1)
        assert resp.error_code == pb.NONE, resp.error_message
        leo = int(resp.base_offset) + 1
        assert offsets(wire)[1] == hw
        partition_epoch = int(cluster.partition_state(TOPIC, 0)["leader_epoch"])
        for f in followers:  # each follower impersonated, claiming to hold everything
            forged = ipb.ReplicaFetchRequest(
                replica_id=f,
                max_wait_ms=0,
                partitions=[
                    ipb.ReplicaFetchPartition(
                        topic=TOPIC,
                        partition=0,
                        fetch_offset=leo,
                        current_leader_epoch=partition_epoch,
                        last_fetched_epoch=partition_epoch,
                    )
                ],
            )
            attempt_everywhere(cluster, leader, tmp_path, lambda s, r=forged: s.ReplicaFetch(r, timeout=10))
            attempt_everywhere(  # the same on the stream followers use: refused before an answer
                cluster, leader, tmp_path, lambda s, r=forged: list(s.ReplicaFetchStream(iter([r]), timeout=10))
            )
            epochs = ipb.OffsetsForLeaderEpochRequest(
                replica_id=f,
                partitions=[
                    ipb.OffsetsForLeaderEpochPartition(
                        topic=TOPIC, partition=0, current_leader_epoch=partition_epoch, leader_epoch=partition_epoch
                    )
                ],
            )
            attempt_everywhere(cluster, leader, tmp_path, lambda s, r=epochs: s.OffsetsForLeaderEpoch(r, timeout=10))
        assert offsets(wire)[1] == hw, "a forged ReplicaFetch advanced the high watermark"
        assert sorted(cluster.partition_state(TOPIC, 0)["isr"]) == isr
    finally:
        for f in followers:
            cluster.resume(f)
    # The real followers, over mutual TLS, are what moves it: the test can tell the difference.
    cluster.wait_for_partition(TOPIC, 0, lambda p: sorted(p["isr"]) == isr, what="the same ISR")
    for _ in range(600):  # bounded: 60 s on a loaded machine
        if offsets(wire)[1] >= leo:
            break
        time.sleep(0.1)
    assert offsets(wire)[1] >= leo
    wire.close()
