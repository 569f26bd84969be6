"""Certificates renewed and the cluster CA rotated under a running exactly-once copy, no restart.

Three brokers, replication factor 3 (every partition's replication and every transaction's
markers go over the inter-broker listener's mutual TLS). Copier processes
(``python -m sluice.cli.copier``, as in test_copier.py) copy input to output in transactions
while the cluster takes the operator's certificate steps (:mod:`sluice.cert_rotation`) over its
data directory: the broker certificates are renewed, then the CA is rotated (trust old + new,
re-issue every certificate from the new CA, drop the old one). Each step runs while a copy
round is in flight and waits for the brokers to reload their files.

At the end: the output holds every input record exactly once, in input order per partition; a
read_committed reader saw no duplicate and no aborted record; no end offset went back; the same
broker processes run (same pids: they reloaded, nobody restarted them); every partition's ISR is
whole; a peer with a certificate of the old CA was accepted during the overlap and is refused
after the drop, while the brokers' new certificates are accepted.
"""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from pathlib import Path

import grpc
import pytest

from sluice import cert_rotation, tls
from sluice.api.v1 import broker_pb2 as bpb
from sluice.api.v1 import broker_pb2_grpc
from sluice.client import Admin, Producer, TopicPartition
from sluice.testing import ClusterError, LocalCluster
from sluice.testing.certs import read_broker_certs, read_cluster_ca

from .helpers import OffsetMonitor, read_topic
from .test_copier import Copiers, Watcher

# Per copy round (two copiers, transactions of 100): long enough to outlast a step. 4000 was not on
# 2026-11-28: a transaction now takes ~50 ms, so a copier finished its 2000 in 1.2 s, before a
# renewal (reported by every broker ~1.3 s after it began) was over.
ROUND_MESSAGES = 16000
CONFIG = {"min.insync.replicas": "2", "replica.lag.time.max.ms": "3000"}
COPY_LIMIT_S = 300.0


def produce_input(bootstrap: str, start: int, count: int) -> list[bytes]:
    """``count`` more numbered records on input partitions 0 and 1 (value ``<partition>:<seq>``)."""
    producer = Producer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
    sent = []
    for i in range(start, start + count):
        p = i % 2
        value = f"{p}:{i // 2}".encode()
        producer.send("input", key=value, value=value, partition=p)
        sent.append(value)
    producer.flush()
    producer.close()
    return sent


def events(logs: Path, copier: int) -> Counter[str]:
    """How many of each progress event copier ``copier`` wrote so far (its log spans every round)."""
    path = logs / f"copier-{copier}.log"
    text = path.read_text() if path.exists() else ""
    return Counter(
        line.split('"event": "', 1)[1].split('"', 1)[0] for line in text.splitlines() if '"event": "' in line
    )


def peer_accepted(cluster: LocalCluster, broker: int, trust: bytes, pair: tls.KeyPair) -> bool | grpc.StatusCode:
    """Whether ``broker``'s inter-broker listener serves a peer presenting ``pair`` (True), or the code it got."""
    b = cluster.broker(broker)
    creds = grpc.ssl_channel_credentials(trust, pair.key_pem, pair.cert_pem)
    options = [("grpc.ssl_target_name_override", tls.BROKER_SERVER_NAME)]
    with grpc.secure_channel(f"{b.host}:{b.inter_broker_port}", creds, options=options) as channel:
        stub = broker_pb2_grpc.BrokerStub(channel)  # type: ignore[no-untyped-call]
        try:
            stub.Metadata(bpb.MetadataRequest(topics=["input"]), timeout=10)
        except grpc.RpcError as exc:
            return exc.code()  # type: ignore[attr-defined,no-any-return]
    return True


