"""sluice.broker.security.reload: the broker follows its TLS files, and says what it loaded.

Real files, a real SQLite metadata store; the listeners' use of it (dynamic gRPC credentials) is
exercised with broker processes in tests/integration/test_cert_rotation.py.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sluice import tls
from sluice.broker.config import BrokerConfig
from sluice.broker.security.reload import TlsFiles
from sluice.metadata import documents, keys, open_store
from sluice.metadata.documents import BrokerDocument


def config(tmp_path: Path, tls_dir: Path, broker_id: int = 0) -> BrokerConfig:
    return BrokerConfig.build(
        broker_id, "127.0.0.1", 9092, str(tmp_path / "data"), str(tmp_path / "meta.sqlite"),
        inter_broker_port=9093, tls_dir=str(tls_dir),
    )  # fmt: skip


def test_a_changed_pair_is_loaded_once_it_matches(tmp_path: Path) -> None:
    ca = tls.generate_ca("ca")
    d = tmp_path / "tls"
    tls.write_dir(d, ca.cert_pem, tls.issue_broker(ca, 0))
    files = TlsFiles(config(tmp_path, d))
    assert files.loaded.version == 1 and not files.check()

    renewed = tls.issue_broker(ca, 0)
    tls.write_private(d / tls.KEY_FILE, renewed.key_pem)  # the key first: caught half-written
    assert not files.check() and files.loaded.version == 1
    tls.write_private(d / tls.CERT_FILE, renewed.cert_pem)
    assert files.check() and files.loaded.version == 2
    assert files.material.cert_pem == renewed.cert_pem
    # the same bytes written again: no new version
    tls.write_private(d / tls.CERT_FILE, renewed.cert_pem)
    assert not files.check() and files.loaded.version == 2


def test_a_secret_volume_swap_is_seen_and_reported(tmp_path: Path) -> None:
    """The kubelet's layout: keys are symlinks through ``..data``, which is swapped to a new directory."""
    ca_old, ca_new = tls.generate_ca("old"), tls.generate_ca("new")
    d = tmp_path / "mount"
    d.mkdir()

    def publish(version: str, files: dict[str, bytes]) -> None:
        target = d / f"..{version}"
        target.mkdir()
        for name, data in files.items():
            (target / name).write_bytes(data)
        os.symlink(target.name, d / "..tmp")
        os.replace(d / "..tmp", d / "..data")
        for name in files:
            if not (d / name).is_symlink():
                os.symlink(f"..data/{name}", d / name)

    first = tls.issue_broker(ca_old, 3)
    publish("1", {"ca.crt": ca_old.cert_pem, "broker-3.crt": first.cert_pem, "broker-3.key": first.key_pem})
    cfg = config(tmp_path, d, broker_id=3)
    files = TlsFiles(cfg)
    store = open_store(cfg.metadata_url)
    try:
        documents.update_document(store, keys.broker(3), BrokerDocument, lambda _v: BrokerDocument(3, "h", 1))
        files.report(store)
        doc = documents.read(store, keys.broker(3), BrokerDocument)
        assert doc is not None
        assert doc.value.tls_trusted == (tls.fingerprint(ca_old.cert_pem),)
        assert doc.value.tls_certificate == tls.fingerprint(first.cert_pem)

        bundle = tls.join_bundle(ca_old.cert_pem, ca_new.cert_pem)
        publish("2", {"ca.crt": bundle, "broker-3.crt": first.cert_pem, "broker-3.key": first.key_pem})
        assert files.check() and files.loaded.version == 2
        files.report(store)
        doc = documents.read(store, keys.broker(3), BrokerDocument)
        assert doc is not None
        assert doc.value.tls_trusted == (tls.fingerprint(ca_old.cert_pem), tls.fingerprint(ca_new.cert_pem))
        assert (doc.value.host, doc.value.port) == ("h", 1)  # the rest of the document kept
    finally:
        store.close()


def test_unloadable_material_stops_the_start_with_its_name(tmp_path: Path) -> None:
    tls.write_private(tmp_path / "ca.crt", tls.generate_ca("ca").cert_pem)
    with pytest.raises(tls.TlsError, match=r"cannot read .*/broker-0\.crt"):
        TlsFiles(config(tmp_path, tmp_path))
