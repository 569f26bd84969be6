"""The client commands, ``sluice demo --secure`` and ``sluice bench --secure`` on secure clusters.

Every client command takes ``--command-config FILE`` (Kafka's properties, PEM locations with
librdkafka's key names); a secure dev cluster's ``admin.properties`` is used by default when the
command connects to that dev cluster.
"""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import pytest

from sluice import cli
from sluice.testing import LocalCluster


def _properties(path: Path, cfg: dict[str, str]) -> Path:
    path.write_text(
        "# librdkafka's PEM key names\nsecurity.protocol=SSL\n"
        f"ssl.ca.location={cfg['ssl_cafile']}\nssl.certificate.location={cfg['ssl_certfile']}\n"
        f"ssl.key.location={cfg['ssl_keyfile']}\n"
    )
    return path


def test_client_commands_take_command_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    with LocalCluster(brokers=1, data_dir=tmp_path / "c", secure=True) as cluster:
        admin = _properties(tmp_path / "admin.properties", cluster.client_config("admin"))
        alice = _properties(tmp_path / "alice.properties", cluster.client_config("alice"))
        as_admin = ["--bootstrap-server", cluster.bootstrap_servers, "--command-config", str(admin)]
        as_alice = ["--bootstrap-server", cluster.bootstrap_servers, "--command-config", str(alice)]

        # without settings the TLS listener does not answer a plaintext health check: one line, with the hint
        assert cli.main(["topics", "list", "--bootstrap-server", cluster.bootstrap_servers]) == 1
        err = capsys.readouterr().err
        assert "no Sluice broker is ready" in err and "--command-config" in err

        assert cli.main(["topics", "create", "orders", "--partitions", "1", *as_admin]) == 0
        capsys.readouterr()
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"one\ntwo\n")))
        assert cli.main(["produce", "orders", *as_admin]) == 0
        capsys.readouterr()
        consume = ["consume", "orders", "--from-beginning", "--max-messages", "2", "--timeout", "30"]
        assert cli.main([*consume, *as_admin]) == 0
        assert capsys.readouterr().out.split() == ["one", "two"]
        assert cli.main(["topics", "list", "--json", *as_admin]) == 0
        assert "orders" in json.loads(capsys.readouterr().out)
        for argv in (
            ["transactions", "list"],
            ["consumer-groups", "list"],
            ["acls", "list"],
            ["top", "--iterations", "1"],
        ):
            assert cli.main([*argv, *as_admin]) == 0, argv
        capsys.readouterr()

        # alice has no ACL: refused by the authorizer, as one line, not a traceback
        assert cli.main(["topics", "create", "alices", *as_alice]) != 0
        err = capsys.readouterr().err
        assert "Authorization" in err or "authoriz" in err.lower(), err
        assert "Traceback" not in err
        assert cli.main([*consume[:-2], "--timeout", "5", *as_alice]) != 0
        err = capsys.readouterr().err
        assert "orders" in err and "Traceback" not in err, err


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("ssl.truststore.location=/x.jks\n", "not Java key stores; use ssl.ca.location"),
        ("security.protocol=SASL_PLAINTEXT\n", "SASL_PLAINTEXT is not supported"),
        ("security.protocol=SSL\n", "needs ssl.ca.location"),
        ("security.protocol=SSL\nssl.ca.location=/ca\nssl.certificate.location=/c\n", "go together"),
        ("security.protocol=SASL_SSL\nssl.ca.location=/ca\n", "sasl.oauthbearer.token.file goes with"),
        ("sasl.oauthbearer.token.file=/t\n", "goes with security.protocol=SASL_SSL"),
        (
            "security.protocol=SASL_SSL\nssl.ca.location=/ca\nsasl.oauthbearer.token.file=/t\nsasl.mechanism=PLAIN\n",
            "sasl.mechanism=PLAIN is not supported",
        ),
        ("sasl.kerberos.service.name=sluice\n", "expected one of security.protocol"),
    ],
)
def test_bad_command_config_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, message: str
) -> None:
    bad = tmp_path / "bad.properties"
    bad.write_text(text)
    assert cli.main(["topics", "list", "--bootstrap-server", "127.0.0.1:1", "--command-config", str(bad)]) == 2
    assert message in capsys.readouterr().err
    missing = ["topics", "list", "--bootstrap-server", "127.0.0.1:1", "--command-config", str(tmp_path / "none")]
    assert cli.main(missing) == 2


def test_dev_up_secure_commands_use_its_admin_properties(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SLUICE_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("SLUICE_BOOTSTRAP_SERVERS", raising=False)
    data = tmp_path / "dev"
    assert cli.main(["dev", "up", "--secure", "--port", "0", "--data", str(data), "--timeout", "120"]) == 0
    try:
        capsys.readouterr()
        # no --bootstrap-server, no --command-config: the dev cluster's address and its admin.properties
        assert cli.main(["topics", "create", "auto", "--partitions", "1"]) == 0
        assert cli.main(["topics", "list", "--json"]) == 0
        assert "auto" in json.loads(capsys.readouterr().out)
        # the same address given explicitly does not get the dev cluster's credentials
        servers = cli.resolve_bootstrap(None)[0]
        assert cli.main(["topics", "list", "--bootstrap-server", servers]) == 1
        assert "--command-config" in capsys.readouterr().err
    finally:
        assert cli.main(["dev", "down", "--data", str(data)]) == 0


def test_demo_secure_is_exactly_once(capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["demo", "--secure", "--brokers", "1", "--records", "300", "--partitions", "2",
                     "--no-chaos", "--no-progress", "--timeout", "300"])  # fmt: skip
    out = capsys.readouterr()
    assert code == 0, out.out + out.err
    assert "the copier ran as User:demo-copier with ACLs" in out.out


def test_bench_secure(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    results = tmp_path / "results.json"
    argv = ["bench", "produce", "--secure", "--count", "2000", "--partitions", "1", "--no-progress",
            "--output", str(results)]  # fmt: skip
    assert cli.main(argv) == 0
    assert "secure (mutual TLS, authorizer on)" in capsys.readouterr().err
    [result] = json.loads(results.read_text())
    assert result["params"]["secure"] is True and result["records"] == 2000 and not result["error"]
    assert cli.main(["bench", "produce", "--secure", "--bootstrap-server", "127.0.0.1:1"]) == 2
    assert "--command-config" in capsys.readouterr().err
