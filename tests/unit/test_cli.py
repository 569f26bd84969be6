"""The `sluice` command: argument parsing, bootstrap resolution and errors, without a broker."""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import subprocess
import sys
import types
from collections.abc import Iterator
from pathlib import Path

import pytest

from sluice import cli
from sluice.api.v1 import records_pb2
from sluice.cli.consume import format_record
from sluice.cli.engines import dev_cluster as dev
from sluice.cli.exits import CliError
from sluice.cli.output import table, to_plain
from sluice.cli.produce import split_line
from sluice.testing import free_port


@pytest.fixture(autouse=True)
def isolated_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Never read or write the real ~/.sluice; no bootstrap from the environment."""
    home = tmp_path / "sluice-home"
    monkeypatch.setenv("SLUICE_HOME", str(home))
    monkeypatch.delenv(cli.ENV_BOOTSTRAP, raising=False)
    monkeypatch.delenv("SLUICE_DEBUG", raising=False)
    return home


def parse(*argv: str) -> argparse.Namespace:
    return cli.build_parser().parse_args(list(argv))


def closed_address() -> str:
    return f"127.0.0.1:{free_port()}"  # free now: nothing listens there


# -- parsing ------------------------------------------------------------------------------------


def test_every_command_parses_with_defaults() -> None:
    up = parse("dev", "up")  # None: 1 broker on 9092 with a Kafka listener, unless a running cluster is found
    assert (up.brokers, up.port, up.kafka_listener, up.config) == (None, None, None, [])
    assert parse("topics", "create", "orders").partitions is None
    assert parse("topics", "describe", "a", "b").topics == ["a", "b"]
    p = parse("produce", "orders")
    assert (p.acks, p.key_separator, p.header, p.transactional_id) == ("all", None, [], None)
    c = parse("consume", "orders")
    assert c.isolation_level == "read_committed"  # Sluice's default, not Kafka's
    assert (c.from_beginning, c.max_messages, c.timeout, c.group) == (False, None, None, None)
    assert parse("transactions", "describe", "tx-1").transactional_ids == ["tx-1"]
    assert parse("bench", "transactions").commit_interval_ms == 100
    assert parse("bench", "latency").rate_mb_s == 10.0
    assert parse("demo").abort_every == 4


def test_option_values_are_normalised() -> None:
    assert parse("produce", "t", "--acks", "-1").acks == "all"
    assert parse("produce", "t", "--acks", "1").acks == "1"
    assert parse("produce", "t", "--compression", "ZSTD").compression == "zstd"
    assert parse("produce", "t", "--compression", "none").compression is None
    assert parse("produce", "t", "--key-separator", "\\t").key_separator == "\t"
    assert parse("produce", "t", "--header", "a=1", "--header", "b=x=y").header == [("a", "1"), ("b", "x=y")]
    assert parse("topics", "create", "t", "--config", "retention.ms=-1").config == [("retention.ms", "-1")]


@pytest.mark.parametrize(
    "argv",
    [
        ["nope"],
        [],
        ["topics"],
        ["produce", "t", "--header", "novalue"],
        ["produce", "t", "--acks", "2"],
        ["produce", "t", "--compression", "brotli"],
        ["consume", "t", "--max-messages", "0"],
        ["consume", "t", "--timeout", "-1"],
        ["consume", "t", "--isolation-level", "dirty"],
        ["topics", "create", "t", "--partitions", "zero"],
        ["dev", "up", "--brokers", "0"],
        ["bench", "produce", "--record-size", "0"],
    ],
)
def test_bad_usage_exits_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main(argv)
    assert exit_.value.code == 2
    assert "sluice" in capsys.readouterr().err


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.startswith("sluice ")


def test_inconsistent_options_are_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["consume", "t", "--offset", "5"]) == 2
    assert "--offset needs --partition" in capsys.readouterr().err
    assert cli.main(["consume", "t", "--partition", "0", "--group", "g"]) == 2
    assert cli.main(["demo", "--abort-every", "1"]) == 2


# -- broker -------------------------------------------------------------------------------------


def test_broker_hands_the_rest_of_the_line_to_the_broker_main(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[list[str]] = []
    fake = types.ModuleType("sluice.broker.main")

    def fake_main(argv: list[str]) -> int:
        seen.append(argv)
        return 7

    fake.main = fake_main  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "sluice.broker", types.ModuleType("sluice.broker"))
    monkeypatch.setitem(sys.modules, "sluice.broker.main", fake)
    argv = ["--id", "3", "--listen", "127.0.0.1:1", "--data", "d", "--metadata", "m", "--help"]
    assert cli.main(["broker", *argv]) == 7
    assert seen == [argv]


# -- where to connect -----------------------------------------------------------------------------


@pytest.fixture
def fake_supervisor() -> Iterator[int]:
    """A live process whose command line looks like a dev-cluster supervisor's."""
    proc = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)", "-m", "sluice.cli.engines.dev_cluster"]
    )
    try:
        yield proc.pid
    finally:
        proc.kill()
        proc.wait()


