"""LocalCluster itself: start, health, kill/restart on the same port, pause/resume, clean stop,
failure reporting, no leaked processes; and the dev cluster and demo built on it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from sluice.cli.engines.dev_cluster import pid_alive
from sluice.testing import ClusterError, LocalCluster, check_health

Factory = Callable[..., LocalCluster]


def _gone(pid: int, timeout: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not pid_alive(pid):
            return True
        time.sleep(0.1)
    return False


def test_start_health_and_layout(fresh_cluster: Factory) -> None:
    c = fresh_cluster()
    host, port = c.bootstrap_servers.rsplit(":", 1)
    assert host == "127.0.0.1" and int(port) > 0
    assert check_health(c.address(0)) == "SERVING"
    assert c.health() == {0: "SERVING"}
    assert c.broker(0).log_path == c.data_dir / "broker-0.log"
    assert c.broker(0).log_path.stat().st_size > 0
    assert c.broker(0).data_path.is_dir()
    assert c.describe()["brokers"][0]["state"] == "running"


def test_kill_then_restart_on_the_same_port(fresh_cluster: Factory) -> None:
    c = fresh_cluster()
    address, pid = c.address(0), c.broker(0).pid
    assert pid is not None
    c.kill(0)
    assert c.broker(0).state == "killed"
    assert not pid_alive(pid)
    assert check_health(address, timeout=0.5) == "UNREACHABLE"
    c.restart(0)
    assert c.address(0) == address
    assert c.broker(0).pid != pid
    assert check_health(address) == "SERVING"


def test_pause_and_resume(fresh_cluster: Factory) -> None:
    c = fresh_cluster()
    c.pause(0)
    assert c.health() == {0: "PAUSED"}
    assert check_health(c.address(0), timeout=0.5) == "UNREACHABLE"  # alive, but answers nothing
    c.resume(0)
    c.wait_until_healthy(timeout=10)
    assert c.is_healthy(0)


def test_stop_is_a_clean_shutdown_and_restart_finds_the_data(fresh_cluster: Factory) -> None:
    c = fresh_cluster()
    assert c.stop(0) == 0  # SIGTERM: exit code 0 within the grace period
    assert c.health() == {0: "STOPPED"}
    c.wait_until_healthy(timeout=1)  # nothing running: nothing to wait for
    c.restart(0)
    assert c.is_healthy(0)


def test_restart_of_a_running_broker_and_from_a_short_lived_thread(fresh_cluster: Factory) -> None:
    c = fresh_cluster()
    t = threading.Thread(target=c.restart, args=(0,))
    t.start()
    t.join(timeout=90)
    # PR_SET_PDEATHSIG fires when the forking *thread* exits; the spawner thread keeps the broker alive.
    time.sleep(1.0)
    assert c.is_healthy(0)


def test_temporary_data_dir_is_removed() -> None:
    with LocalCluster() as c:
        data_dir = c.data_dir
        assert data_dir.is_dir()
    assert not data_dir.exists()


def test_given_data_dir_is_kept(tmp_path: Path) -> None:
    with LocalCluster(data_dir=tmp_path / "kept") as c:
        assert c.is_healthy(0)
    assert (tmp_path / "kept" / "broker-0.log").exists()


def test_a_broker_that_cannot_start_fails_fast_with_its_log(tmp_path: Path) -> None:
    started = time.monotonic()
    with pytest.raises(ClusterError) as err:
        LocalCluster(data_dir=tmp_path, config={"no.such.setting": "1"}, startup_timeout=60).start()
    assert time.monotonic() - started < 30
    assert "no.such.setting" in str(err.value)
    assert "broker-0.log" in str(err.value)


def test_busy_port_is_refused(tmp_path: Path, fresh_cluster: Factory) -> None:
    c = fresh_cluster()
    with pytest.raises(ClusterError, match="already in use"):
        LocalCluster(data_dir=tmp_path / "other", ports=[c.broker(0).port]).start()


def test_brokers_die_with_their_parent(tmp_path: Path) -> None:
    if not sys.platform.startswith("linux"):
        pytest.skip("PR_SET_PDEATHSIG is Linux only")
    script = (
        "import json, os, signal\n"
        "from sluice.testing import LocalCluster\n"
        f"c = LocalCluster(data_dir={str(tmp_path)!r}).start()\n"
        "print(json.dumps([b.pid for b in c.brokers]), flush=True)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False)
    pids = json.loads(out.stdout.strip().splitlines()[-1])
    assert pids and all(_gone(pid) for pid in pids), f"brokers outlived their parent: {pids}"


def test_two_brokers_share_one_metadata_file(fresh_cluster: Factory) -> None:
    c = fresh_cluster(brokers=2)
    assert c.health() == {0: "SERVING", 1: "SERVING"}
    assert len(set(c.bootstrap_servers.split(","))) == 2
    for b in c.brokers:
        assert b.argv[b.argv.index("--metadata") + 1] == str(c.metadata_path)
    c.kill(1)
    assert c.health()[0] == "SERVING"
    c.restart(1)
    c.wait_until_healthy(timeout=30)


def _sluice(*args: str, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sluice.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
        check=False,
    )


def test_dev_cluster_up_status_down(tmp_path: Path) -> None:
    env = {**os.environ, "SLUICE_HOME": str(tmp_path / "home")}
    env.pop("SLUICE_BOOTSTRAP_SERVERS", None)
    up = _sluice("dev", "up", "--port", "0", env=env)
    try:
        assert up.returncode == 0, up.stderr
        bootstrap = up.stdout.strip()
        assert check_health(bootstrap) == "SERVING"
        status = _sluice("dev", "status", "--json", env=env)
        assert status.returncode == 0, status.stderr
        info = json.loads(status.stdout)
        assert info["healthy"] and info["bootstrap_servers"] == bootstrap
        table = _sluice("dev", "status", env=env)
        metrics_url = info["brokers"][0]["metrics_url"]
        assert metrics_url.startswith("http://") and metrics_url in table.stdout  # where to scrape
        again = _sluice("dev", "up", "--port", "0", env=env)
        assert again.returncode == 0 and again.stdout.strip() == bootstrap  # idempotent
        assert "starting" not in again.stderr and "already running" in again.stderr
        unknown = _sluice("transactions", "describe", "no-such-id", env=env)
        assert unknown.returncode == 1 and unknown.stdout == "" and "TRANSACTIONAL_ID_NOT_FOUND" in unknown.stderr
        listed = _sluice("topics", "list", env=env)  # finds the dev cluster on its own
        assert listed.returncode == 0, listed.stderr
    finally:
        down = _sluice("dev", "down", env=env)
    assert down.returncode == 0, down.stderr
    assert check_health(bootstrap, timeout=0.5) == "UNREACHABLE"
    assert _sluice("dev", "status", env=env).returncode == 1


def test_demo_is_exactly_once() -> None:
    from sluice.cli.engines.demo import run_demo

    report = run_demo(
        records=300, partitions=2, txn_size=40, abort_every=3, brokers=1, chaos=False, progress=False, timeout=240
    )
    assert report.aborted_transactions >= 1
    assert report.exactly_once, report.render()
    assert report.uncommitted_view_records == report.output_records + report.aborted_records


def test_demo_is_exactly_once_while_a_broker_and_the_copier_crash() -> None:
    from sluice.cli.engines.demo import run_demo

    report = run_demo(records=600, partitions=3, txn_size=40, abort_every=4, progress=False, timeout=300)
    assert report.exactly_once, report.render()
    assert any("SIGKILL" in n for n in report.notes) and any("copier was restarted" in n for n in report.notes)
    # the crashed copier's open transaction was aborted by its successor: read_uncommitted sees it,
    # and the report counts it, so its lines add up (unless a transaction also failed with the broker)
    assert report.fenced_transactions == 1 and report.fenced_records > 0
    aborted = report.aborted_records + report.fenced_records
    if not any("aborted after" in n for n in report.notes):
        assert report.uncommitted_view_records == report.output_records + aborted, report.render()
    text = report.render()
    assert f"{report.output_records:,} committed + {report.uncommitted_view_records - report.output_records:,}" in text
    assert f"({report.fenced_records:,} records written by the crashed one)" in text
