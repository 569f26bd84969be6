"""The ``sluice`` command: broker, local dev cluster, topics, produce/consume, transactions, bench, demo.

Design:

* argparse, one sub-command per Kafka tool a user knows (kafka-topics.sh,
  kafka-console-producer.sh, kafka-console-consumer.sh,
  kafka-transactions.sh, kafka-producer-perf-test.sh), with Kafka's option
  names where they exist (``--bootstrap-server``, ``--from-beginning``,
  ``--isolation-level``, ``--max-messages``, ``--partitions``,
  ``--replication-factor``, ``--config``).
* Heavy imports (the client, the broker, grpc) happen inside the commands:
  ``sluice --help`` stays fast and ``sluice broker`` loads only the broker.
* Where to connect, in order: ``--bootstrap-server``, the environment
  variable ``SLUICE_BOOTSTRAP_SERVERS``, the running dev cluster (``sluice dev
  up``), then ``127.0.0.1:9092`` (Kafka's port, which is also where ``sluice
  dev up`` puts broker 0). Before talking to a cluster the command checks
  that a broker answers its health check, so "nothing is running" is a
  one-line error, not a client timeout.
* Data goes to stdout, everything else (progress, summaries, errors) to
  stderr. Exit codes: 0 success, 1 failure, 2 bad usage, 130 interrupted.

Nothing imports this module (import-linter's top layer); its logic that is
worth reusing lives in :mod:`sluice.testing` (cluster, dev, bench, demo).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import os
import sys
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import sluice

DEFAULT_BOOTSTRAP = "127.0.0.1:9092"
ENV_BOOTSTRAP = "SLUICE_BOOTSTRAP_SERVERS"


class CliError(Exception):
    """An error to report in one line (no traceback), with its exit code."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


# -- argument types -----------------------------------------------------------------------------


def _bounded(kind: type[int] | type[float], noun: str, minimum: float, strict: bool) -> Callable[[str], Any]:
    """An argparse type: ``kind(text)``, refused unless > ``minimum`` (``strict``) or >= it."""

    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not {noun}: {text!r}") from None
        if value < minimum or (strict and value == minimum):
            raise argparse.ArgumentTypeError(f"must be {'>' if strict else '>='} {minimum:g}, got {value}")
        return value

    return parse


_positive_int = _bounded(int, "an integer", 1, strict=False)
_non_negative_int = _bounded(int, "an integer", 0, strict=False)
_positive_float = _bounded(float, "a number", 0, strict=True)


