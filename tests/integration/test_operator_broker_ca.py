"""The operator's admin client follows the brokers' CA file (no Kubernetes needed).

A client reads its CA file once, when it is made; the operator's file is a projection of the
cluster CA Secret that a CA rotation rewrites (old and new CA, then the new alone). The
runtime's admin client is therefore made again when the file's content changes, and a file that
is not there yet (the Secret the operator itself makes, before the kubelet fills it in) is a
retriable TemporaryError, not a crash. The cluster's real CA bundle and a real broker.
"""

from __future__ import annotations

from pathlib import Path

import kopf
import pytest

from sluice.metadata import open_store
from sluice.operator.handlers.runtime import OperatorRuntime
from sluice.operator.settings import OperatorSettings
from sluice.testing import LocalCluster
from sluice.tls import generate_ca


def test_the_admin_client_is_made_again_when_the_brokers_ca_file_changes(tmp_path: Path) -> None:
    ca_file = tmp_path / "broker-ca" / "ca.crt"
    with LocalCluster(brokers=1, data_dir=tmp_path / "c") as c:
        settings = OperatorSettings(
            namespace="test", metadata_url=str(c.metadata_path), expected_brokers=1, broker_ca_file=str(ca_file)
        )
        ops = OperatorRuntime(settings, open_store(settings.metadata_url))
        try:
            with pytest.raises(kopf.TemporaryError, match="cannot be read yet"):
                ops.admin()  # the projected Secret is not there yet
            ca_file.parent.mkdir()
            first = generate_ca("sluice-test-ca-1").cert_pem
            ca_file.write_bytes(first)
            admin = ops.admin()
            assert ops.admin() is admin  # the same file: the same client
            ca_file.write_bytes(first + generate_ca("sluice-test-ca-2").cert_pem)  # a rotation's overlap
            rotated = ops.admin()
            assert rotated is not admin
            assert ops.admin() is rotated
        finally:
            ops.close()
