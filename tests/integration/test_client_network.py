"""The client's calls stay bounded when a broker is paused, and fail fast when nothing listens.

Real brokers; a broker stopped with SIGSTOP keeps its connections open and answers nothing, the
worst case for a client. Every wait is bounded; the time bounds are generous (the machine may
be loaded), far below the 30 s request timeout the calls fell to before.
"""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import pytest

from sluice import errors
from sluice.client import Admin, TopicPartition
from sluice.client._network import Cluster
from sluice.testing import LocalCluster

BOUND_S = 12.0  # a metadata call with one broker of three paused: about a second; 30 s before the fix


def cluster3(tmp_path: Path) -> LocalCluster:
    return LocalCluster(brokers=3, data_dir=tmp_path, config={"min.insync.replicas": "2"}, failure_timeout_ms=1000)


def test_metadata_calls_do_not_wait_on_a_paused_broker(tmp_path: Path) -> None:
    with cluster3(tmp_path) as cluster:
        with Admin(bootstrap_servers=cluster.bootstrap_servers) as admin:
            admin.create_topic("t", partitions=3, replication_factor=3)
        cluster.pause(0)
        try:
            # A fresh client each round knows only the bootstrap list, where the paused broker is one of
            # three; with the default 30 s request timeout, as an application has it.
            for _ in range(6):
                started = time.monotonic()
                with Admin(bootstrap_servers=cluster.bootstrap_servers) as fresh:
                    assert len(fresh.describe_cluster().brokers) == 3
                    assert len(fresh.describe_topic("t").partitions) == 3
                took = time.monotonic() - started
                assert took < BOUND_S, f"two metadata calls took {took:.1f} s with one broker paused"
        finally:
            cluster.resume(0)


def test_concurrent_refreshes_never_queue_behind_a_paused_broker(tmp_path: Path) -> None:
    with cluster3(tmp_path) as cluster:
        shared = Cluster(cluster.bootstrap_servers)  # one client's state, shared by its threads
        shared.refresh()
        cluster.pause(1)
        try:
            took: list[float] = []

            def refresh() -> None:
                for _ in range(3):
                    started = time.monotonic()
                    shared.refresh()
                    took.append(time.monotonic() - started)

            threads = [threading.Thread(target=refresh) for _ in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(120)
            assert len(took) == 12 and max(took) < BOUND_S, sorted(took)
        finally:
            cluster.resume(1)
            shared.close()


def test_list_offsets_returns_within_its_timeout_while_the_leader_is_paused(tmp_path: Path) -> None:
    with cluster3(tmp_path) as cluster:
        with Admin(bootstrap_servers=cluster.bootstrap_servers) as admin:
            admin.create_topic("z", partitions=1, replication_factor=3)
            leader = admin.describe_topic("z").partitions[0].leader
        tp = TopicPartition("z", 0)
        # what the fault tests' OffsetMonitor does: samples with a 3 s timeout, both isolation levels
        monitor = Admin(bootstrap_servers=cluster.bootstrap_servers, request_timeout_ms=3000)
        monitor.list_offsets({tp: Admin.LATEST})
        cluster.pause(leader)
        outcomes: list[str] = []
        try:
            for i in range(12):
                level = ("read_uncommitted", "read_committed")[i % 2]
                started = time.monotonic()
                try:
                    monitor.list_offsets({tp: Admin.LATEST}, isolation_level=level, timeout=3.0)
                    outcomes.append("ok")
                except errors.SluiceError as exc:
                    assert exc.retriable, exc
                    outcomes.append(type(exc).__name__)
                took = time.monotonic() - started
                assert took < 3.0 + 5.0, f"a list_offsets with a 3 s timeout took {took:.1f} s ({outcomes})"
            # the controller elected a new leader meanwhile (1 s failure timeout): samples succeed again
            assert "ok" in outcomes[4:], outcomes
        finally:
            cluster.resume(leader)
            monitor.close()


def _closed_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def test_nothing_listening_fails_fast_naming_the_addresses() -> None:
    addrs = [f"127.0.0.1:{port}" for port in _closed_ports(2)]
    admin = Admin(bootstrap_servers=",".join(addrs))  # default request timeout: 30 s
    started = time.monotonic()
    with pytest.raises(errors.NoBrokersAvailableError) as info:
        admin.describe_cluster()
    took = time.monotonic() - started
    admin.close()
    assert took < 5.0, f"took {took:.1f} s to say nothing listens"
    assert all(addr in str(info.value) for addr in addrs), info.value
    assert not info.value.retriable


def test_a_request_that_changes_something_moves_on_from_a_paused_broker(tmp_path: Path) -> None:
    with cluster3(tmp_path) as cluster:
        cluster.pause(2)
        try:
            # the paused broker is one of two addresses: tried first, it gets half the timeout, then the other
            addrs = cluster.bootstrap_servers.split(",")
            admin = Admin(bootstrap_servers=",".join([addrs[2], addrs[0]]), request_timeout_ms=12_000)
            for i in range(3):
                started = time.monotonic()
                admin.create_topic(f"c{i}", partitions=1, replication_factor=2)
                took = time.monotonic() - started
                assert took < 10.0, f"CreateTopics took {took:.1f} s with the first broker paused"
            admin.close()
        finally:
            cluster.resume(2)
