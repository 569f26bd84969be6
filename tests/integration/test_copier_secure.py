"""The standalone copier (``python -m sluice.cli.copier``) against a secure cluster: mutual TLS, ACLs.

It connects with ``--command-config`` as its certificate's principal, which has only the ACLs a
copier needs; without the settings, or with a bad file, it does not copy a record.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from sluice.acls import AclBinding, AclOperation, AclPermissionType, ResourcePatternType, ResourceType
from sluice.client import Admin, Consumer, Producer, TopicPartition
from sluice.testing import LocalCluster


def _allow(admin: Admin, principal: str, rtype: ResourceType, name: str, *ops: AclOperation) -> None:
    admin.create_acls(
        [
            AclBinding(rtype, name, ResourcePatternType.LITERAL, principal, "*", op, AclPermissionType.ALLOW)
            for op in ops
        ]
    )


def _copier(cluster: LocalCluster, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable, "-m", "sluice.cli.copier", "--bootstrap-server", cluster.bootstrap_servers,
            "--input", "in", "--output", "out", "--group", "copiers", "--transactional-id", "copier-0",
            "--partition", "0", "--transaction-size", "50", "--max-seconds", "90", *extra,
        ],
        capture_output=True, text=True, timeout=150,
    )  # fmt: skip


def test_the_copier_runs_with_tls_as_its_own_principal(tmp_path: Path) -> None:
    with LocalCluster(brokers=1, data_dir=tmp_path / "c", secure=True) as cluster:
        admin = Admin(**cluster.client_config("admin"))
        admin.create_topic("in", partitions=1, replication_factor=1)
        admin.create_topic("out", partitions=1, replication_factor=1)
        with Producer(**cluster.client_config("admin"), linger_ms=5) as producer:
            for i in range(200):
                producer.send("in", value=b"r%d" % i)
        who = "User:copier"
        _allow(admin, who, ResourceType.TOPIC, "in", AclOperation.READ)
        _allow(admin, who, ResourceType.TOPIC, "out", AclOperation.WRITE)
        _allow(admin, who, ResourceType.GROUP, "copiers", AclOperation.READ)
        _allow(admin, who, ResourceType.TRANSACTIONAL_ID, "copier-0", AclOperation.WRITE)
        cfg = cluster.client_config("copier")
        props = tmp_path / "copier.properties"
        props.write_text(
            f"security.protocol=SSL\nssl.ca.location={cfg['ssl_cafile']}\n"
            f"ssl.certificate.location={cfg['ssl_certfile']}\nssl.key.location={cfg['ssl_keyfile']}\n"
        )
        bad = tmp_path / "bad.properties"
        bad.write_text("security.protocol=SSL\n")  # no CA
        refused = _copier(cluster, "--command-config", str(bad))
        assert refused.returncode == 2 and "ssl.ca.location" in refused.stderr, refused.stderr
        done = _copier(cluster, "--command-config", str(props))
        assert done.returncode == 0, done.stderr[-2000:]
        assert _read(cluster, "out") == [b"r%d" % i for i in range(200)]  # exactly once, in order
        admin.close()


def _read(cluster: LocalCluster, topic: str) -> list[bytes | None]:
    """The committed records of partition 0 of ``topic``, read as the super user (bounded)."""
    consumer = Consumer(**cluster.client_config("admin"), group_id=None)
    tp = TopicPartition(topic, 0)
    consumer.assign([tp])
    consumer.seek(tp, 0)
    end = consumer.end_offsets([tp])[tp]
    out: list[bytes | None] = []
    deadline = time.monotonic() + 60
    while consumer.position(tp) < end and time.monotonic() < deadline:
        out += [r.value for r in consumer.poll(timeout=1.0)]
    consumer.close()
    return out
