"""``sluice consumer-groups reset-offsets --to-datetime / --by-duration`` against a real broker.

Kafka's tool resets to the first offset whose record's timestamp is at least the time asked (the
log end when no record is that recent). Records here carry timestamps one hour apart, so each
target names one offset.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

from sluice import cli
from sluice.client import Admin, Producer, TopicPartition
from sluice.testing import LocalCluster

HOUR_MS = 3_600_000
TOPIC, GROUP = "by-time", "by-time-group"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(brokers=1, data_dir=tmp_path_factory.mktemp("reset-by-time")) as c:
        yield c


def test_reset_to_a_datetime_and_by_a_duration(cluster: LocalCluster, capsys: pytest.CaptureFixture[str]) -> None:
    now = int(time.time() * 1000)
    admin = Admin(bootstrap_servers=cluster.bootstrap_servers)
    producer = Producer(bootstrap_servers=cluster.bootstrap_servers)
    try:
        admin.create_topic(TOPIC, partitions=1)
        for hours_ago in (5, 4, 3, 2, 1):  # offsets 0..4
            producer.send(TOPIC, b"%dh ago" % hours_ago, partition=0, timestamp_ms=now - hours_ago * HOUR_MS)
        producer.flush()
        boot = ["--bootstrap-server", cluster.bootstrap_servers]
        tp = TopicPartition(TOPIC, 0)

        def reset(*target: str) -> int:
            code = cli.main(["consumer-groups", "reset-offsets", GROUP, "--topic", TOPIC, *target, "--execute", *boot])
            assert code == 0, capsys.readouterr().err
            capsys.readouterr()
            return admin.list_consumer_group_offsets(GROUP)[tp]

        three_and_a_half_hours_ago = datetime.fromtimestamp((now - 3.5 * HOUR_MS) / 1000, UTC)
        assert reset("--to-datetime", three_and_a_half_hours_ago.isoformat(timespec="milliseconds")) == 2
        assert reset("--to-datetime", three_and_a_half_hours_ago.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z") == 2
        local = datetime.fromtimestamp((now - 1.5 * HOUR_MS) / 1000)  # no zone: local time, as Kafka's tool
        assert reset("--to-datetime", local.strftime("%Y-%m-%dT%H:%M:%S")) == 4
        assert reset("--by-duration", "PT2H30M") == 3
        assert reset("--by-duration", "P1D") == 0
        assert reset("--by-duration", "PT1S") == 5  # no record that recent: the log end
        with pytest.raises(SystemExit) as usage:  # argparse's usage error
            cli.main(["consumer-groups", "reset-offsets", GROUP, "--topic", TOPIC, "--by-duration", "30M", *boot])
        assert usage.value.code == 2 and "ISO 8601 duration" in capsys.readouterr().err
    finally:
        producer.close()
        admin.close()
