"""A topic's config overrides changed over gRPC (AlterTopicConfigs) and from the CLI, on a real broker.

The rules are Kafka's IncrementalAlterConfigs' (the Kafka listener's tests cover the same core):
SET and DELETE per key, all or nothing per topic, an unknown key or a bad value refused naming
the key, internal topics refused; `sluice topics alter --config/--delete-config` drives it.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest

from sluice import errors
from sluice.client import Admin
from sluice.testing import LocalCluster


@pytest.fixture
def admin(cluster: LocalCluster) -> Iterator[Admin]:
    with Admin(bootstrap_servers=cluster.bootstrap_servers) as a:
        yield a


def sluice(cluster: LocalCluster, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sluice", *args, "--bootstrap-server", cluster.bootstrap_servers],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_set_and_delete_overrides_all_or_nothing(admin: Admin, unique_topic: str) -> None:
    admin.create_topic(unique_topic, 1, 1, config={"cleanup.policy": "compact"})
    admin.alter_topic_config(unique_topic, {"retention.ms": "3600000", "cleanup.policy": None})
    assert admin.describe_topic(unique_topic).config == {"retention.ms": "3600000"}
    # one bad key refuses the whole change, naming the key; the good one is not applied either
    with pytest.raises(errors.InvalidConfigError, match=r"no\.such\.key"):
        admin.alter_topic_config(unique_topic, {"retention.bytes": "1048576", "no.such.key": "1"})
    with pytest.raises(errors.InvalidConfigError, match=r"min\.insync\.replicas"):
        admin.alter_topic_config(unique_topic, {"min.insync.replicas": "zero"})
    admin.alter_topic_config(unique_topic, {"retention.bytes": "1048576"}, validate_only=True)
    assert admin.describe_topic(unique_topic).config == {"retention.ms": "3600000"}
    with pytest.raises(errors.UnknownTopicOrPartitionError):
        admin.alter_topic_config(unique_topic + "-missing", {"retention.ms": "1"})
    with pytest.raises(errors.InvalidTopicError):
        admin.alter_topic_config("__consumer_offsets", {"retention.ms": "1"})


def test_the_cli_alters_configs_and_refuses_bad_ones(cluster: LocalCluster, admin: Admin, unique_topic: str) -> None:
    admin.create_topic(unique_topic, 1, 1, config={"cleanup.policy": "compact"})
    done = sluice(
        cluster, "topics", "alter", unique_topic, "--config", "retention.ms=60000", "--delete-config", "cleanup.policy"
    )
    assert done.returncode == 0, done.stderr
    assert "retention.ms=60000" in done.stderr and "cleanup.policy (broker default)" in done.stderr
    assert admin.describe_topic(unique_topic).config == {"retention.ms": "60000"}
    refused = sluice(cluster, "topics", "alter", unique_topic, "--config", "retention.ms=soon", "--partitions", "3")
    assert refused.returncode != 0 and "retention.ms" in refused.stderr
    assert len(admin.describe_topic(unique_topic).partitions) == 1  # the refused config stopped the partitions too
    nothing = sluice(cluster, "topics", "alter", unique_topic)
    assert nothing.returncode == 2 and "nothing to alter" in nothing.stderr
