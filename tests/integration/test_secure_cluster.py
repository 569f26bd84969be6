"""A secure LocalCluster: client listeners are mutual TLS; TLS material stays private on disk.

``LocalCluster(secure=True)`` gives every broker ``--client-listener mtls``; a client connects
with ``cluster.client_config(name)`` (a certificate for CN ``name`` from the cluster's clients
CA). A client without a certificate, with one from another CA, or in plaintext, gets no answer
(the TLS handshake fails: nothing reaches a handler). Every file in ``data_dir/tls`` is mode
0600, in secure and default clusters alike.
"""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from sluice import errors, tls
from sluice.client import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    Admin,
    Consumer,
    Producer,
    ResourcePatternType,
    ResourceType,
    TopicPartition,
)
from sluice.testing import LocalCluster

T, LIT = ResourceType.TOPIC, ResourcePatternType.LITERAL


def private_files(root: Path) -> dict[str, int]:
    """Every file under ``root`` whose mode is not 0600 (relative path -> mode)."""
    return {
        str(p.relative_to(root)): stat.S_IMODE(p.stat().st_mode)
        for p in root.rglob("*")
        if p.is_file() and stat.S_IMODE(p.stat().st_mode) != 0o600
    }


def test_mtls_clients_connect_with_their_certificate_and_others_do_not(tmp_path: Path) -> None:
    with LocalCluster(brokers=1, data_dir=tmp_path / "c", secure=True) as cluster:
        alice = cluster.client_config("alice")
        assert alice["security_protocol"] == "SSL"
        with Admin(**cluster.client_config("admin")) as admin:  # the super user: topic and ACLs
            admin.create_topic("secure", 1, 1)
            admin.create_acls(
                [
                    AclBinding(T, "secure", LIT, "User:alice", "*", AclOperation.WRITE, AclPermissionType.ALLOW),
                    AclBinding(T, "secure", LIT, "User:bob", "*", AclOperation.READ, AclPermissionType.ALLOW),
                ]
            )
        with Producer(**alice) as producer:
            producer.send("secure", b"hello", partition=0).get(timeout=60)
        consumer = Consumer(**cluster.client_config("bob"), group_id=None)
        consumer.assign([TopicPartition("secure", 0)])
        consumer.seek_to_beginning()
        got: list[bytes | None] = []
        for _ in range(40):
            got += [r.value for r in consumer.poll(timeout=0.5)]
            if got:
                break
        consumer.close()
        assert got == [b"hello"]

        # plaintext, TLS without a client certificate, a certificate from another CA: no answer.
        other_ca = tls.generate_ca("someone-else")
        stranger = tls.issue(other_ca, "alice")
        tls.write_dir(tmp_path / "stranger", Path(alice["ssl_cafile"]).read_bytes(), stranger)
        attempts = {
            "plaintext": {"bootstrap_servers": cluster.bootstrap_servers},
            "no certificate": {
                "bootstrap_servers": cluster.bootstrap_servers,
                "security_protocol": "SSL",
                "ssl_cafile": alice["ssl_cafile"],
            },
            "another CA": {
                "bootstrap_servers": cluster.bootstrap_servers,
                "security_protocol": "SSL",
                "ssl_cafile": alice["ssl_cafile"],
                "ssl_certfile": str(tmp_path / "stranger" / tls.CERT_FILE),
                "ssl_keyfile": str(tmp_path / "stranger" / tls.KEY_FILE),
            },
        }
        for what, kwargs in attempts.items():
            with Admin(**kwargs, request_timeout_ms=3000) as admin:
                with pytest.raises(errors.SluiceError) as info:
                    admin.list_topics(timeout=5)
                assert info.value.retriable, what  # unreachable as far as the client can tell
        assert private_files(cluster.data_dir / "tls") == {}


def test_a_default_cluster_keeps_its_ca_private_and_plaintext_clients_work(tmp_path: Path) -> None:
    with LocalCluster(brokers=1, data_dir=tmp_path / "c") as cluster:
        assert cluster.client_config("anyone") == {"bootstrap_servers": cluster.bootstrap_servers}
        with Admin(**cluster.client_config("anyone")) as admin:
            assert "__consumer_offsets" not in admin.list_topics()
        tls_dir = cluster.data_dir / "tls"
        assert (tls_dir / "cluster-ca.key").exists()
        assert private_files(tls_dir) == {}
        assert stat.S_IMODE(tls_dir.stat().st_mode) == 0o700
