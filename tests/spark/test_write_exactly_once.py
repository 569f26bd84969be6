"""Exactly-once writes from Spark (local mode) to real broker processes.

Every job runs in its own driver process (tests/spark/write_job.py): its own
SparkContext settings (task retries, speculation) and a driver the streaming
test can kill. What is checked is what a read_committed consumer sees: every
row exactly once, or nothing, and no transaction left open or prepared that
would hold back the partitions' LSO.

Speculative attempts are not here: Spark never launches them with a local
master (no speculation scheduler, and never a copy on the host of the
original). test_write_attempts.py runs two attempts of one partition through
the same task code against real brokers instead.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from sluice.client import Admin, Producer
from sluice.testing import LocalCluster, unique_topic_name

from .write_helpers import read_values, unfinished

JOB = Path(__file__).with_name("write_job.py")
pytestmark = pytest.mark.timeout(900)


@pytest.fixture
def sluice_cluster(cluster: LocalCluster) -> LocalCluster:
    """The Spark tests' shared single-broker cluster (tests/spark/conftest.py)."""
    return cluster


def _env() -> dict[str, str]:
    # Spark's Python workers must run this interpreter (the one with this checkout installed).
    return {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}


def run_job(job: dict[str, Any], timeout: float = 600) -> dict[str, Any]:
    """Run a driver program to its end; its JSON verdict."""
    proc = subprocess.run(
        [sys.executable, str(JOB), json.dumps(job)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=_env(),
        start_new_session=True,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise AssertionError(f"the driver failed (exit {proc.returncode}):\n{proc.stderr[-5000:]}")
    result: dict[str, Any] = json.loads(lines[-1])
    result["stderr"] = proc.stderr
    return result


def new_topic(cluster: LocalCluster, name: str, partitions: int = 3) -> str:
    topic = unique_topic_name(name)
    with Admin(bootstrap_servers=cluster.bootstrap_servers) as admin:
        admin.create_topic(topic, partitions=partitions, replication_factor=1)
    return topic


def batch_job(cluster: LocalCluster, topic: str, prefix: str, rows: int, **extra: Any) -> dict[str, Any]:
    options = {"bootstrap.servers": cluster.bootstrap_servers, "topic": topic, "transactionalIdPrefix": prefix}
    options.update(extra.pop("options", {}))
    return {"mode": "batch", "rows": rows, "partitions": 4, "options": options, **extra}


def exactly_once(rows: int) -> Counter[bytes]:
    return Counter({str(i).encode(): 1 for i in range(rows)})


def test_tasks_that_fail_once_leave_exactly_one_copy(sluice_cluster: LocalCluster) -> None:
    """First attempts fail, in even partitions after 10 rows, in odd ones after preparing; retries finish."""
    bootstrap = sluice_cluster.bootstrap_servers
    topic = new_topic(sluice_cluster, "retried")
    rows = 4000
    job = batch_job(
        sluice_cluster,
        topic,
        "retried",
        rows,
        master="local[2,2]",  # two attempts per task
        options={"sluice.test.failTask": "both"},
    )
    result = run_job(job)
    assert result["ok"], result["error"]
    assert result["stderr"].count("InjectedTaskFailure") >= 4  # every partition's first attempt failed
    assert read_values(bootstrap, topic) == exactly_once(rows)
    # The attempts that failed mid-write did write: their rows are there, aborted.
    uncommitted = read_values(bootstrap, topic, "read_uncommitted")
    assert sum(uncommitted.values()) >= rows + 2 * 10
    assert unfinished(bootstrap, "retried-") == []


def test_a_value_column_alone_is_sent_in_bulk_and_a_retried_task_still_leaves_one_copy(
    sluice_cluster: LocalCluster,
) -> None:
    """Rows of a value column only go through Producer.send_many; first attempts fail after
    preparing, and the retries adopt what they prepared: every row once."""
    bootstrap = sluice_cluster.bootstrap_servers
    topic = new_topic(sluice_cluster, "bulk")
    rows = 20_000
    job = batch_job(
        sluice_cluster,
        topic,
        "bulk",
        rows,
        master="local[2,2]",
        value_only=True,
        options={"sluice.test.failTask": "afterPrepare"},
    )
    result = run_job(job)
    assert result["ok"], result["error"]
    assert result["stderr"].count("InjectedTaskFailure") >= 4
    assert read_values(bootstrap, topic) == exactly_once(rows)
    assert unfinished(bootstrap, "bulk-") == []


def test_a_job_that_fails_leaves_nothing_visible(sluice_cluster: LocalCluster) -> None:
    bootstrap = sluice_cluster.bootstrap_servers
    topic = new_topic(sluice_cluster, "failed")
    job = batch_job(
        sluice_cluster,
        topic,
        "failed",
        8000,
        master="local[2,2]",
        fail_partition=1,
        conf={"spark.sql.execution.arrow.maxRecordsPerBatch": "100"},
    )
    result = run_job(job)
    assert not result["ok"] and "planned failure" in result["error"]
    assert read_values(bootstrap, topic) == Counter()
    assert sum(read_values(bootstrap, topic, "read_uncommitted").values()) > 0  # the tasks did write
    assert unfinished(bootstrap, "failed-") == []
    # Nothing holds the LSO back: a later transaction is visible at once.
    with Producer(bootstrap_servers=bootstrap, transactional_id="after-failed-job") as producer:
        producer.init_transactions()
        producer.begin_transaction()
        for p in range(3):
            producer.send(topic, value=b"later", partition=p)
        producer.commit_transaction()
    assert read_values(bootstrap, topic) == Counter({b"later": 3})


def test_a_streaming_batch_replayed_after_a_driver_crash_is_not_written_twice(
    sluice_cluster: LocalCluster, tmp_path: Path
) -> None:
    bootstrap = sluice_cluster.bootstrap_servers
    topic = new_topic(sluice_cluster, "streamed")
    inputs = tmp_path / "in"
    inputs.mkdir()
    files, per_file = 3, 200
    for f in range(files):
        lines = [json.dumps({"key": str(i), "value": f"{f}-{i}"}) for i in range(per_file)]
        (inputs / f"part-{f}.json").write_text("\n".join(lines) + "\n")
        os.utime(inputs / f"part-{f}.json", (1_700_000_000 + f, 1_700_000_000 + f))  # the order of the batches
    checkpoint = tmp_path / "checkpoint"
    marker = tmp_path / "committed-batch-1"
    job = {
        "mode": "stream",
        "input_dir": str(inputs),
        "checkpoint": str(checkpoint),
        "files": files,
        "options": {"bootstrap.servers": bootstrap, "topic": topic, "transactionalIdPrefix": "streamed"},
    }
    crashing = {
        **job,
        "options": {**job["options"], "sluice.test.hangAfterCommit": "1", "sluice.test.hangMarker": str(marker)},
    }
    driver = subprocess.Popen(
        [sys.executable, str(JOB), json.dumps(crashing)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=_env(),
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 600
        while not marker.exists():
            assert driver.poll() is None, "the driver ended before committing batch 1"
            assert time.monotonic() < deadline, "batch 1 was not committed in time"
            time.sleep(0.2)
    finally:
        os.killpg(driver.pid, signal.SIGKILL)  # the driver crashes: JVM, Python workers and all
        driver.wait(timeout=60)
    # Batch 1 is committed to Sluice but not in Spark's checkpoint: the restart replays it.
    assert (checkpoint / "offsets" / "1").exists() and not (checkpoint / "commits" / "1").exists()
    expected_two = Counter({f"{f}-{i}".encode(): 1 for f in range(2) for i in range(per_file)})
    assert read_values(bootstrap, topic) == expected_two

    result = run_job(job)
    assert result["ok"], result["error"]
    assert (checkpoint / "commits" / "2").exists()
    assert read_values(bootstrap, topic) == Counter(
        {f"{f}-{i}".encode(): 1 for f in range(files) for i in range(per_file)}
    )
    assert unfinished(bootstrap, "streamed-") == []
