"""``sluice dev up --secure``: a background cluster with mTLS clients and ACLs, managed as User:admin."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from sluice import cli


def test_dev_up_secure(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLUICE_HOME", str(tmp_path / "home"))
    data = tmp_path / "dev"
    assert cli.main(["dev", "up", "--secure", "--port", "0", "--data", str(data), "--timeout", "120"]) == 0
    try:
        out = capsys.readouterr()
        servers = out.out.strip()
        admin_config = data / "admin.properties"
        assert f"secure: mutual TLS and ACLs; the super user's settings are in {admin_config}" in out.err
        assert stat.S_IMODE(os.stat(admin_config).st_mode) == 0o600
        assert cli.main(["dev", "status", "--data", str(data), "--json"]) == 0
        status = json.loads(capsys.readouterr().out)
        assert status["secure"] is True and status["healthy"] is True
        common = ["--bootstrap-server", servers, "--command-config", str(admin_config)]
        assert cli.main(["acls", "add", *common, "--allow-principal", "User:alice", "--operation", "read",
                         "--group", "g"]) == 0  # fmt: skip
        assert "added ALLOW User:alice READ on GROUP LITERAL 'g'" in capsys.readouterr().out
        assert cli.main(["acls", "list", *common, "--json"]) == 0
        listed = json.loads(capsys.readouterr().out)
        assert [(b["principal"], b["resource_type"], b["name"]) for b in listed] == [("User:alice", "GROUP", "g")]
    finally:
        assert cli.main(["dev", "down", "--data", str(data)]) == 0
