"""``sluice acls add|list|remove`` against a secure LocalCluster, connecting as its super user."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import pytest

from sluice import cli, errors
from sluice.client import Admin, Producer
from sluice.testing import LocalCluster


def test_acls_add_list_remove(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    with LocalCluster(brokers=1, data_dir=tmp_path / "c", secure=True) as cluster:
        admin = cluster.client_config("admin")
        config = tmp_path / "admin.properties"
        config.write_text(
            "# the super user's certificate\nsecurity.protocol=SSL\n"
            f"ssl.cafile={admin['ssl_cafile']}\nssl.certfile={admin['ssl_certfile']}\nssl.keyfile={admin['ssl_keyfile']}\n"
        )
        common = ["--bootstrap-server", cluster.bootstrap_servers, "--command-config", str(config)]
        with Admin(**admin) as a:
            a.create_topic("orders", 1, 1)
        alice = Producer(**cluster.client_config("alice"), request_timeout_ms=10_000)
        with alice, pytest.raises(errors.TopicAuthorizationFailedError):
            alice.send("orders", b"x", partition=0).get(timeout=30)

        assert cli.main(["acls", "add", *common, "--allow-principal", "User:alice", "--operation", "Write",
                         "--topic", "orders"]) == 0  # fmt: skip
        assert "added ALLOW User:alice WRITE on TOPIC LITERAL 'orders'" in capsys.readouterr().out
        with Producer(**cluster.client_config("alice")) as producer:
            producer.send("orders", b"x", partition=0).get(timeout=30)

        assert cli.main(["acls", "list", *common, "--json"]) == 0
        listed = json.loads(capsys.readouterr().out)
        assert listed == [
            {"resource_type": "TOPIC", "name": "orders", "pattern_type": "LITERAL", "principal": "User:alice",
             "host": "*", "operation": "WRITE", "permission_type": "ALLOW"}
        ]  # fmt: skip
        # remove asks first, as kafka-acls does: no answer (EOF) or "n" removes nothing
        for answer in (b"", b"n\n"):
            monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(answer)))
            assert cli.main(["acls", "remove", *common, "--principal", "User:alice"]) == 1
            out, err = capsys.readouterr()
            assert out == "" and "ALLOW User:alice WRITE" in err and "remove these 1 ACL(s)? (y/n)" in err
            assert "nothing removed" in err and "--force" in err
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"y\n")))
        assert cli.main(["acls", "remove", *common, "--principal", "User:alice"]) == 0
        assert "removed ALLOW User:alice WRITE" in capsys.readouterr().out
        assert cli.main(["acls", "list", *common, "--json"]) == 0
        assert json.loads(capsys.readouterr().out) == []
        assert cli.main(["acls", "list", *common]) == 0  # empty: says so on stderr, stdout stays empty
        assert capsys.readouterr() == ("", "sluice: no ACLs\n")
        assert cli.main(["acls", "remove", *common, "--principal", "User:alice"]) == 0
        assert "no ACLs match: nothing to remove" in capsys.readouterr().err
        assert cli.main(["acls", "add", *common, "--allow-principal", "User:bob", "--operation", "read",
                         "--topic", "orders"]) == 0  # fmt: skip
        capsys.readouterr()
        assert cli.main(["acls", "remove", *common, "--principal", "User:bob", "--force"]) == 0  # no question
        out, err = capsys.readouterr()
        assert "removed ALLOW User:bob READ" in out and "(y/n)" not in err

        # bad input: a clear one-line error, exit 2
        bad = tmp_path / "bad.properties"
        bad.write_text("sasl.jaas.config=x\n")  # a Kafka key the CLI does not take
        assert cli.main(["acls", "list", "--bootstrap-server", cluster.bootstrap_servers,
                         "--command-config", str(bad)]) == 2  # fmt: skip
        assert "expected one of security.protocol" in capsys.readouterr().err
        bad.write_text("sasl.mechanism=PLAIN\n")  # a key it takes, with a value it refuses
        assert cli.main(["acls", "list", "--bootstrap-server", cluster.bootstrap_servers,
                         "--command-config", str(bad)]) == 2  # fmt: skip
        assert "sasl.mechanism=PLAIN is not supported" in capsys.readouterr().err
        # alice is not allowed to manage ACLs
        alice_cfg = cluster.client_config("alice")
        mine = tmp_path / "alice.properties"
        mine.write_text(
            f"security.protocol=SSL\nssl.cafile={alice_cfg['ssl_cafile']}\n"
            f"ssl.certfile={alice_cfg['ssl_certfile']}\nssl.keyfile={alice_cfg['ssl_keyfile']}\n"
        )
        code = cli.main(
            ["acls", "list", "--bootstrap-server", cluster.bootstrap_servers, "--command-config", str(mine)]
        )
        assert code != 0
        assert "DESCRIBE on the cluster" in capsys.readouterr().err
