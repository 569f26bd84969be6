"""``sluice produce`` ended by an error reports the records the brokers acknowledged, and only those.

It used to count the records handed to the producer ("1 record(s) were sent before the error"
when the broker had refused that one record). The count it prints must be what a reader finds.
"""

from __future__ import annotations

import io
import re
import sys
from collections.abc import Iterator

import pytest

from sluice import cli
from sluice.client import Admin
from sluice.testing import LocalCluster

from .helpers import read_topic


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(brokers=1, data_dir=tmp_path_factory.mktemp("produce-errors")) as c:
        yield c


def produce(cluster: LocalCluster, topic: str, data: bytes, monkeypatch: pytest.MonkeyPatch,
            capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[int, str]:  # fmt: skip
    capsys.readouterr()
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))
    code = cli.main(["produce", topic, "--bootstrap-server", cluster.bootstrap_servers, *extra])
    return code, capsys.readouterr().err


def small_topic(cluster: LocalCluster, name: str) -> None:
    admin = Admin(bootstrap_servers=cluster.bootstrap_servers)
    try:
        admin.create_topic(name, partitions=1, config={"max.message.bytes": "2000"})
    finally:
        admin.close()


def test_a_refused_record_alone_is_reported_as_nothing_written(
    cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    small_topic(cluster, "refused-alone")
    code, err = produce(cluster, "refused-alone", b"x" * 5000 + b"\n", monkeypatch, capsys)
    assert code == 1
    assert "no record was written (acknowledged) before the error" in err and "were sent" not in err, err
    assert read_topic(cluster.bootstrap_servers, "refused-alone") == []


def test_the_count_reported_is_what_a_reader_finds(
    cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    small_topic(cluster, "refused-later")
    lines = b"".join(b"ok-%d\n" % i for i in range(5)) + b"y" * 5000 + b"\n" + b"after\n"
    code, err = produce(cluster, "refused-later", lines, monkeypatch, capsys)
    assert code == 1
    found = read_topic(cluster.bootstrap_servers, "refused-later")
    match = re.search(r"(\d+) of 7 record\(s\) were written \(acknowledged\) before the error", err)
    if found:
        assert match is not None and int(match.group(1)) == len(found), err
    else:  # the refused record shared its batch with the others: nothing written, and it says so
        assert "no record was written (acknowledged) before the error" in err, err
