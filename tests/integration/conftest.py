"""Fixtures of the integration tests: real broker processes via :class:`LocalCluster`.

* ``cluster``: one single-broker cluster shared by the whole session (starting
  a broker costs seconds; most tests only need topics of their own). Before
  each test it is brought back to health: a broker that a previous test
  killed, stopped or paused is restarted or resumed. Tests that break
  things on purpose should still prefer ``fresh_cluster``.
* ``fresh_cluster``: a factory for clusters of the test's own
  (``fresh_cluster(brokers=3, config={...})``), in the test's tmp_path,
  closed after the test.
* ``unique_topic``: a topic name no other test uses (derived from the test's
  name, so broker logs are easy to read). Use ``f"{unique_topic}-out"`` or
  :func:`sluice.testing.unique_topic_name` for more.

When a test fails, the tail of every broker log of the clusters it used is
added to its report, so a CI failure shows the broker side too.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from typing import Any

import pytest

from sluice.testing import LocalCluster, unique_topic_name

_CLUSTERS = pytest.StashKey[list[LocalCluster]]()
_LOG_LINES = 60


def _remember(request: pytest.FixtureRequest, cluster: LocalCluster) -> None:
    node = request.node
    node.stash.setdefault(_CLUSTERS, []).append(cluster)


@pytest.fixture(scope="session")
def _session_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(brokers=1, data_dir=tmp_path_factory.mktemp("session-cluster")) as cluster:
        yield cluster


@pytest.fixture
def cluster(_session_cluster: LocalCluster, request: pytest.FixtureRequest) -> LocalCluster:
    """The shared single-broker cluster, healthy."""
    c = _session_cluster
    for b in c.brokers:
        if b.state == "paused":
            c.resume(b.broker_id)
        elif b.state != "running":
            c.restart(b.broker_id, wait=False)
    c.wait_until_healthy(timeout=60)
    _remember(request, c)
    return c


@pytest.fixture
def fresh_cluster(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Callable[..., LocalCluster]]:
    """``fresh_cluster(brokers=1, config=None, **kwargs)``: a started cluster of this test only."""
    made: list[LocalCluster] = []

    def make(brokers: int = 1, config: dict[str, Any] | None = None, **kwargs: Any) -> LocalCluster:
        kwargs.setdefault("data_dir", tmp_path / f"cluster-{len(made)}")
        c = LocalCluster(brokers=brokers, config=config, **kwargs)
        made.append(c)
        _remember(request, c)
        return c.start()

    yield make
    for c in reversed(made):
        c.close()


@pytest.fixture
def unique_topic(request: pytest.FixtureRequest) -> str:
    """A topic name no other test uses."""
    return unique_topic_name(request.node.name)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if report.failed:
        for c in item.stash.get(_CLUSTERS, []):
            for b in c.brokers:
                tail = b.log_tail(_LOG_LINES)
                if tail:
                    report.sections.append((f"{b.name} log ({b.log_path}), last {_LOG_LINES} lines", tail))
    return report
