"""Client TLS settings: checked when the client is made, with messages naming the setting."""

from __future__ import annotations

from pathlib import Path

import pytest

from sluice import tls
from sluice.client import Admin
from sluice.client._network.security import ClientSecurity


def test_plaintext_is_the_default_and_takes_no_files() -> None:
    assert ClientSecurity.build().protocol == "PLAINTEXT"
    with pytest.raises(ValueError, match="ssl_cafile given with security_protocol='PLAINTEXT'"):
        ClientSecurity.build(ssl_cafile="/x")


def test_bad_settings_are_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="security_protocol must be one of PLAINTEXT, SSL"):
        ClientSecurity.build("SSLv3")
    with pytest.raises(ValueError, match="ssl_certfile and ssl_keyfile go together"):
        ClientSecurity.build("SSL", ssl_certfile="/x")
    with pytest.raises(ValueError, match=r"ssl_cafile ./nonexistent/ca\.crt. cannot be read"):
        Admin(bootstrap_servers="127.0.0.1:1", security_protocol="SSL", ssl_cafile="/nonexistent/ca.crt")


def test_ssl_reads_the_files(tmp_path: Path) -> None:
    ca = tls.generate_ca("ca")
    tls.write_dir(tmp_path, ca.cert_pem, tls.issue(ca, "alice"))
    sec = ClientSecurity.build(
        "ssl", str(tmp_path / tls.CA_FILE), str(tmp_path / tls.CERT_FILE), str(tmp_path / tls.KEY_FILE)
    )
    assert sec.protocol == "SSL" and sec.ca_pem == ca.cert_pem and sec.key_pem is not None


def test_certificates_name_their_holder_and_files_are_private(tmp_path: Path) -> None:
    ca = tls.generate_ca("ca")
    pair = tls.issue_broker(ca, 3, ["127.0.0.1", "broker.example"])
    assert pair.common_name == "sluice-broker-3"
    tls.write_dir(tmp_path / "b", ca.cert_pem, pair)
    for name in (tls.CA_FILE, tls.CERT_FILE, tls.KEY_FILE):
        assert (tmp_path / "b" / name).stat().st_mode & 0o777 == 0o600
    assert tls.load_dir(tmp_path / "b").cert_pem == pair.cert_pem
    with pytest.raises(tls.TlsError, match="cannot read"):
        tls.load_dir(tmp_path / "missing")
