"""``sluice consume --group G`` ended with Ctrl-C (SIGINT), as a user ends it: exit 130, offsets committed.

The group's committed offsets must be exactly past what the command printed, so the group's next
run starts where this one stopped, neither skipping nor repeating.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sluice.client import Admin, Producer
from sluice.testing import LocalCluster

TOPIC, GROUP = "ctrl-c", "ctrl-c-group"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(brokers=1, data_dir=tmp_path_factory.mktemp("consume-interrupt")) as c:
        yield c


def produce(cluster: LocalCluster, start: int, count: int) -> None:
    producer = Producer(bootstrap_servers=cluster.bootstrap_servers, acks="all")
    for i in range(start, start + count):
        producer.send(TOPIC, value=b"v%d" % i, partition=i % 2)
    producer.flush()
    producer.close()


def consume_until(cluster: LocalCluster, count: int) -> tuple[int, list[str], str]:
    """Run the CLI until it printed ``count`` lines, then SIGINT it: (exit code, lines, stderr)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "sluice", "consume", TOPIC, "--group", GROUP, "--from-beginning", "--print-offset",
         "--bootstrap-server", cluster.bootstrap_servers],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    assert proc.stdout is not None
    lines: list[str] = []
    deadline = time.monotonic() + 60
    try:
        while len(lines) < count and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line.rstrip("\n"))
        assert len(lines) == count, lines
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    lines += out.splitlines()  # printed between our last read and the signal
    return proc.returncode, lines, err


def next_offsets(lines: list[str]) -> dict[int, int]:
    """partition -> the offset after the last printed one, from ``--print-offset``'s ``P:OFFSET`` field."""
    out: dict[int, int] = {}
    for line in lines:
        partition, offset = (int(x) for x in line.split("\t")[0].split(":"))
        out[partition] = max(out.get(partition, 0), offset + 1)
    return out


def test_ctrl_c_exits_130_and_commits_what_was_printed(cluster: LocalCluster) -> None:
    admin = Admin(bootstrap_servers=cluster.bootstrap_servers)
    try:
        admin.create_topic(TOPIC, partitions=2)
        produce(cluster, 0, 20)
        code, lines, err = consume_until(cluster, 20)
        assert code == 130, err
        assert f"processed a total of {len(lines)} messages" in err
        committed = {tp.partition: off for tp, off in admin.list_consumer_group_offsets(GROUP).items()}
        assert committed == next_offsets(lines) == {0: 10, 1: 10}

        # the group's next run starts where the first stopped: only what arrived in between
        produce(cluster, 20, 6)
        code, lines, err = consume_until(cluster, 6)
        assert code == 130, err
        assert sorted(line.split("\t")[1] for line in lines) == sorted(f"v{i}" for i in range(20, 26))
        committed = {tp.partition: off for tp, off in admin.list_consumer_group_offsets(GROUP).items()}
        assert committed == {0: 13, 1: 13}
    finally:
        admin.close()


def test_cli_reference_says_so() -> None:
    text = (Path(__file__).resolve().parents[2] / "docs" / "cli.md").read_text()
    assert "commit its offsets at exit" in text and "130" in text


def test_a_run_that_printed_nothing_commits_its_position_so_the_next_run_misses_nothing(
    cluster: LocalCluster,
) -> None:
    """Without --from-beginning the group starts at the end; a first run that printed nothing still
    commits that position (as Kafka's console consumer), so what is produced before the second run
    is read by it, not skipped by a second reset to the end."""
    topic, group = "quiet-start", "quiet-start-group"
    admin = Admin(bootstrap_servers=cluster.bootstrap_servers)
    try:
        admin.create_topic(topic, partitions=2)
        producer = Producer(bootstrap_servers=cluster.bootstrap_servers, acks="all")
        for i in range(4):
            producer.send(topic, value=b"old%d" % i, partition=i % 2)
        producer.flush()
        base = [sys.executable, "-m", "sluice", "consume", topic, "--group", group,
                "--bootstrap-server", cluster.bootstrap_servers]  # fmt: skip
        first = subprocess.run([*base, "--timeout", "15"], capture_output=True, text=True, timeout=120, check=False)
        assert first.returncode == 0 and first.stdout == "", first.stderr
        committed = {tp.partition: off for tp, off in admin.list_consumer_group_offsets(group).items()}
        assert committed == {0: 2, 1: 2}, first.stderr  # the end, where it started
        for i in range(3):
            producer.send(topic, value=b"new%d" % i, partition=i % 2)
        producer.flush()
        producer.close()
        second = subprocess.run(
            [*base, "--max-messages", "3", "--timeout", "60"], capture_output=True, text=True, timeout=120, check=False
        )
        assert second.returncode == 0, second.stderr
        assert sorted(second.stdout.split()) == ["new0", "new1", "new2"]
    finally:
        admin.close()