def _key_value(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key.strip(), value


def _acks(text: str) -> str:
    value = text.strip().lower()
    if value in ("all", "-1"):
        return "all"
    if value in ("0", "1"):
        return value
    raise argparse.ArgumentTypeError(f"acks must be all, -1, 0 or 1, got {text!r}")


def _compression(text: str) -> str | None:
    value = text.strip().lower()
    if value == "none":
        return None
    if value in ("gzip", "lz4", "zstd"):
        return value
    raise argparse.ArgumentTypeError(f"compression must be none, gzip, lz4 or zstd, got {text!r}")


def _separator(text: str) -> str:
    """Separators may be given with escapes: '\\t' is a tab."""
    if not text:
        raise argparse.ArgumentTypeError("the separator must not be empty")
    return text.encode("utf-8").decode("unicode_escape")


ISOLATION_LEVELS = ("read_committed", "read_uncommitted")


# -- the parser ---------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sluice",
        description="Sluice: a transactional, Kafka-style log broker. "
        "Start a local cluster with `sluice dev up`, or see it work with `sluice demo`.",
    )
    parser.add_argument("--version", action="version", version=f"sluice {sluice.__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    client = argparse.ArgumentParser(add_help=False)
    client.add_argument(
        "--bootstrap-server",
        metavar="HOST:PORT[,...]",
        help=f"brokers to connect to (default: ${ENV_BOOTSTRAP}, else the running dev cluster, "
        f"else {DEFAULT_BOOTSTRAP})",
    )

    # broker: the rest of the line goes to the broker's own parser (see main()).
    sub.add_parser(
        "broker",
        help="run a broker process (arguments: sluice broker --help)",
        add_help=False,
        prefix_chars="\0",  # never parse broker options here
    ).add_argument("broker_args", nargs=argparse.REMAINDER)

    # operator: the rest of the line goes to the operator's own parser.
    sub.add_parser(
        "operator",
        help="run the Kubernetes operator (arguments: sluice operator --help)",
        add_help=False,
        prefix_chars="\0",
    ).add_argument("operator_args", nargs=argparse.REMAINDER)

    # dev
    dev = sub.add_parser("dev", help="a local cluster running in the background")
    dev_sub = dev.add_subparsers(dest="dev_command", metavar="ACTION", required=True)
    up = dev_sub.add_parser("up", help="start the dev cluster (prints its bootstrap servers)")
    up.add_argument("--brokers", type=_positive_int, default=1, help="number of brokers (default 1)")
    up.add_argument("--data", metavar="DIR", help="data directory (default: ~/.sluice/dev, or $SLUICE_HOME/dev)")
    up.add_argument(
        "--port",
        type=_non_negative_int,
        default=9092,
        help="port of broker 0; broker N gets PORT+N (default 9092; 0: any free ports)",
    )
    up.add_argument("--config", type=_key_value, action="append", default=[], metavar="KEY=VALUE")
    up.add_argument("--timeout", type=_positive_float, default=90.0, help="seconds to wait for the brokers")
    down = dev_sub.add_parser("down", help="stop the dev cluster (its data is kept)")
    down.add_argument("--data", metavar="DIR")
    status = dev_sub.add_parser("status", help="show the dev cluster's processes and health")
    status.add_argument("--data", metavar="DIR")
    status.add_argument("--json", action="store_true", help="machine-readable output")

    # topics
    topics = sub.add_parser("topics", help="create, list, describe and delete topics")
    t_sub = topics.add_subparsers(dest="topics_command", metavar="ACTION", required=True)
    create = t_sub.add_parser("create", parents=[client], help="create a topic")
    create.add_argument("topic")
    create.add_argument("--partitions", type=_positive_int, help="default: the broker's num.partitions")
    create.add_argument(
        "--replication-factor", type=_positive_int, help="default: the broker's default.replication.factor"
    )
    create.add_argument(
        "--config", type=_key_value, action="append", default=[], metavar="KEY=VALUE", help="e.g. retention.ms=-1"
    )
    t_list = t_sub.add_parser("list", parents=[client], help="list topics")
    t_list.add_argument("--json", action="store_true")
    describe = t_sub.add_parser("describe", parents=[client], help="partitions, leaders, replicas, config")
    describe.add_argument("topics", nargs="+", metavar="TOPIC")
    describe.add_argument("--json", action="store_true")
    delete = t_sub.add_parser("delete", parents=[client], help="delete topics")
    delete.add_argument("topics", nargs="+", metavar="TOPIC")

    # produce
    produce = sub.add_parser(
        "produce", parents=[client], help="send stdin to a topic, one record per line (Ctrl-D ends)"
    )
    produce.add_argument("topic")
    produce.add_argument(
        "--key-separator", type=_separator, metavar="SEP", help="lines are KEY<SEP>VALUE (e.g. ':' or '\\t')"
    )
    produce.add_argument(
        "--header", type=_key_value, action="append", default=[], metavar="KEY=VALUE", help="added to every record"
    )
    produce.add_argument("--transactional-id", metavar="ID", help="send all of stdin in one transaction")
    produce.add_argument("--acks", type=_acks, default="all", help="all (default), 1 or 0")
    produce.add_argument("--partition", type=_non_negative_int, help="default: by key hash, else spread")
    produce.add_argument("--compression", type=_compression, default=None, help="none, gzip, lz4 or zstd")
    produce.add_argument("--linger-ms", type=_non_negative_int, default=5)

    # consume
    consume = sub.add_parser("consume", parents=[client], help="print a topic's records to stdout")
    consume.add_argument("topic")
    consume.add_argument("--from-beginning", action="store_true", help="start at the oldest record")
    consume.add_argument(
        "--isolation-level",
        choices=ISOLATION_LEVELS,
        default="read_committed",
        help="read_committed (default: Sluice's default, unlike Kafka) or read_uncommitted",
    )
    consume.add_argument("--max-messages", type=_positive_int, help="exit after this many records")
    consume.add_argument(
        "--timeout", type=_positive_float, metavar="SECONDS", help="exit when no record arrives for this long"
    )
    consume.add_argument("--group", help="consumer group (committed at exit; default: a throw-away group)")
    consume.add_argument("--no-commit", action="store_true", help="with --group: do not commit offsets")
    consume.add_argument("--partition", type=_non_negative_int, help="read only this partition (no group)")
    consume.add_argument("--offset", help="with --partition: an offset, 'earliest' or 'latest'")
    consume.add_argument("--print-key", action="store_true")
    consume.add_argument("--print-headers", action="store_true")
    consume.add_argument("--print-offset", action="store_true", help="print partition and offset")
    consume.add_argument("--print-timestamp", action="store_true")
    consume.add_argument("--separator", type=_separator, default="\t", help="between printed fields (default tab)")

    # transactions
    txns = sub.add_parser("transactions", help="list and describe transactional ids")
    x_sub = txns.add_subparsers(dest="transactions_command", metavar="ACTION", required=True)
    x_list = x_sub.add_parser("list", parents=[client], help="transactional ids and their state")
    x_list.add_argument("--state", action="append", default=[], help="only this state (repeatable)")
    x_list.add_argument(
        "--prepared", action="store_true", help="only prepared transactions, with the epoch that ends them"
    )
    x_list.add_argument("--json", action="store_true")
    x_desc = x_sub.add_parser("describe", parents=[client], help="one transactional id in detail")
    x_desc.add_argument("transactional_ids", nargs="+", metavar="ID")
    x_desc.add_argument("--json", action="store_true")
    for action, what in (("commit", "commit"), ("abort", "abort")):
        x_end = x_sub.add_parser(
            action, parents=[client], help=f"{what} a prepared transaction with its handle (id, producer id, epoch)"
        )
        x_end.add_argument("transactional_id", metavar="ID")
        x_end.add_argument("--producer-id", type=int, required=True)
        x_end.add_argument("--producer-epoch", type=int, required=True)

    # bench
    bench = sub.add_parser("bench", help="measure throughput and latency")
    b_sub = bench.add_subparsers(dest="bench_command", metavar="KIND", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--bootstrap-server",
        metavar="HOST:PORT[,...]",
        help="cluster to measure (default: a fresh local cluster of --brokers brokers in a temporary directory)",
    )
    common.add_argument(
        "--brokers",
        type=_positive_int,
        default=1,
        help="brokers of the fresh local cluster (default 1; 3 measures replication factor 3, min.insync.replicas 2)",
    )
    common.add_argument("--record-size", type=_positive_int, default=1024, help="bytes per record (default 1024)")
    common.add_argument("--count", type=_positive_int, default=100_000, help="records (default 100000)")
    common.add_argument("--partitions", type=_positive_int, default=3, help="partitions of the bench topic")
    common.add_argument("--max-seconds", type=_positive_float, default=120.0, help="stop after this long")
    common.add_argument(
        "--output",
        default=None,
        metavar="FILE",
        help="JSON file the result is appended to (default bench/results/results.json)",
    )
    common.add_argument("--no-progress", action="store_true")
    producing = argparse.ArgumentParser(add_help=False)
    producing.add_argument("--acks", type=_acks, default="all")
    producing.add_argument("--compression", type=_compression, default=None)
    producing.add_argument("--linger-ms", type=_non_negative_int, default=5)
    producing.add_argument("--batch-size", type=_positive_int, default=262144)
    b_prod = b_sub.add_parser("produce", parents=[common, producing], help="producer throughput")
    b_prod.add_argument("--no-idempotence", action="store_true")
    b_txn = b_sub.add_parser("transactions", parents=[common, producing], help="transactional producer throughput")
    b_txn.add_argument("--commit-interval-ms", type=_positive_int, default=100, help="default 100")
    b_cons = b_sub.add_parser("consume", parents=[common], help="consumer throughput (fills the topic first)")
    b_cons.add_argument("--isolation-level", choices=ISOLATION_LEVELS, default="read_committed")
    b_cons.add_argument("--plain-data", action="store_true", help="fill without transactions")
    b_lat = b_sub.add_parser("latency", parents=[common, producing], help="produce latency at a steady rate")
    b_lat.add_argument("--rate-mb-s", type=_positive_float, default=10.0, help="MB/s to send (default 10)")
    b_lat.add_argument("--seconds", type=_positive_float, default=30.0, help="measured duration (default 30)")

    # demo
    demo = sub.add_parser("demo", help="exactly-once copy of a topic through transactions, verified")
    demo.add_argument("--records", type=_positive_int, default=2000)
    demo.add_argument("--partitions", type=_positive_int, default=3)
    demo.add_argument("--txn-size", type=_positive_int, default=100, help="records per transaction at most")
    demo.add_argument(
        "--abort-every",
        type=_non_negative_int,
        default=4,
        help="abort every Nth transaction on purpose and redo it (default 4; 0: never; not 1)",
    )
    demo.add_argument("--brokers", type=_positive_int, default=3)
    demo.add_argument(
        "--no-chaos",
        action="store_true",
        help="do not kill and restart a broker and the copier while copying",
    )
    demo.add_argument("--data", metavar="DIR", help="keep the cluster's data and logs here (default: temporary)")
    demo.add_argument("--timeout", type=_positive_float, default=600.0)
    demo.add_argument("--no-progress", action="store_true")
    return parser


# -- helpers ------------------------------------------------------------------------------------


def _err(message: str) -> None:
    print(f"sluice: {message}", file=sys.stderr)


def resolve_bootstrap(explicit: str | None) -> tuple[str, str]:
    """(bootstrap servers, where they came from), in the order the module docstring gives."""
    if explicit:
        return explicit, "--bootstrap-server"
    env = os.environ.get(ENV_BOOTSTRAP, "").strip()
    if env:
        return env, f"${ENV_BOOTSTRAP}"
    from sluice.testing import dev

    state = dev.running_state(dev.resolve_data_dir(None))
    if state is not None and state.bootstrap_servers:
        return state.bootstrap_servers, f"the dev cluster in {state.data_dir}"
    return DEFAULT_BOOTSTRAP, "the default"


def _require_cluster(servers: str, source: str) -> None:
    """Fail in one line unless some broker of ``servers`` answers its health check."""
    from sluice.testing import check_health

    addresses = [a.strip() for a in servers.split(",") if a.strip()]
    if not addresses:
        raise CliError("empty --bootstrap-server", 2)
    statuses = {a: check_health(a, timeout=2.0) for a in addresses}
    if any(s == "SERVING" for s in statuses.values()):
        return
    detail = ", ".join(f"{a} {s.lower()}" for a, s in statuses.items())
    raise CliError(
        f"no Sluice broker is ready at {servers} ({source}: {detail}). "
        "Start a local cluster with `sluice dev up`, or pass --bootstrap-server HOST:PORT."
    )


def _bootstrap(args: argparse.Namespace) -> str:
    servers, source = resolve_bootstrap(getattr(args, "bootstrap_server", None))
    _require_cluster(servers, source)
    return servers


def _client() -> Any:
    try:
        return importlib.import_module("sluice.client")
    except ImportError as exc:
        raise CliError(f"the Sluice client cannot be imported ({exc}); is the package installed?") from exc


def _get(obj: Any, *names: str, default: Any = None) -> Any:
    """A field by any of ``names``, from an object or a mapping."""
    for name in names:
        if isinstance(obj, Mapping):
            if name in obj:
                return obj[name]
        elif hasattr(obj, name):
            return getattr(obj, name)
    return default


def to_plain(obj: Any) -> Any:
    """Client results (dataclasses, protobuf messages, enums, TopicPartitions ...) as JSON-able values."""
    if obj is None or isinstance(obj, str | int | float | bool):
        return obj
    if isinstance(obj, bytes):
        return obj.decode("utf-8", errors="replace")
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if hasattr(obj, "DESCRIPTOR") and hasattr(obj, "ListFields"):
        from google.protobuf.json_format import MessageToDict

        return MessageToDict(obj, preserving_proto_field_name=True)
    if isinstance(obj, Mapping):
        return {str(to_plain(k)) if not isinstance(k, str) else k: to_plain(v) for k, v in obj.items()}
    if isinstance(obj, Iterable):
        return [to_plain(v) for v in obj]
    if hasattr(obj, "name") and hasattr(obj, "value") and type(obj).__module__ == "enum":
        return obj.name
    if hasattr(obj, "__dict__"):
        return {k: to_plain(v) for k, v in vars(obj).items() if not k.startswith("_")}
    return str(obj)


def _print_json(obj: Any) -> None:
    print(json.dumps(to_plain(obj), indent=2, sort_keys=True))


def _table(rows: Sequence[Sequence[Any]], header: Sequence[str]) -> str:
    cells = [list(header)] + [["" if c is None else str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells)


def _close(obj: Any) -> None:
    close = getattr(obj, "close", None)
    if callable(close):
        try:
            close()
        except Exception as exc:  # closing must not hide the command's own outcome
            _err(f"warning: closing {type(obj).__name__} failed: {exc}")


def _check_topic(admin: Any, topic: str) -> Any:
    """The topic's description, or a one-line error if it does not exist."""
    errors = importlib.import_module("sluice.errors")
    try:
        desc = admin.describe_topic(topic)
    except errors.UnknownTopicOrPartitionError:
        raise CliError(f"unknown topic {topic!r} (create it with `sluice topics create {topic}`)") from None
    code = _get(desc, "error_code", default=0) or 0
    if code == errors.ErrorCode.Value("UNKNOWN_TOPIC_OR_PARTITION"):
        raise CliError(f"unknown topic {topic!r} (create it with `sluice topics create {topic}`)")
    errors.check(int(code), str(_get(desc, "error_message", default="")))
    return desc


def _partitions_of(desc: Any) -> list[Any]:
    parts = _get(desc, "partitions", default=[]) or []
    return sorted(parts, key=lambda p: int(_get(p, "partition", "id", default=0)))


# -- commands: broker, dev ----------------------------------------------------------------------


def cmd_broker(argv: Sequence[str]) -> int:
    broker_main = importlib.import_module("sluice.broker.main")
    result = broker_main.main(list(argv))
    return int(result or 0)


def cmd_operator(argv: Sequence[str]) -> int:
    operator_main = importlib.import_module("sluice.operator.main")
    return int(operator_main.main(list(argv)) or 0)


def cmd_dev(args: argparse.Namespace) -> int:
    from sluice.testing import dev

    data_dir = (
        dev.resolve_data_dir(args.data)
        if args.dev_command != "up"
        else (Path(args.data).expanduser().resolve() if args.data else dev.default_data_dir())
    )
    if args.dev_command == "up":
        last = [0.0]

        def waiting(elapsed: float) -> None:
            if elapsed - last[0] >= 5.0:
                last[0] = elapsed
                _err(f"waiting for {args.brokers} broker(s) to be ready... {elapsed:.0f}s")

        _err(f"starting a dev cluster of {args.brokers} broker(s) in {data_dir} ...")
        try:
            state, started = dev.up(
                data_dir, args.brokers, args.port, dict(args.config), timeout=args.timeout, on_wait=waiting
            )
        except dev.DevClusterError as exc:
            hint = " (use --port to pick other ports, or --port 0 for any free ones)" if "in use" in str(exc) else ""
            raise CliError(f"the dev cluster failed to start{hint}: {exc}") from None
        if not started:
            _err(f"a dev cluster is already running (supervisor pid {state.supervisor_pid}, data {state.data_dir})")
        else:
            _err(f"dev cluster up: {len(state.brokers)} broker(s), logs in {state.data_dir}")
            _err("stop it with `sluice dev down`")
        print(state.bootstrap_servers)
        return 0
    if args.dev_command == "down":
        stopped = dev.down(data_dir)
        if stopped is None:
            _err(f"no dev cluster is running (data directory {data_dir})")
        else:
            _err(f"dev cluster stopped (data kept in {stopped.data_dir})")
        return 0
    # status
    current = dev.running_state(data_dir)
    if current is None:
        if args.json:
            _print_json({"running": False, "data_dir": str(data_dir)})
        else:
            _err(f"no dev cluster is running (data directory {data_dir}); start one with `sluice dev up`")
        return 1
    from sluice.testing import check_health

    brokers = []
    for b in current.brokers:
        alive = dev.pid_alive(int(b.get("pid") or 0))
        health = check_health(b["address"], timeout=2.0) if alive else "DOWN"
        brokers.append({**b, "alive": alive, "health": health})
    healthy = all(b["health"] == "SERVING" for b in brokers)
    if args.json:
        _print_json({"running": True, "healthy": healthy, **dataclasses.asdict(current), "brokers": brokers})
    else:
        print(f"dev cluster: supervisor pid {current.supervisor_pid}, data {current.data_dir}")
        print(f"bootstrap servers: {current.bootstrap_servers}")
        rows = [[b["id"], b["address"], b.get("pid"), b["health"], b.get("log", "")] for b in brokers]
        print(_table(rows, ["BROKER", "ADDRESS", "PID", "HEALTH", "LOG"]))
    return 0 if healthy else 1


# -- commands: topics ---------------------------------------------------------------------------


def cmd_topics(args: argparse.Namespace) -> int:
    bootstrap = _bootstrap(args)
    admin = _client().Admin(bootstrap_servers=bootstrap)
    try:
        if args.topics_command == "create":
            kwargs: dict[str, Any] = {"config": dict(args.config)}
            if args.partitions is not None:
                kwargs["partitions"] = args.partitions
            if args.replication_factor is not None:
                kwargs["replication_factor"] = args.replication_factor
            admin.create_topic(args.topic, **kwargs)
            _err(f"created topic {args.topic}")
        elif args.topics_command == "list":
            topics = admin.list_topics()
            names = sorted(t if isinstance(t, str) else str(_get(t, "name", "topic", default=t)) for t in topics)
            if args.json:
                _print_json(names)
            else:
                for name in names:
                    print(name)
        elif args.topics_command == "describe":
            descs = [_check_topic(admin, t) for t in args.topics]
            if args.json:
                _print_json(descs if len(descs) > 1 else descs[0])
            else:
                print("\n".join(_render_topic(name, d) for name, d in zip(args.topics, descs, strict=True)))
        elif args.topics_command == "delete":
            for topic in args.topics:
                _check_topic(admin, topic)
                admin.delete_topic(topic)
                _err(f"deleted topic {topic}")
    finally:
        _close(admin)
    return 0


def _render_topic(name: str, desc: Any) -> str:
    parts = _partitions_of(desc)
    config = _get(desc, "config", "configs", default={}) or {}
    cfg = ",".join(f"{k}={v}" for k, v in sorted(dict(config).items()))
    rf = _get(desc, "replication_factor", default=None)
    if not rf and parts:
        rf = len(_get(parts[0], "replicas", default=[]) or [])
    head = (
        f"Topic: {name}\tTopicId: {_get(desc, 'topic_id', default='')}\tPartitionCount: {len(parts)}"
        f"\tReplicationFactor: {rf}\tConfigs: {cfg}"
    )
    lines = [head]
    for p in parts:

        def ids(field: str, part: Any = p) -> str:
            return ",".join(str(i) for i in (_get(part, field, default=[]) or []))

        lines.append(
            f"\tTopic: {name}\tPartition: {_get(p, 'partition', 'id')}\tLeader: {_get(p, 'leader')}"
            f"\tLeaderEpoch: {_get(p, 'leader_epoch', default='')}\tReplicas: {ids('replicas')}\tIsr: {ids('isr')}"
        )
    return "\n".join(lines)


# -- commands: produce, consume -----------------------------------------------------------------


def _split_line(line: bytes, sep: bytes | None, lineno: int) -> tuple[bytes | None, bytes]:
    if sep is None:
        return None, line
    key, found, value = line.partition(sep)
    if not found:
        raise CliError(f"line {lineno} has no key separator {sep.decode()!r}: {line[:60]!r}")
    return key, value


def cmd_produce(args: argparse.Namespace) -> int:
    bootstrap = _bootstrap(args)
    client = _client()
    admin = client.Admin(bootstrap_servers=bootstrap)
    try:
        desc = _check_topic(admin, args.topic)
    finally:
        _close(admin)
    if args.partition is not None and args.partition >= len(_partitions_of(desc) or [None]):
        raise CliError(f"topic {args.topic!r} has no partition {args.partition}")
    producer = client.Producer(
        bootstrap_servers=bootstrap,
        transactional_id=args.transactional_id,
        acks=args.acks,
        enable_idempotence=args.acks == "all",
        linger_ms=args.linger_ms,
        compression=args.compression,
    )
    headers = [(k, v.encode()) for k, v in args.header] or None
    sep = args.key_separator.encode() if args.key_separator else None
    pending: deque[Any] = deque()
    sent = 0
    in_txn = False
    stdin = sys.stdin.buffer
    if sys.stdin.isatty():
        _err(f"type records for {args.topic}, one per line; Ctrl-D to finish")

    def check_done(block: bool) -> None:
        while pending and (block or pending[0].done()):
            pending.popleft().result()  # raises the record's error, if any

    try:
        if args.transactional_id:
            producer.init_transactions()
            producer.begin_transaction()
            in_txn = True
        for lineno, raw in enumerate(stdin, 1):
            line = raw.rstrip(b"\n").rstrip(b"\r")
            key, value = _split_line(line, sep, lineno)
            pending.append(producer.send(args.topic, value=value, key=key, partition=args.partition, headers=headers))
            sent += 1
            if len(pending) > 10_000:
                check_done(block=False)
        producer.flush()
        check_done(block=True)
        if in_txn:
            producer.commit_transaction()
            in_txn = False
    except BaseException:
        if in_txn:
            try:
                producer.abort_transaction()
                _err(f"transaction {args.transactional_id} aborted: none of the {sent} records is visible")
            except Exception as exc:
                _err(f"aborting transaction {args.transactional_id} failed: {exc}")
        elif sent:
            _err(f"{sent} record(s) were sent before the error")
        raise
    finally:
        _close(producer)
    how = f" in transaction {args.transactional_id}" if args.transactional_id else ""
    _err(f"produced {sent} record(s) to {args.topic}{how}")
    return 0


def _format_record(rec: Any, args: argparse.Namespace) -> bytes:
    sep: bytes = args.separator.encode()
    fields: list[bytes] = []
    if args.print_timestamp:
        fields.append(f"CreateTime:{rec.timestamp}".encode())
    if args.print_offset:
        fields.append(f"{rec.partition}:{rec.offset}".encode())
    if args.print_headers:
        hdrs = rec.headers or []
        fields.append(b",".join(k.encode() + b"=" + (v or b"") for k, v in hdrs) if hdrs else b"NO_HEADERS")
    if args.print_key:
        fields.append(b"null" if rec.key is None else rec.key)
    fields.append(b"null" if rec.value is None else bytes(rec.value))
    return sep.join(fields) + b"\n"


def cmd_consume(args: argparse.Namespace) -> int:
    if args.offset is not None and args.partition is None:
        raise CliError("--offset needs --partition", 2)
    if args.partition is not None and args.group:
        raise CliError("--partition reads outside any group: do not combine it with --group", 2)
    bootstrap = _bootstrap(args)
    client = _client()
    admin = client.Admin(bootstrap_servers=bootstrap)
    try:
        desc = _check_topic(admin, args.topic)
    finally:
        _close(admin)
    nparts = len(_partitions_of(desc))
    if args.partition is not None and args.partition >= nparts:
        raise CliError(f"topic {args.topic!r} has no partition {args.partition} (it has {nparts})")
    group = args.group or f"sluice-console-{uuid.uuid4().hex[:12]}"
    consumer = client.Consumer(
        bootstrap_servers=bootstrap,
        group_id=group,
        isolation_level=args.isolation_level,
        auto_offset_reset="earliest" if args.from_beginning else "latest",
        enable_auto_commit=False,
    )
    out = sys.stdout.buffer
    count = 0
    try:
        if args.partition is not None:
            tp = client.TopicPartition(args.topic, args.partition)
            consumer.assign([tp])
            where = args.offset or ("earliest" if args.from_beginning else "latest")
            if where == "earliest":
                consumer.seek(tp, consumer.beginning_offsets([tp])[tp])
            elif where == "latest":
                consumer.seek(tp, consumer.end_offsets([tp])[tp])
            else:
                try:
                    consumer.seek(tp, int(where))
                except ValueError:
                    raise CliError(f"--offset must be an integer, 'earliest' or 'latest', got {where!r}", 2) from None
        else:
            consumer.subscribe([args.topic])
        last_record = time.monotonic()
        while args.max_messages is None or count < args.max_messages:
            wait = 1.0
            if args.timeout is not None:
                left = args.timeout - (time.monotonic() - last_record)
                if left <= 0:
                    break
                wait = min(wait, left)
            records = consumer.poll(timeout=wait)
            if records:
                last_record = time.monotonic()
            for rec in records:
                out.write(_format_record(rec, args))
                count += 1
                if args.max_messages is not None and count >= args.max_messages:
                    break
            out.flush()
        if args.group and not args.no_commit and count:
            consumer.commit()
    except KeyboardInterrupt:
        pass
    finally:
        _close(consumer)
        _err(f"processed a total of {count} messages")
    return 0


# -- commands: transactions ---------------------------------------------------------------------


def cmd_transactions(args: argparse.Namespace) -> int:
    bootstrap = _bootstrap(args)
    admin = _client().Admin(bootstrap_servers=bootstrap)
    try:
        if args.transactions_command == "list":
            txns = list(admin.list_transactions())
            states = [*args.state, *(["Prepared"] if args.prepared else [])]
            if states:
                wanted = {s.lower() for s in states}
                txns = [t for t in txns if str(_get(t, "state", default="")).lower() in wanted]
            if args.json:
                _print_json(txns)
            else:
                rows = [
                    [
                        _get(t, "transactional_id"),
                        _get(t, "producer_id"),
                        _get(t, "producer_epoch", default=-1),
                        _get(t, "state"),
                        _get(t, "coordinator_id"),
                    ]
                    for t in txns
                ]
                print(_table(rows, ["TRANSACTIONAL_ID", "PRODUCER_ID", "EPOCH", "STATE", "COORDINATOR"]))
        elif args.transactions_command in ("commit", "abort"):
            handle = _client().PreparedTransaction(args.transactional_id, args.producer_id, args.producer_epoch)
            if args.transactions_command == "commit":
                admin.commit_prepared_transaction(handle)
            else:
                admin.abort_prepared_transaction(handle)
            verb = "committed" if args.transactions_command == "commit" else "aborted"
            print(
                f"{verb} the prepared transaction of {args.transactional_id} "
                f"(producer {args.producer_id} epoch {args.producer_epoch})"
            )
        else:
            errors = importlib.import_module("sluice.errors")
            found: list[Any] = []
            failed: list[dict[str, str]] = []
            for txn_id in args.transactional_ids:  # one by one: an unknown id must not hide the others
                try:
                    found.extend(admin.describe_transactions([txn_id]))
                except errors.SluiceError as exc:
                    failed.append({"transactional_id": txn_id, "error": _describe_error(exc)})
            if args.json:
                _print_json([*found, *failed])
            else:
                print("\n\n".join(_render_txn(s) for s in found))
            for f in failed:
                _err(f"error: {f['transactional_id']}: {f['error']}")
            return 1 if failed else 0
    finally:
        _close(admin)
    return 0


def _render_txn(s: Any) -> str:
    def when(ms: Any) -> str:
        if ms is None or int(ms) < 0:
            return "-"
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(int(ms) / 1000)) + f" ({int(ms)})"

    parts = _get(s, "partitions", default=[]) or []
    names = ", ".join(f"{_get(p, 'topic')}-{_get(p, 'partition')}" for p in parts) or "-"
    code = _get(s, "error_code", default=0) or 0
    lines = [f"TransactionalId:      {_get(s, 'transactional_id')}"]
    if code:
        errors = importlib.import_module("sluice.errors")
        msg = _get(s, "error_message", default="")
        lines.append(f"Error:                {errors.error_class(int(code)).__name__} {msg}".rstrip())
        return "\n".join(lines)
    lines += [
        f"State:                {_get(s, 'state')}",
        f"ProducerId:           {_get(s, 'producer_id')}",
        f"ProducerEpoch:        {_get(s, 'producer_epoch')}",
        f"Coordinator:          {_get(s, 'coordinator_id')}",
        f"TransactionTimeoutMs: {_get(s, 'transaction_timeout_ms')}",
        f"TransactionStart:     {when(_get(s, 'transaction_start_time_ms'))}",
        f"LastUpdate:           {when(_get(s, 'last_update_time_ms'))}",
        f"Partitions:           {names}",
    ]
    return "\n".join(lines)


# -- commands: bench, demo ----------------------------------------------------------------------


def cmd_bench(args: argparse.Namespace) -> int:
    from sluice.testing import bench

    progress = not args.no_progress
    output = Path(args.output) if args.output else bench.DEFAULT_RESULTS
    if args.bootstrap_server:
        _require_cluster(args.bootstrap_server, "--bootstrap-server")
    else:
        _err(f"starting a fresh local cluster of {args.brokers} broker(s) for the benchmark ...")
    with bench.bench_cluster(args.bootstrap_server, brokers=args.brokers) as bootstrap:
        kind = args.bench_command
        if kind in ("produce", "transactions"):
            result = bench.produce(
                bootstrap,
                name=f"{kind}-{args.record_size}B",
                record_size=args.record_size,
                count=args.count,
                max_seconds=args.max_seconds,
                acks=args.acks,
                idempotent=not getattr(args, "no_idempotence", False),
                compression=args.compression,
                linger_ms=args.linger_ms,
                batch_size=args.batch_size,
                partitions=args.partitions,
                commit_interval_ms=args.commit_interval_ms if kind == "transactions" else None,
                progress=progress,
            )
        elif kind == "consume":
            result = bench.consume(
                bootstrap,
                name=f"consume-{args.isolation_level}-{args.record_size}B",
                record_size=args.record_size,
                count=args.count,
                isolation_level=args.isolation_level,
                transactional_data=not args.plain_data,
                partitions=args.partitions,
                max_seconds=args.max_seconds,
                progress=progress,
            )
        else:
            result = bench.latency(
                bootstrap,
                name=f"latency-{args.rate_mb_s:g}MBps-{args.record_size}B",
                record_size=args.record_size,
                rate_mb_s=args.rate_mb_s,
                seconds=args.seconds,
                acks=args.acks,
                linger_ms=args.linger_ms,
                partitions=args.partitions,
                progress=progress,
            )
    path = bench.append_result(output, result)
    print(result.summary())
    _err(f"result appended to {path}")
    return 1 if result.error else 0


def cmd_demo(args: argparse.Namespace) -> int:
    from sluice.testing.demo import run_demo

    if args.abort_every == 1:
        raise CliError("--abort-every 1 would abort every transaction, including the redo: use 0 or >= 2", 2)
    report = run_demo(
        records=args.records,
        partitions=args.partitions,
        txn_size=args.txn_size,
        abort_every=args.abort_every,
        brokers=args.brokers,
        chaos=not args.no_chaos,
        data_dir=args.data,
        timeout=args.timeout,
        progress=not args.no_progress,
        out=sys.stdout,
    )
    return 0 if report.exactly_once else 1


# -- entry point --------------------------------------------------------------------------------

COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "dev": cmd_dev,
    "topics": cmd_topics,
    "produce": cmd_produce,
    "consume": cmd_consume,
    "transactions": cmd_transactions,
    "bench": cmd_bench,
    "demo": cmd_demo,
}


