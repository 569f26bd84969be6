"""``sluice top`` against real brokers: a departed broker shows as DOWN, and ``q`` quits on a terminal."""

from __future__ import annotations

import os
import pty
import select
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from sluice.testing import LocalCluster


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(brokers=2, data_dir=tmp_path_factory.mktemp("top")) as c:
        yield c


def top(cluster: LocalCluster, *args: str) -> list[str]:
    return [sys.executable, "-m", "sluice", "top", "--bootstrap-server", cluster.bootstrap_servers, *args]


def test_q_quits_on_a_terminal(cluster: LocalCluster) -> None:
    controller, terminal = pty.openpty()
    proc = subprocess.Popen(top(cluster, "--interval", "30"), stdin=terminal, stdout=terminal, stderr=terminal)
    os.close(terminal)
    seen = b""
    try:
        deadline = time.monotonic() + 60
        while b"(q to quit)" not in seen and time.monotonic() < deadline:
            if select.select([controller], [], [], 1.0)[0]:
                seen += os.read(controller, 65536)
        assert b"BROKERS" in seen and b"(q to quit)" in seen, seen[-2000:]
        started = time.monotonic()
        os.write(controller, b"q")
        assert proc.wait(timeout=15) == 0
        assert time.monotonic() - started < 10  # not the 30 s interval
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(controller)


def test_a_departed_broker_is_down(cluster: LocalCluster) -> None:
    done = subprocess.run(top(cluster, "--iterations", "1"), capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert "brokers 2  " in done.stdout and "DOWN" not in done.stdout
    cluster.kill(1)
    done = subprocess.run(top(cluster, "--iterations", "1"), capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert "brokers 2 (1 not serving)" in done.stdout, done.stdout
    rows = {line.split()[0]: line.split() for line in done.stdout.split("BROKERS\n")[1].splitlines()[1:3]}
    assert rows["0"][2] == "up" and rows["1"][2] == "DOWN", done.stdout
