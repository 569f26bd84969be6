"""Small helpers shared by the integration tests: reading a topic to its end, bounded waits, a
size-limited tmpfs for disk-full tests, :class:`OffsetMonitor`, which fails a fault test on any
regression of a partition's LSO or HW, and :func:`checked`, which ends a fault test with the
replica consistency check (issue 30)."""

from __future__ import annotations

import contextlib
import itertools
import subprocess
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest

from sluice import errors
from sluice.client import Admin, Consumer, TopicPartition
from sluice.testing import LocalCluster
from tests.support.waiting import wait_for


def read_topic(
    bootstrap: str,
    topic: str,
    isolation_level: str = "read_committed",
    idle_s: float = 1.5,
    limit_s: float = 60.0,
) -> list[tuple[int, int, bytes | None, bytes | None]]:
    """(partition, offset, key, value) of every visible record, read by an assign() consumer to the end."""
    admin = Admin(bootstrap_servers=bootstrap)
    partitions = len(admin.describe_topic(topic).partitions)
    admin.close()
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    consumer = Consumer(bootstrap_servers=bootstrap, group_id=None, isolation_level=isolation_level)
    consumer.assign(tps)
    ends = consumer.end_offsets(tps)
    out: list[tuple[int, int, bytes | None, bytes | None]] = []
    deadline = time.monotonic() + limit_s
    last_data = time.monotonic()
    while time.monotonic() < deadline:
        records = consumer.poll(timeout=0.5)
        if records:
            last_data = time.monotonic()
            out.extend((r.partition, r.offset, r.key, r.value) for r in records)
            continue
        at_end = all(consumer.position(tp) >= ends[tp] for tp in tps)
        if at_end and time.monotonic() - last_data > idle_s / 3:
            break
        if time.monotonic() - last_data > idle_s:
            break
    consumer.close()
    return out


@contextlib.contextmanager
def checked(cluster: LocalCluster, timeout: float = 60.0) -> Iterator[LocalCluster]:
    """``with checked(LocalCluster(...)) as cluster:``: the cluster as a context manager whose block,
    when it ends without an exception, is followed by ``cluster.check_replica_consistency()`` (every
    partition's replicas compared batch by batch) before the cluster stops. A fault test's last word."""
    with cluster:
        yield cluster
        cluster.check_replica_consistency(timeout=timeout)


def values(records: list[tuple[int, int, bytes | None, bytes | None]]) -> list[bytes | None]:
    return [r[3] for r in records]


class OffsetMonitor:
    """Samples ListOffsets(latest) of ``partitions`` at both isolation levels while a fault runs.

    The property a Jepsen-style checker asserts next to "nothing lost, nothing twice": an end
    offset a client was told never goes back (the HW for read_uncommitted, the LSO for
    read_committed), across kills, pauses and leader changes. Samples go through the Admin
    client, which retries OFFSET_NOT_AVAILABLE and moved leaders like any client; a sample
    that fails (every replica down, a timeout) is skipped and counted. Bounded: at most
    ``max_samples`` rounds and ``max_seconds``, one round every ``interval`` seconds.

        with OffsetMonitor(cluster.bootstrap_servers, [TopicPartition("t", 0)]) as monitor:
            ... kill, pause, restart ...
        monitor.check()   # AssertionError naming every regression
    """

    LEVELS = ("read_uncommitted", "read_committed")

    def __init__(
        self,
        bootstrap: str,
        partitions: Iterable[TopicPartition],
        *,
        interval: float = 0.1,
        max_samples: int = 3000,
        max_seconds: float = 300.0,
        sample_timeout: float = 3.0,
    ) -> None:
        self.partitions = sorted(partitions)
        self.interval = interval
        self.max_samples = max_samples
        self.max_seconds = max_seconds
        self.sample_timeout = sample_timeout
        # Every request of a sample is bounded by the sample's timeout: a metadata refresh that
        # picks a paused broker would otherwise wait for the client's default request timeout (30 s).
        self._admin = Admin(
            bootstrap_servers=bootstrap, client_id="offset-monitor", request_timeout_ms=int(sample_timeout * 1000)
        )
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="offset-monitor", daemon=True)
        # per isolation level and partition: (monotonic time, offset) of every successful sample
        self.samples: dict[str, dict[TopicPartition, list[tuple[float, int]]]] = {
            level: {tp: [] for tp in self.partitions} for level in self.LEVELS
        }
        self.failed_samples = 0
        self.rounds = 0
        self.completed_rounds = 0

    def start(self) -> OffsetMonitor:
        self._thread.start()
        return self

    def __enter__(self) -> OffsetMonitor:
        return self.start()

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(self.max_seconds + 2 * self.sample_timeout)
        self._admin.close()

    def _run(self) -> None:
        deadline = time.monotonic() + self.max_seconds
        while not self._stop.is_set() and self.rounds < self.max_samples and time.monotonic() < deadline:
            self.rounds += 1
            for level in self.LEVELS:
                try:
                    found = self._admin.list_offsets(
                        dict.fromkeys(self.partitions, Admin.LATEST), isolation_level=level, timeout=self.sample_timeout
                    )
                except errors.SluiceError:
                    self.failed_samples += 1
                    continue
                now = time.monotonic()
                for tp, info in found.items():
                    self.samples[level][tp].append((now, info.offset))
            self.completed_rounds += 1
            self._stop.wait(self.interval)

    def wait_rounds(self, rounds: int = 1, timeout: float = 60.0) -> None:
        """Wait (bounded) until ``rounds`` more rounds are complete.

        A fault test calls it before its fault and after its repair, so samples are taken on both
        sides: a sample that meets a paused or dead broker runs to its timeout, and a short fault
        window can otherwise pass within one round."""
        target = self.completed_rounds + rounds
        wait_for(
            lambda: self.completed_rounds >= target or not self._thread.is_alive(),
            timeout=timeout,
            what=f"{rounds} more round(s) of the offset monitor",
        )

    def regressions(self) -> list[str]:
        out = []
        for level, by_tp in self.samples.items():
            name = "LSO" if level == "read_committed" else "HW"
            for tp, series in by_tp.items():
                for (t0, before), (t1, after) in itertools.pairwise(series):
                    if after < before:
                        out.append(f"{name} of {tp} went back {before} -> {after} ({t1 - t0:.2f}s apart)")
        return out

    def check(self, min_samples: int = 2) -> None:
        """Fail on any regression, and unless every level of every partition was sampled ``min_samples`` times."""
        bad = self.regressions()
        assert not bad, "offsets a client was told went back: " + "; ".join(bad[:10])
        for level, by_tp in self.samples.items():
            for tp, series in by_tp.items():
                assert len(series) >= min_samples, (
                    f"the monitor sampled {level} {tp} only {len(series)} time(s) "
                    f"({self.failed_samples} failed samples in {self.rounds} rounds)"
                )


@contextlib.contextmanager
def tmpfs(path: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` (mount's syntax: ``64m``) mounted at ``path`` while the block runs (needs root)."""
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of one ``sluice`` command run in-process (``sluice.cli.main``, the
    console script's own code)."""
    from sluice.cli import main

    capsys.readouterr()
    try:
        code = main(list(argv))
    except SystemExit as exc:  # argparse's usage errors
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err