def test_bootstrap_resolution_order(monkeypatch: pytest.MonkeyPatch, fake_supervisor: int) -> None:
    assert cli.resolve_bootstrap(None) == (cli.DEFAULT_BOOTSTRAP, "the default")
    data = dev.default_data_dir()
    data.mkdir(parents=True)
    state = dev.DevState(supervisor_pid=fake_supervisor, data_dir=str(data), status="running")
    state.bootstrap_servers = "127.0.0.1:1111"
    dev.write_state(data, state)
    assert cli.resolve_bootstrap(None)[0] == "127.0.0.1:1111"
    monkeypatch.setenv(cli.ENV_BOOTSTRAP, "10.0.0.1:2222")
    assert cli.resolve_bootstrap(None)[0] == "10.0.0.1:2222"
    assert cli.resolve_bootstrap("h:3333") == ("h:3333", "--bootstrap-server")


def test_stale_dev_state_is_ignored() -> None:
    data = dev.default_data_dir()
    data.mkdir(parents=True)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    dev.write_state(data, dev.DevState(supervisor_pid=dead.pid, data_dir=str(data), bootstrap_servers="x:1"))
    assert dev.running_state(data) is None
    assert cli.resolve_bootstrap(None)[0] == cli.DEFAULT_BOOTSTRAP


@pytest.mark.parametrize(
    "argv",
    [
        ["topics", "list"],
        ["topics", "describe", "orders"],
        ["produce", "orders"],
        ["consume", "orders"],
        ["transactions", "list"],
    ],
)
def test_no_cluster_is_a_one_line_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main([*argv, "--bootstrap-server", closed_address()]) == 1
    err = capsys.readouterr().err
    assert "no Sluice broker is ready" in err and "sluice dev up" in err
    assert "Traceback" not in err


def test_dev_status_and_down_without_a_cluster(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["dev", "status"]) == 1
    assert "no dev cluster is running" in capsys.readouterr().err
    assert cli.main(["dev", "down"]) == 0


def test_dev_data_dir_resolution(tmp_path: Path) -> None:
    assert dev.resolve_data_dir(None) == dev.default_data_dir()
    assert dev.resolve_data_dir(str(tmp_path / "x")) == (tmp_path / "x").resolve()


# -- output helpers -------------------------------------------------------------------------------


@dataclasses.dataclass
class _Rec:
    partition: int = 1
    offset: int = 42
    key: bytes | None = b"k"
    value: bytes | None = b"v"
    headers: list[tuple[str, bytes]] = dataclasses.field(default_factory=lambda: [("h", b"1")])
    timestamp: int = 1000


def test_record_formatting() -> None:
    args = parse("consume", "t")
    assert format_record(_Rec(), args) == b"v\n"
    args = parse("consume", "t", "--print-key", "--print-offset", "--print-headers", "--separator", "|")
    assert format_record(_Rec(), args) == b"1:42|h=1|k|v\n"
    assert format_record(_Rec(key=None, value=None, headers=[]), args) == b"1:42|NO_HEADERS|null|null\n"


def test_key_separator_parsing() -> None:
    assert split_line(b"k:v:w", b":", 1) == (b"k", b"v:w")
    assert split_line(b"plain", None, 1) == (None, b"plain")
    with pytest.raises(cli.CliError, match="line 3 has no key separator"):
        split_line(b"novalue", b":", 3)


def test_to_plain_handles_client_result_shapes() -> None:
    msg = records_pb2.TopicPartition(topic="t", partition=2)
    assert to_plain(msg) == {"topic": "t", "partition": 2}
    assert to_plain(_Rec(headers=[]))["key"] == "k"
    assert to_plain({"a": [b"x", (1, 2)]}) == {"a": ["x", [1, 2]]}


