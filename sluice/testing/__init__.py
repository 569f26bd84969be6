"""Test support: a real local cluster, and the engines of ``sluice bench`` and ``sluice demo``.

:class:`LocalCluster` starts broker processes on loopback (see
:mod:`sluice.testing.cluster`); it is what the project's integration tests use,
and what users' own tests can use the same way::

    from sluice.testing import LocalCluster

    with LocalCluster(brokers=1) as cluster:
        ...  # Producer(bootstrap_servers=cluster.bootstrap_servers) ...

This package sits above the client in the import layers: it may use
``sluice.client``, never ``sluice.broker`` (brokers are separate processes).
"""

from sluice.testing._net import check_health, free_port, poll_until
from sluice.testing.cluster import BrokerProcess, ClusterError, LocalCluster
from sluice.testing.names import unique_topic_name

__all__ = [
    "BrokerProcess",
    "ClusterError",
    "LocalCluster",
    "check_health",
    "free_port",
    "poll_until",
    "unique_topic_name",
]
