"""The operations CLI against real brokers: ``sluice consumer-groups`` and ``sluice transactions list
--duration-filter`` (issue 14, item 2).

The CLI runs in-process (``sluice.cli.main``: the same code the console script runs, without a
Python start-up per command on a loaded machine) against real broker processes; what it prints is
checked against what the brokers themselves say: the lag of ``consumer-groups describe`` against the
coordinator's ``kafka_consumergroup_lag`` metric, the offsets of ``reset-offsets`` against
OffsetFetch. Every wait is bounded.
"""

from __future__ import annotations

import json
import time
import zlib
from collections.abc import Callable

import pytest

from sluice.client import Admin, Consumer, Producer, TopicPartition
from sluice.testing import LocalCluster, scrape
from tests.support.waiting import wait_for

from .helpers import cli

GROUP_PARTITIONS = 3
PARTITIONS = 3
RECORDS_PER_PARTITION = 10


def test_consumer_groups_list_describe_reset_delete(
    fresh_cluster: Callable[..., LocalCluster], unique_topic: str, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster = fresh_cluster(brokers=3, config={"offsets.topic.num.partitions": GROUP_PARTITIONS})
    boot = ["--bootstrap-server", cluster.bootstrap_servers]
    topic, group = unique_topic, f"{unique_topic}-g"
    admin = Admin(bootstrap_servers=cluster.bootstrap_servers)
    admin.create_topic(topic, partitions=PARTITIONS, replication_factor=3)
    producer = Producer(bootstrap_servers=cluster.bootstrap_servers, linger_ms=0)
    for i in range(PARTITIONS * RECORDS_PER_PARTITION):
        producer.send(topic, value=str(i).encode(), partition=i % PARTITIONS)
    producer.flush()
    producer.close()

    # -- a member that committed 4 of 10 records per partition: lag 6 each --------------------------
    consumer = Consumer(bootstrap_servers=cluster.bootstrap_servers, group_id=group)
    consumer.subscribe([topic])
    deadline = time.monotonic() + 60
    while len(consumer.assignment()) < PARTITIONS and time.monotonic() < deadline:
        consumer.poll(timeout=0.5)
    assert len(consumer.assignment()) == PARTITIONS
    committed = {TopicPartition(topic, p): 4 for p in range(PARTITIONS)}
    consumer.commit(committed)

    code, out, _ = cli(capsys, "consumer-groups", "list", *boot)
    assert code == 0 and group in out.split()
    code, out, _ = cli(capsys, "consumer-groups", "list", "--state", "Stable", "--json", *boot)
    assert code == 0 and [g["state"] for g in json.loads(out) if g["group_id"] == group] == ["Stable"]

    code, out, _ = cli(capsys, "consumer-groups", "describe", group, "--members", "--json", *boot)
    assert code == 0
    members = json.loads(out)
    assert len(members) == 1 and len(members[0]["assignment"]) == PARTITIONS

    # describe's lag equals the metric its coordinator exports, partition by partition
    coordinator = cluster.leader("__consumer_offsets", zlib.crc32(group.encode()) % GROUP_PARTITIONS)

    def lag_matches() -> bool:
        code, out, _ = cli(capsys, "consumer-groups", "describe", group, "--json", *boot)
        assert code == 0
        rows = {r["partition"]: r for r in json.loads(out)}
        metrics = scrape(cluster.metrics_url(coordinator))
        for p in range(PARTITIONS):
            row = rows[p]
            assert row["current_offset"] == 4 and row["log_end_offset"] == RECORDS_PER_PARTITION
            assert row["lag"] == RECORDS_PER_PARTITION - 4 and row["consumer_id"] == members[0]["member_id"]
            labels = {"consumergroup": group, "topic": topic, "partition": str(p)}
            if metrics.value("kafka_consumergroup_lag", **labels) != row["lag"]:
                return False
        return True

    wait_for(lag_matches, timeout=30, what="describe's lag equal to kafka_consumergroup_lag")
    code, out, _ = cli(capsys, "consumer-groups", "describe", group, *boot)
    assert code == 0
    header, *lines = out.strip().splitlines()
    assert header.split() == [
        "GROUP", "TOPIC", "PARTITION", "CURRENT-OFFSET", "LOG-END-OFFSET", "LAG", "CONSUMER-ID"
    ]  # fmt: skip
    assert [line.split()[3:6] for line in lines] == [["4", "10", "6"]] * PARTITIONS

    # -- a group with members is neither reset nor deleted ------------------------------------------
    code, _, err = cli(capsys, "consumer-groups", "reset-offsets", group, "--all-topics", "--to-earliest",
                       "--execute", *boot)  # fmt: skip
    assert code == 1 and "inactive" in err
    code, _, err = cli(capsys, "consumer-groups", "delete", group, *boot)
    assert code == 1 and "NON_EMPTY_GROUP" in err
    assert admin.list_consumer_group_offsets(group) == committed
    consumer.close()  # leaves the group: Empty, offsets kept

    wait_for(
        lambda: admin.describe_consumer_groups([group])[group].state == "Empty",
        timeout=30,
        what="the group empty after its member left",
    )

    # -- reset-offsets: a dry run changes nothing; --execute commits the clamped plan --------------
    code, out, err = cli(capsys, "consumer-groups", "reset-offsets", group, "--all-topics", "--to-earliest", *boot)
    assert code == 0 and "dry run" in err
    assert [line.split()[3] for line in out.strip().splitlines()[1:]] == ["0"] * PARTITIONS
    assert admin.list_consumer_group_offsets(group) == committed
    code, _, _ = cli(capsys, "consumer-groups", "reset-offsets", group, "--all-topics", "--to-earliest",
                     "--execute", *boot)  # fmt: skip
    assert code == 0
    assert admin.list_consumer_group_offsets(group) == {tp: 0 for tp in committed}
    code, _, _ = cli(capsys, "consumer-groups", "reset-offsets", group, "--topic", f"{topic}:1", "--shift-by", "3",
                     "--execute", *boot)  # fmt: skip
    assert code == 0
    assert admin.list_consumer_group_offsets(group)[TopicPartition(topic, 1)] == 3
    code, _, _ = cli(capsys, "consumer-groups", "reset-offsets", group, "--topic", topic, "--to-offset", "1000",
                     "--execute", *boot)  # fmt: skip
    assert code == 0  # clamped to the end, as Kafka clamps
    assert admin.list_consumer_group_offsets(group) == {tp: RECORDS_PER_PARTITION for tp in committed}
    code, _, _ = cli(capsys, "consumer-groups", "reset-offsets", group, "--all-topics", "--to-latest", "--execute",
                     *boot)  # fmt: skip
    assert code == 0
    code, _, err = cli(capsys, "consumer-groups", "reset-offsets", group, "--topic", f"{topic}:7", "--to-earliest",
                       *boot)  # fmt: skip
    assert code == 1 and "no partition 7" in err

    # -- delete: the offsets are gone, and stay gone after the coordinator reloads them -------------
    code, _, err = cli(capsys, "consumer-groups", "delete", group, *boot)
    assert code == 0 and "deleted" in err
    code, out, _ = cli(capsys, "consumer-groups", "list", *boot)
    assert group not in out.split()
    code, _, err = cli(capsys, "consumer-groups", "describe", group, *boot)
    assert code == 1 and "does not exist" in err
    code, _, err = cli(capsys, "consumer-groups", "delete", group, *boot)
    assert code == 1 and "does not exist" in err
    cluster.restart(coordinator)  # the tombstones are in the log: a replay does not bring them back
    cluster.wait_until_healthy(timeout=60)
    assert admin.list_consumer_group_offsets(group) == {}
    assert group not in [g.group_id for g in admin.list_consumer_groups()]
    admin.close()


def test_transactions_list_duration_filter(
    cluster: LocalCluster, unique_topic: str, capsys: pytest.CaptureFixture[str]
) -> None:
    boot = ["--bootstrap-server", cluster.bootstrap_servers]
    admin = Admin(bootstrap_servers=cluster.bootstrap_servers)
    admin.create_topic(unique_topic, partitions=1, replication_factor=1)
    admin.close()
    done_id, open_id = f"{unique_topic}-done", f"{unique_topic}-open"
    done = Producer(bootstrap_servers=cluster.bootstrap_servers, transactional_id=done_id, linger_ms=0)
    done.init_transactions()
    done.begin_transaction()
    done.send(unique_topic, value=b"x")
    done.commit_transaction()
    stuck = Producer(
        bootstrap_servers=cluster.bootstrap_servers,
        transactional_id=open_id,
        linger_ms=0,
        transaction_timeout_ms=300_000,
    )
    stuck.init_transactions()
    stuck.begin_transaction()
    stuck.send(unique_topic, value=b"y")
    stuck.flush()
    time.sleep(1.5)

    def listed(*extra: str) -> list[str]:
        code, out, _ = cli(capsys, "transactions", "list", "--json", *extra, *boot)
        assert code == 0
        return [t["transactional_id"] for t in json.loads(out)]

    everything = listed()
    assert done_id in everything and open_id in everything
    long_running = listed("--duration-filter", "1000")
    assert open_id in long_running and done_id not in long_running  # a finished one is never "running long"
    assert open_id not in listed("--duration-filter", "600000")
    code, _, err = cli(capsys, "transactions", "list", "--duration-filter", "-5", *boot)
    assert code == 2 and "must be >= 0" in err
    stuck.abort_transaction()
    stuck.close()
    done.close()
    assert open_id not in listed("--duration-filter", "1")


def test_top_shows_brokers_replication_transactions_and_lag(
    fresh_cluster: Callable[..., LocalCluster], unique_topic: str, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster = fresh_cluster(
        brokers=3, config={"offsets.topic.num.partitions": GROUP_PARTITIONS}, failure_timeout_ms=1000
    )
    boot = ["--bootstrap-server", cluster.bootstrap_servers]
    topic = unique_topic
    admin = Admin(bootstrap_servers=cluster.bootstrap_servers)
    admin.create_topic(topic, partitions=PARTITIONS, replication_factor=3)
    producer = Producer(bootstrap_servers=cluster.bootstrap_servers, linger_ms=0)
    for i in range(PARTITIONS * RECORDS_PER_PARTITION):
        producer.send(topic, value=b"v", partition=i % PARTITIONS)
    producer.flush()
    producer.close()
    # three groups without members, committed at 1, 2 and 3 per partition: lag 27, 24 and 21, plus the
    # open transaction's record below (the lag is measured from the high watermark)
    for n in (1, 2, 3):
        admin.alter_consumer_group_offsets(f"{topic}-g{n}", {TopicPartition(topic, p): n for p in range(PARTITIONS)})
    stuck = Producer(
        bootstrap_servers=cluster.bootstrap_servers,
        transactional_id=f"{topic}-open",
        linger_ms=0,
        transaction_timeout_ms=300_000,
    )
    stuck.init_transactions()
    stuck.begin_transaction()
    stuck.send(topic, value=b"open", partition=0)
    stuck.flush()

    code, out, _ = cli(capsys, "top", "--iterations", "2", "--interval", "0.2", "--rows", "2", *boot)
    assert code == 0
    first, second = out.split("\nsluice top ")  # two refreshes, printed one after the other
    assert first.startswith("sluice top ") and "brokers 3" in first and "under-replicated 0" in second
    assert f"{topic}-open" in second and "Ongoing" in second
    lines = second.splitlines()
    groups = lines[lines.index("CONSUMER GROUPS (most lag first)") + 1 :]
    assert groups[1].split() == [f"{topic}-g1", "Empty", "0", str(3 * (RECORDS_PER_PARTITION - 1) + 1)]
    assert groups[2].split() == [f"{topic}-g2", "Empty", "0", str(3 * (RECORDS_PER_PARTITION - 2) + 1)]
    assert groups[3].strip() == "... and 1 more"  # --rows 2: bounded
    assert lines[lines.index("BROKERS") + 4].strip() == "... and 1 more"  # 2 of the 3 brokers shown

    code, out, _ = cli(capsys, "top", "--iterations", "1", "--rows", "50", *boot)
    lines = out.splitlines()
    brokers = lines[lines.index("BROKERS") + 2 : lines.index("BROKERS") + 5]
    title = lines[0].split()
    partitions = int(title[title.index("partitions") + 1])
    assert partitions >= PARTITIONS + GROUP_PARTITIONS and "offline 0" in lines[0]
    assert [int(b.split()[0]) for b in brokers] == [0, 1, 2]
    assert [b.split()[2] for b in brokers] == ["up"] * 3  # STATUS: each broker's health check
    assert sum(int(b.split()[3]) for b in brokers) == partitions  # every partition led, by one of the 3

    cluster.kill(2)

    def shown_under_replicated() -> bool:
        code, out, _ = cli(capsys, "top", "--iterations", "1", "--rows", "50", *boot)
        assert code == 0
        shown = "under-replicated" in out.split("UNDER-REPLICATED / OFFLINE PARTITIONS")[1]
        return f"{topic}-0" in out and shown and "brokers 3 (1 not serving)" in out  # the killed one is DOWN

    wait_for(shown_under_replicated, timeout=60, what="top showing the partitions under-replicated after a kill")
    stuck.abort_transaction()
    stuck.close()
    admin.close()