def _describe_error(exc: BaseException) -> str:
    code_name = getattr(exc, "code_name", None)
    if code_name and code_name != "CLIENT_ERROR":
        return f"{code_name}: {exc}"
    return f"{type(exc).__name__}: {exc}"


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list and args_list[0] == "broker":
        # Everything after `broker` belongs to the broker's own parser (and its --help).
        return cmd_broker(args_list[1:])
    if args_list and args_list[0] == "operator":
        return cmd_operator(args_list[1:])
    parser = build_parser()
    args = parser.parse_args(args_list)
    try:
        return COMMANDS[args.command](args)
    except CliError as exc:
        _err(f"error: {exc}")
        return exc.code
    except KeyboardInterrupt:
        _err("interrupted")
        return 130
    except BrokenPipeError:
        # `sluice consume ... | head`: the reader left; that is not an error of ours.
        _silence_stdout()
        return 0
    except Exception as exc:
        if os.environ.get("SLUICE_DEBUG"):
            raise
        errors = importlib.import_module("sluice.errors")
        if isinstance(exc, errors.SluiceError | ValueError | OSError):
            _err(f"error: {_describe_error(exc)}")
            return 1
        if type(exc).__module__.startswith("grpc"):
            _err(f"error: the cluster did not answer: {exc}")
            return 1
        raise


def _silence_stdout() -> None:
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except OSError:
        pass


if __name__ == "__main__":
    sys.exit(main())