def test_rotation_keeps_a_transactional_copy_exactly_once(tmp_path: Path) -> None:
    with LocalCluster(brokers=3, data_dir=tmp_path, config=CONFIG, failure_timeout_ms=1000) as cluster:
        admin = Admin(bootstrap_servers=cluster.bootstrap_servers)
        admin.create_topic("input", partitions=2, replication_factor=3)
        admin.create_topic("output", partitions=3, replication_factor=3)
        admin.close()
        pids = {i: cluster.broker(i).pid for i in range(3)}
        ca0 = read_cluster_ca(cluster.data_dir)
        certs0 = read_broker_certs(cluster.data_dir, range(3)).certs
        watcher = Watcher(cluster.bootstrap_servers)
        watcher.start()
        monitor = OffsetMonitor(
            cluster.bootstrap_servers, [TopicPartition("output", p) for p in range(3)], interval=0.25
        ).start()
        sent: list[bytes] = []
        copiers = Copiers(cluster, tmp_path, group_mode=False)
        overlap: dict[str, object] = {}

        def copy_round(step: str) -> list[str]:
            """One copy round with one certificate step in flight; what the step did."""
            sent.extend(produce_input(cluster.bootstrap_servers, len(sent), ROUND_MESSAGES))
            before = {i: events(tmp_path, i) for i in range(2)}
            for i in range(2):
                copiers.start(i)
            # the step starts once both copiers committed a transaction in this round ...
            deadline = time.monotonic() + 120
            while not all(events(tmp_path, i)["committed"] > before[i]["committed"] for i in range(2)):
                assert time.monotonic() < deadline, f"round {step}: no commit within 120 s\n{copiers.log_tail()}"
                assert copiers.running(), f"round {step}: the copiers ended\n{copiers.log_tail()}"
                time.sleep(0.1)
            if step == "renew":
                done = cluster.renew_certificates(timeout=90)
            elif step == "trust":
                done = cluster.rotate_ca(timeout=90, stop_at=cert_rotation.REISSUE_CERTS)
            elif step == "reissue":
                done = cluster.rotate_ca(timeout=90, stop_at=cert_rotation.DROP_OLD_CA)
            else:
                done = cluster.rotate_ca(timeout=90)
            # ... and ends (every running broker reloaded the files) while they are still copying
            still = {i: events(tmp_path, i)["done"] == before[i]["done"] for i in range(2)}
            assert all(still.values()), f"round {step}: a copy finished before the brokers reloaded ({still})"
            codes = copiers.wait(COPY_LIMIT_S)
            assert all(c == 0 for c in codes.values()), f"round {step}: copiers ended {codes}\n{copiers.log_tail()}"
            return done

        # 1. renewal: every certificate re-issued by the same CA
        done = copy_round("renew")
        assert done == ["renewed the certificates of brokers [0, 1, 2]"], done
        certs1 = read_broker_certs(cluster.data_dir, range(3)).certs
        for i in range(3):
            assert certs1[i].cert_pem != certs0[i].cert_pem
            assert tls.signed_by(certs1[i].cert_pem, ca0.current.cert_pem)
        reports = cluster.certificate_reports()
        assert {i: reports[i].certificate for i in range(3)} == {
            i: tls.fingerprint(certs1[i].cert_pem) for i in range(3)
        }

        # 2. a new CA trusted beside the old one; certificates still the old CA's
        done = copy_round("trust")
        assert done[0].startswith("CA rotation to generation 1 started (forced)"), done
        ca1 = read_cluster_ca(cluster.data_dir)
        assert ca1.phase == cert_rotation.REISSUE_CERTS and ca1.generation == 1
        both = frozenset({tls.fingerprint(ca0.current.cert_pem), tls.fingerprint(ca1.current.cert_pem)})
        assert all(r.trusted == both for r in cluster.certificate_reports().values())
        overlap["old certificate, during the overlap"] = peer_accepted(cluster, 0, ca1.trust_bundle(), certs1[1])

        # 3. every certificate re-issued by the new CA, the old one still trusted
        copy_round("reissue")
        certs2 = read_broker_certs(cluster.data_dir, range(3)).certs
        assert all(tls.signed_by(certs2[i].cert_pem, ca1.current.cert_pem) for i in range(3))
        assert read_cluster_ca(cluster.data_dir).phase == cert_rotation.DROP_OLD_CA

        # 4. the old CA dropped
        done = copy_round("drop")
        assert done[-1] == "CA rotation to generation 1 complete", done
        assert read_cluster_ca(cluster.data_dir).phase == cert_rotation.READY
        new_only = frozenset({tls.fingerprint(ca1.current.cert_pem)})
        assert all(r.trusted == new_only for r in cluster.certificate_reports().values())
        for i in range(3):
            assert (cluster.data_dir / "tls" / f"broker-{i}" / "ca.crt").read_bytes() == ca1.current.cert_pem

        # old-CA-only peers refused by every broker, the brokers' own new certificates accepted
        for i in range(3):
            overlap[f"old certificate at broker {i}, after the drop"] = peer_accepted(
                cluster, i, ca1.current.cert_pem, certs1[(i + 1) % 3]
            )
            overlap[f"new certificate at broker {i}"] = peer_accepted(
                cluster, i, ca1.current.cert_pem, certs2[(i + 1) % 3]
            )
        monitor.stop()
        monitor.check()

        # no broker restarted; every ISR whole again (replication kept going over the new certificates)
        assert {i: cluster.broker(i).pid for i in range(3)} == pids
        for topic, partitions in (("input", 2), ("output", 3)):
            for p in range(partitions):
                cluster.wait_for_partition(
                    topic, p, lambda s: sorted(s["isr"]) == sorted(s["replicas"]), timeout=60, what="a whole ISR"
                )
        for i in range(3):
            assert "TLS material reloaded (version 5)" in (cluster.data_dir / f"broker-{i}.log").read_text()

        records = read_topic(cluster.bootstrap_servers, "output", limit_s=120)
        time.sleep(1.0)
        watcher.stop_event.set()
        watcher.join(30)
        assert watcher.error is None, watcher.error

    assert overlap == {
        "old certificate, during the overlap": True,
        **{f"old certificate at broker {i}, after the drop": grpc.StatusCode.UNAVAILABLE for i in range(3)},
        **{f"new certificate at broker {i}": True for i in range(3)},
    }
    copied = Counter(r[3] for r in records)
    assert [v for v, n in copied.items() if n > 1] == [], "duplicates in the output"
    assert set(copied) == set(sent), f"lost {len(set(sent) - set(copied))}, unexpected {len(set(copied) - set(sent))}"
    assert [v for v, n in watcher.seen.items() if n > 1] == [], "the live reader saw duplicates or aborted records"
    assert set(watcher.seen) <= set(sent)
    order: dict[tuple[int, int], list[int]] = defaultdict(list)
    for partition, _offset, _key, value in sorted(records, key=lambda r: (r[0], r[1])):
        assert value is not None
        src, seq = value.decode().split(":")
        order[(partition, int(src))].append(int(seq))
    for key, seqs in order.items():
        assert seqs == sorted(seqs), f"out of order in output partition {key[0]} for input partition {key[1]}"


def test_rotate_ca_refuses_a_secure_cluster_for_now(tmp_path: Path) -> None:
    cluster = LocalCluster(brokers=1, data_dir=tmp_path, secure=True)
    with pytest.raises(ClusterError, match="not supported on a secure LocalCluster"):
        cluster.rotate_ca()
