"""What users' own tests import: a real local cluster of broker processes.

:class:`LocalCluster` starts broker processes on loopback (see
:mod:`sluice.testing.cluster`); it is what the project's integration tests use,
and what users' own tests can use the same way::

    from sluice.testing import LocalCluster

    with LocalCluster(brokers=1) as cluster:
        ...  # Producer(bootstrap_servers=cluster.bootstrap_servers) ...

This package sits above the client in the import layers: it may use
``sluice.client``, never ``sluice.broker`` (brokers are separate processes).
It holds only what a user's test suite needs: :class:`LocalCluster` with its
process and network helpers, :func:`scrape` for a broker's metrics, and
:func:`unique_topic_name`. The engines of
``sluice dev``/``bench``/``demo`` live with the CLI (:mod:`sluice.cli.engines`);
helpers only this project's tests use live in ``tests/support/``.
"""

from sluice.testing._net import check_health, free_port, poll_until
from sluice.testing.cluster import BrokerProcess, ClusterError, LocalCluster
from sluice.testing.metrics import Scrape, scrape
from sluice.testing.names import unique_topic_name

__all__ = [
    "BrokerProcess",
    "ClusterError",
    "LocalCluster",
    "Scrape",
    "check_health",
    "free_port",
    "poll_until",
    "scrape",
    "unique_topic_name",
]
