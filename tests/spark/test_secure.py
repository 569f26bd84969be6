"""The sluice source and sink against a secure cluster (mutual TLS clients, the authorizer on).

A batch job reads a topic and writes it to another exactly once, connecting as ``User:etl``
with the TLS options (``security.protocol``, ``ssl.*.location``), with ACLs granting what the
job needs and nothing else: Read on the input topic, Write on the output topic and on the
transactional ids of its prefix. Without them the job is refused with Kafka's authorization
errors, and nothing is written.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from pyspark.errors import PySparkException
from pyspark.sql import SparkSession

from sluice.acls import AclBinding, AclOperation, AclPermissionType, ResourcePatternType, ResourceType
from sluice.client import Admin, Consumer, Producer, TopicPartition
from sluice.testing import LocalCluster

pytestmark = pytest.mark.timeout(900)
ROWS = 200
PREFIX = "etl-secure"


def _tls_options(cfg: dict[str, str]) -> dict[str, str]:
    return {
        "bootstrap.servers": cfg["bootstrap_servers"],
        "kafka.security.protocol": "SSL",
        "ssl.ca.location": cfg["ssl_cafile"],
        "ssl.certificate.location": cfg["ssl_certfile"],
        "ssl.key.location": cfg["ssl_keyfile"],
    }


def _allow(
    principal: str, rtype: ResourceType, name: str, op: AclOperation, pattern: ResourcePatternType
) -> AclBinding:
    return AclBinding(rtype, name, pattern, principal, "*", op, AclPermissionType.ALLOW)


def _committed_values(cfg: dict[str, str], topic: str) -> Counter[bytes]:
    tps = [TopicPartition(topic, 0)]
    seen: Counter[bytes] = Counter()
    with Consumer(**cfg, group_id=None, isolation_level="read_committed") as consumer:
        consumer.assign(tps)
        consumer.seek_to_beginning(tps)
        end = consumer.end_offsets(tps)[tps[0]]
        for _ in range(600):
            if consumer.position(tps[0]) >= end:
                break
            for r in consumer.poll(timeout=0.5):
                assert r.value is not None
                seen[r.value] += 1
    return seen


def test_secure_read_and_write_exactly_once_with_acls(spark: SparkSession, tmp_path: Path) -> None:
    with LocalCluster(brokers=1, data_dir=tmp_path / "c", secure=True) as cluster:
        admin_cfg = cluster.client_config("admin")
        etl = _tls_options(cluster.client_config("etl"))
        with Admin(**admin_cfg) as admin:
            admin.create_topic("in", 1, 1)
            admin.create_topic("out", 1, 1)
        with Producer(**admin_cfg) as producer:
            for i in range(ROWS):
                producer.send("in", f"row-{i}".encode(), partition=0)
            producer.flush()

        def read() -> object:
            return spark.read.format("sluice").options(**etl, subscribe="in").load().select("value")

        # no ACL: the read is refused by the authorizer
        with pytest.raises(PySparkException) as info:
            read().collect()  # type: ignore[attr-defined]
        assert "TopicAuthorizationFailed" in str(info.value) or "TOPIC_AUTHORIZATION_FAILED" in str(info.value)

        with Admin(**admin_cfg) as admin:
            admin.create_acls(
                [_allow("User:etl", ResourceType.TOPIC, "in", AclOperation.READ, ResourcePatternType.LITERAL)]
            )
        rows = read().collect()  # type: ignore[attr-defined]
        assert sorted(bytes(r.value) for r in rows) == sorted(f"row-{i}".encode() for i in range(ROWS))

        def write() -> None:
            df = read()
            df.write.format("sluice").mode("append").options(  # type: ignore[attr-defined]
                **etl, topic="out", transactionalIdPrefix=PREFIX
            ).save()

        # reading is allowed, writing is not: refused, nothing visible in the output
        with pytest.raises(PySparkException) as info:
            write()
        text = str(info.value)
        assert "AuthorizationFailed" in text or "AUTHORIZATION_FAILED" in text, text[-3000:]
        assert _committed_values(admin_cfg, "out") == Counter()

        with Admin(**admin_cfg) as admin:
            admin.create_acls(
                [
                    _allow("User:etl", ResourceType.TOPIC, "out", AclOperation.WRITE, ResourcePatternType.LITERAL),
                    _allow("User:etl", ResourceType.TRANSACTIONAL_ID, PREFIX, AclOperation.WRITE,
                           ResourcePatternType.PREFIXED),
                ]
            )  # fmt: skip
        write()
        seen = _committed_values(admin_cfg, "out")
        assert seen == Counter({f"row-{i}".encode(): 1 for i in range(ROWS)})


def test_tls_options_are_checked_before_reading(spark: SparkSession, tmp_path: Path) -> None:
    base = {"bootstrap.servers": "127.0.0.1:1", "subscribe": "t"}
    cases = [
        ({"kafka.ssl.truststore.location": "/x.jks"}, "not Java key stores; use ssl.ca.location"),
        ({"security.protocol": "SASL_PLAINTEXT"}, "must be PLAINTEXT, SSL or SASL_SSL"),
        ({"security.protocol": "SASL_SSL"}, "SASL_SSL needs 'ssl.ca.location'"),
        ({"security.protocol": "SSL"}, "needs 'ssl.ca.location'"),
        ({"security.protocol": "SSL", "ssl.ca.location": str(tmp_path / "none.crt")}, "none.crt"),
    ]
    for extra, message in cases:
        with pytest.raises(PySparkException) as info:
            spark.read.format("sluice").options(**base, **extra).load().collect()
        assert message in str(info.value), (extra, str(info.value)[-2000:])
    from sluice.spark.writer import SluiceWriteOptionError, parse_write_options

    with pytest.raises(SluiceWriteOptionError, match="not Java key stores"):
        parse_write_options({"bootstrap.servers": "x:1", "kafka.ssl.keystore.location": "/k.jks"})
    opts = parse_write_options({"bootstrap.servers": "x:1"})
    assert opts.security.client_kwargs() == {}
