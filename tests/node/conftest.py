"""Fixtures of the node tests: the real single-node cluster, started once for this package.

Every test module here marks its tests ``node`` (``pytest -m node`` runs just them). The node
is started by ``tools/k8s-node/node.sh up`` at the first test that needs it and stopped by
``down`` when the last test of this package is done, so nothing of it runs afterwards (and
not during the rest of the suite). When the machine cannot run a node at all (no root, or a
kernel without overlayfs, cgroups or namespaces) the tests skip, and the skip reason says
which; anything else missing (a binary, a package) is a failure.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.node.node_cluster import Node, NodeUnavailable
from tests.support.k8s_env import ExistingCluster


@pytest.fixture(scope="package")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    n = Node(tmp_path_factory.mktemp("node"))
    try:
        n.up()
    except NodeUnavailable as exc:
        pytest.skip(f"THIS MACHINE CANNOT RUN THE KUBERNETES NODE, node tests skipped: {exc}")
    except BaseException:
        n.down()  # a half-started node: stop what did start
        raise
    try:
        yield n
    finally:
        n.down()


@pytest.fixture(scope="package")
def node_cluster(node: Node) -> ExistingCluster:
    assert node.cluster is not None
    return node.cluster