def test_table() -> None:
    assert table([["a", 1], ["bbb", None]], ["X", "Y"]).splitlines() == ["X    Y", "a    1", "bbb"]


def test_console_script_help_runs() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "sluice.cli", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "SLUICE_HOME": "/nonexistent"},
    )
    assert out.returncode == 0
    for command in ("broker", "dev", "topics", "produce", "consume", "transactions", "bench", "demo"):
        assert command in out.stdout


def test_help_loads_neither_the_client_nor_grpc() -> None:
    """`sluice --help` stays fast: the commands import the client, grpc and the engines when they run."""
    heavy = ("grpc", "google", "sluice.api", "sluice.client", "sluice.broker", "sluice.operator", "sluice.testing")
    script = (
        "import sys, sluice.cli\n"
        "sluice.cli.build_parser().format_help()\n"
        f"print(sorted(m for m in sys.modules if m.startswith({heavy!r}) or m.startswith('sluice.cli.engines')))\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]"


class _NoTopics:
    """An Admin stand-in for the CLI's own wording (the client's behaviour is tested elsewhere)."""

    def describe_topic(self, topic: str) -> None:
        from sluice import errors

        raise errors.UnknownTopicOrPartitionError(f"unknown topic {topic!r}")


def test_an_unknown_topic_hints_at_creating_it_except_when_deleting() -> None:
    from sluice.cli.clients import describe_existing_topic

    with pytest.raises(cli.CliError, match=r"create it with `sluice topics create t`"):
        describe_existing_topic(_NoTopics(), "t")  # type: ignore[arg-type]
    with pytest.raises(cli.CliError) as raised:
        describe_existing_topic(_NoTopics(), "t", hint_create=False)  # type: ignore[arg-type]
    assert str(raised.value) == "unknown topic 't'"


def test_produce_reports_only_acknowledged_records_after_an_error() -> None:
    from sluice.cli.produce import _before_the_error

    assert _before_the_error(0, 1, "all") == "no record was written (acknowledged) before the error"
    assert _before_the_error(3, 7, "1").startswith("3 of 7 record(s) were written (acknowledged)")
    assert "4 were not acknowledged" in _before_the_error(3, 7, "all")
    assert "acks=0" in _before_the_error(5, 5, "0")


def test_client_properties_take_kafkas_names() -> None:
    from sluice.cli.clients import client_properties
    from sluice.client import Consumer, Producer

    props = [("linger.ms", "20"), ("compression.type", "zstd"), ("enable.idempotence", "false"), ("acks", "1")]
    assert client_properties(Producer, props, "--producer-property") == {
        "linger_ms": 20, "compression": "zstd", "enable_idempotence": False, "acks": "1",
    }  # fmt: skip
    assert client_properties(Consumer, [("max.poll.records", "7")], "--consumer-property") == {"max_poll_records": 7}
    for key, value, says in (
        ("no.such.setting", "1", "not a Producer setting; known: "),
        ("ssl.cafile", "x", "(use --command-config)"),
        ("transactional.id", "t", "(use --transactional-id)"),
        ("linger.ms", "soon", "expected an integer"),
        ("enable.idempotence", "yes", "expected true or false"),
    ):
        with pytest.raises(CliError, match=re.escape(says)) as exc:
            client_properties(Producer, [(key, value)], "--producer-property")
        assert exc.value.code == 2
    with pytest.raises(CliError, match=re.escape("(use --group)")):
        client_properties(Consumer, [("group.id", "g")], "--consumer-property")


def test_consume_timeout_ms_is_kafkas_spelling_of_timeout() -> None:
    assert parse("consume", "t", "--timeout-ms", "1500").timeout_ms == 1500
    assert parse("produce", "t", "--command-property", "linger.ms=1").producer_property == [("linger.ms", "1")]
    assert parse("consume", "t", "--consumer-property", "a=b").consumer_property == [("a", "b")]


def test_every_option_and_positional_has_help_text() -> None:
    """`sluice X --help` explains each of its options (65 of 202 options and 13 positionals had none)."""
    from sluice.cli.parser import build_parser

    def missing(p: argparse.ArgumentParser, path: str) -> Iterator[str]:
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    yield from missing(sub, f"{path} {name}")
            elif not isinstance(action, argparse._HelpAction) and not action.help:
                yield f"{path} {'/'.join(action.option_strings) or action.dest}"

    assert list(missing(build_parser(), "sluice")) == []
