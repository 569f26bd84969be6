"""``sluice produce`` ended by an error reports the records the brokers acknowledged, and only those.

It used to count the records handed to the producer ("1 record(s) were sent before the error"
when the broker had refused that one record). The count it prints must be what a reader finds.
Also the options Kafka's console tools have: ``--producer-property`` / ``--consumer-property``
(and ``--command-property``) with Kafka's setting names, and consume's ``--timeout-ms``.
"""

from __future__ import annotations

import io
import re
import sys
import time
from collections.abc import Iterator

import pytest

from sluice import cli
from sluice.client import Admin
from sluice.testing import LocalCluster

from .helpers import read_topic


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(brokers=1, data_dir=tmp_path_factory.mktemp("produce-errors")) as c:
        yield c


def produce(cluster: LocalCluster, topic: str, data: bytes, monkeypatch: pytest.MonkeyPatch,
            capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[int, str]:  # fmt: skip
    capsys.readouterr()
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))
    code = cli.main(["produce", topic, "--bootstrap-server", cluster.bootstrap_servers, *extra])
    return code, capsys.readouterr().err


def small_topic(cluster: LocalCluster, name: str) -> None:
    admin = Admin(bootstrap_servers=cluster.bootstrap_servers)
    try:
        admin.create_topic(name, partitions=1, config={"max.message.bytes": "2000"})
    finally:
        admin.close()


def test_a_refused_record_alone_is_reported_as_nothing_written(
    cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    small_topic(cluster, "refused-alone")
    code, err = produce(cluster, "refused-alone", b"x" * 5000 + b"\n", monkeypatch, capsys)
    assert code == 1
    assert "no record was written (acknowledged) before the error" in err and "were sent" not in err, err
    assert read_topic(cluster.bootstrap_servers, "refused-alone") == []


def test_the_count_reported_is_what_a_reader_finds(
    cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    small_topic(cluster, "refused-later")
    lines = b"".join(b"ok-%d\n" % i for i in range(5)) + b"y" * 5000 + b"\n" + b"after\n"
    code, err = produce(cluster, "refused-later", lines, monkeypatch, capsys)
    assert code == 1
    found = read_topic(cluster.bootstrap_servers, "refused-later")
    match = re.search(r"(\d+) of 7 record\(s\) were written \(acknowledged\) before the error", err)
    if found:
        assert match is not None and int(match.group(1)) == len(found), err
    else:  # the refused record shared its batch with the others: nothing written, and it says so
        assert "no record was written (acknowledged) before the error" in err, err


def test_kafka_style_properties_and_timeout_ms(
    cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """--producer-property / --consumer-property (Kafka's names) reach the clients; --timeout-ms ends consume."""
    admin = Admin(bootstrap_servers=cluster.bootstrap_servers)
    try:
        admin.create_topic("props", partitions=1)
    finally:
        admin.close()
    lines = b"".join(b"v%d\n" % i for i in range(10))
    props = ["--producer-property", "compression.type=zstd", "--producer-property", "batch.size=64",
             "--command-property", "delivery.timeout.ms=30000"]  # fmt: skip
    code, err = produce(cluster, "props", lines, monkeypatch, capsys, *props)
    assert code == 0 and "produced 10 record(s)" in err, err
    # a bad one is a usage error naming it
    code, err = produce(cluster, "props", b"x\n", monkeypatch, capsys, "--producer-property", "linger.ms=soon")
    assert code == 2 and "--producer-property linger.ms=soon: expected an integer" in err, err

    consume = ["consume", "props", "--group", "props-group", "--from-beginning", "--bootstrap-server",
               cluster.bootstrap_servers]  # fmt: skip
    code = cli.main([*consume, "--max-messages", "3", "--consumer-property", "max.poll.records=2", "--timeout", "30"])
    assert code == 0
    assert capsys.readouterr().out.split() == ["v0", "v1", "v2"]
    admin = Admin(bootstrap_servers=cluster.bootstrap_servers)
    try:  # what was printed is committed, not the second poll's extra record
        assert {tp.partition: o for tp, o in admin.list_consumer_group_offsets("props-group").items()} == {0: 3}
    finally:
        admin.close()
    started = time.monotonic()
    assert cli.main([*consume, "--timeout-ms", "1500"]) == 0  # the 7 left, then 1.5 s of nothing
    assert capsys.readouterr().out.split() == [f"v{i}" for i in range(3, 10)]
    assert time.monotonic() - started < 20


def test_compression_type_on_a_topic_is_refused_saying_why(
    cluster: LocalCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    capsys.readouterr()
    code = cli.main(["topics", "create", "compressed", "--config", "compression.type=zstd",
                     "--bootstrap-server", cluster.bootstrap_servers])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 1 and "INVALID_CONFIG" in err and "the broker never recompresses" in err, err


def test_topics_alter_adds_partitions_and_never_removes(
    cluster: LocalCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    boot = ["--bootstrap-server", cluster.bootstrap_servers]
    assert cli.main(["topics", "create", "growing", "--partitions", "2", *boot]) == 0
    capsys.readouterr()
    assert cli.main(["topics", "alter", "growing", "--partitions", "5", *boot]) == 0
    assert "topic growing: 2 -> 5 partitions" in capsys.readouterr().err
    admin = Admin(bootstrap_servers=cluster.bootstrap_servers)
    try:
        assert len(admin.describe_topic("growing").partitions) == 5
    finally:
        admin.close()
    assert cli.main(["topics", "alter", "growing", "--partitions", "3", *boot]) == 2
    assert "has 5 partition(s): --partitions must be more" in capsys.readouterr().err
    assert cli.main(["topics", "alter", "no-such-topic", "--partitions", "3", *boot]) == 1
    assert "unknown topic 'no-such-topic'" in capsys.readouterr().err
