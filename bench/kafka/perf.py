"""Kafka's own performance tools, run with the parameters of Sluice's benchmark set.

``ProducerPerformance`` and ``ConsumerPerformance`` (from ``kafka-tools``) each run in a JVM of
their own; their last lines are parsed into :class:`sluice.cli.engines.bench.BenchResult`, the
record Sluice's benchmarks return, so both systems' figures are computed the same way (MB = 10^6
bytes: the tools print MiB, so MB/s is recomputed from records and bytes).

What each run sets, to match ``sluice.cli.engines.bench``:

* producer: ``acks=all``, ``enable.idempotence=true``, ``linger.ms=5``, ``batch.size=262144``,
  ``compression.type=none``, max in flight 5, the same timeouts as Sluice's producer defaults;
* values: the 64 values ``bench.make_values(size)`` makes (same bytes), given as
  ``--payload-file`` so the tool does not generate random bytes inside its timed loop;
* transactions: ``--transactional-id`` and ``--transaction-duration-ms 100`` (a commit once
  100 ms have passed, as Sluice's bench);
* consume: read_committed, earliest, no auto commit, ``max.poll.records=500``; the figure is
  ``fetch.time.ms`` (the tool's time minus its group join), the closest to Sluice's "first poll
  to last record";
* latency: ``--throughput`` records/s = 10 MB/s of 1 KiB records, the first 2 s as
  ``--warmup-records``; the figure is the tool's "steady state" line (whole milliseconds).

Known differences that remain (docs/performance.md lists them): JVM versus Python clients, the
tool's millisecond latency resolution and its 2 ms throttle sleeps, its group join.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import re
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.kafka.cluster import KafkaError, java_command
from sluice.cli.engines import bench

PRODUCER_SETTINGS = {
    "acks": "all",
    "enable.idempotence": "true",
    "linger.ms": "5",
    "batch.size": "262144",
    "compression.type": "none",
    "max.in.flight.requests.per.connection": "5",
    "delivery.timeout.ms": "120000",
    "request.timeout.ms": "30000",
    "max.request.size": "1048576",
    "retry.backoff.ms": "100",
}
CONSUMER_SETTINGS = {
    "isolation.level": "read_committed",
    "auto.offset.reset": "earliest",
    "enable.auto.commit": "false",
    "max.poll.records": "500",
    "fetch.min.bytes": "1",
    "fetch.max.wait.ms": "500",
    "fetch.max.bytes": "52428800",
}

# ProducerPerformance's summary line; " steady state" marks the one after --warmup-records.
_TOTAL = re.compile(
    r"^(?P<count>\d+)(?P<steady> steady state)? records sent, (?P<rps>[\d.]+) records/sec "
    r"\([\d.]+ MB/sec\), (?P<avg>[\d.]+) ms avg latency, (?P<max>[\d.]+) ms max latency, "
    r"(?P<p50>\d+) ms 50th, (?P<p95>\d+) ms 95th, (?P<p99>\d+) ms 99th, (?P<p999>\d+) ms 99.9th"
)


@dataclass(frozen=True)
class ProducerSummary:
    records: int
    records_per_s: float
    latency_ms: dict[str, float]


def parse_producer(text: str, *, steady: bool = False) -> ProducerSummary | None:
    """The last summary line of ProducerPerformance's output (the steady-state one with ``steady``)."""
    found: ProducerSummary | None = None
    for line in text.splitlines():
        m = _TOTAL.match(line.strip())
        if m and bool(m.group("steady")) == steady:
            lat = {k: float(m.group(k)) for k in ("p50", "p95", "p99", "max", "avg")}
            lat["p99.9"] = float(m.group("p999"))
            found = ProducerSummary(int(m.group("count")), float(m.group("rps")), lat)
    return found


def parse_consumer(text: str) -> dict[str, str] | None:
    """ConsumerPerformance's result as {column: value}: the header line and the line after it."""
    lines = [ln.strip() for ln in text.splitlines()]
    for i, line in enumerate(lines[:-1]):
        if line.startswith("start.time"):
            keys = [k.strip() for k in line.split(",")]
            values = [v.strip() for v in lines[i + 1].split(",")]
            if len(keys) == len(values):
                return dict(zip(keys, values, strict=True))
    return None


def _props(path: Path, settings: dict[str, str]) -> Path:
    path.write_text("".join(f"{k}={v}\n" for k, v in settings.items()))
    return path


class KafkaTools:
    """Runs Kafka's tools against ``bootstrap`` with jars from ``lib``; scratch files in ``work``."""

    def __init__(self, lib: Path, bootstrap: str, work: Path, *, replication_factor: int = 1,
                 environment: dict[str, Any] | None = None, timeout: float = 600.0) -> None:  # fmt: skip
        self.lib = lib
        self.bootstrap = bootstrap
        self.work = work
        self.replication_factor = replication_factor
        self.timeout = timeout
        self.extra_env = environment or {}
        work.mkdir(parents=True, exist_ok=True)
        self.producer_config = _props(work / "producer.properties", PRODUCER_SETTINGS)
        self.consumer_config = _props(work / "consumer.properties", CONSUMER_SETTINGS)
        # perf_counter() when the last perf tool exited: the end of its timed part, give or take
        # the JVM's exit (callers count broker CPU up to here, not through the topic's deletion)
        self.tool_end = 0.0

    def run(self, main: str, args: list[str], *, heap: str = "512m", timeout: float | None = None) -> str:
        """Run one tool to completion; its stdout and stderr together. Raises on a non-zero exit."""
        cmd = java_command(self.lib, main, args, heap=heap, tool=True)
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        try:
            out, _ = proc.communicate(timeout=timeout or self.timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
            raise KafkaError(f"{main.rsplit('.', 1)[-1]} did not finish in {timeout or self.timeout:.0f}s") from None
        if "Performance" in main:
            self.tool_end = time.perf_counter()
        text = out.decode(errors="replace")
        if proc.returncode != 0:
            raise KafkaError(f"{main.rsplit('.', 1)[-1]} exited {proc.returncode}:\n{text[-2000:]}")
        return text

    def payload(self, size: int) -> Path:
        """Sluice's 64 values of ``size`` bytes, one per line (none holds a newline)."""
        path = self.work / f"payload-{size}.txt"
        if not path.exists():
            path.write_bytes(b"\n".join(bench.make_values(size)) + b"\n")
        return path

    def create_topic(self, prefix: str, partitions: int = 3) -> str:
        name = f"{prefix}-{uuid.uuid4().hex[:8]}"
        self.run("org.apache.kafka.tools.TopicCommand",
                 ["--bootstrap-server", self.bootstrap, "--create", "--topic", name, "--partitions", str(partitions),
                  "--replication-factor", str(self.replication_factor)], heap="256m")  # fmt: skip
        return name

    def delete_topic(self, name: str) -> None:
        self.run("org.apache.kafka.tools.TopicCommand",
                 ["--bootstrap-server", self.bootstrap, "--delete", "--topic", name], heap="256m")  # fmt: skip

    def _result(self, name: str, kind: str, params: dict[str, Any]) -> bench.BenchResult:
        env = bench.environment()
        env.update({"system": "kafka", **self.extra_env})  # extra_env may name the system (Sluice's listener)
        return bench.BenchResult(
            name=name, kind=kind, params=params, environment=env,
            started_at=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        )  # fmt: skip

    def produce(self, *, name: str, record_size: int, count: int, partitions: int = 3,
                commit_interval_ms: int | None = None, topic: str | None = None) -> bench.BenchResult:  # fmt: skip
        """ProducerPerformance at full speed; transactional when ``commit_interval_ms`` is set."""
        params: dict[str, Any] = {"record_size": record_size, "count": count, "acks": "all", "idempotent": True,
                                  "compression": None, "linger_ms": 5, "batch_size": 262144,
                                  "partitions": partitions, "commit_interval_ms": commit_interval_ms}  # fmt: skip
        result = self._result(name, "transactions" if commit_interval_ms else "produce", params)
        own_topic = topic is None
        topic = topic or self.create_topic(f"bench-{name}", partitions)
        args = ["--bootstrap-server", self.bootstrap, "--topic", topic, "--num-records", str(count),
                "--throughput", "-1", "--payload-file", str(self.payload(record_size)),
                "--command-config", str(self.producer_config), "--print-metrics"]  # fmt: skip
        if commit_interval_ms:
            args += ["--transactional-id", f"bench-{uuid.uuid4().hex[:8]}",
                     "--transaction-duration-ms", str(commit_interval_ms)]  # fmt: skip
        try:
            out = self.run("org.apache.kafka.tools.ProducerPerformance", args)
            s = parse_producer(out)
            if s is None:
                result.error = "no summary line from ProducerPerformance"
                return result
            seconds = s.records / s.records_per_s if s.records_per_s > 0 else 0.0
            result.finish(s.records, s.records * record_size, seconds)
            if s.records < count:
                result.error = f"{s.records} of {count} records acknowledged"
        except KafkaError as exc:
            result.error = str(exc)
        finally:
            if own_topic:
                self._quiet_delete(topic)
        return result

    def _quiet_delete(self, topic: str) -> None:
        with contextlib.suppress(KafkaError):
            self.delete_topic(topic)

    def consume(self, *, name: str, record_size: int, count: int, partitions: int = 3,
                topic: str | None = None, fill: bool = True,
                on_timed_start: Any = None) -> bench.BenchResult:  # fmt: skip
        """Fill a fresh topic transactionally (untimed, as Sluice's ``bench.fill``), then time
        ConsumerPerformance reading ``count`` records read_committed."""
        params: dict[str, Any] = {"record_size": record_size, "count": count, "isolation_level": "read_committed",
                                  "transactional_data": True, "partitions": partitions,
                                  "max_poll_records": 500}  # fmt: skip
        result = self._result(name, "consume", params)
        own_topic = topic is None
        topic = topic or self.create_topic(f"bench-{name}", partitions)
        try:
            if fill:
                filled = self.produce(name="fill", record_size=record_size, count=count, partitions=partitions,
                                      commit_interval_ms=100, topic=topic)  # fmt: skip
                if filled.error:
                    result.error = f"filling the topic failed: {filled.error}"
                    return result
            if on_timed_start is not None:
                on_timed_start()
            out = self.run("org.apache.kafka.tools.ConsumerPerformance",
                           ["--bootstrap-server", self.bootstrap, "--topic", topic, "--num-records", str(count),
                            "--command-config", str(self.consumer_config), "--group",
                            f"bench-{uuid.uuid4().hex[:8]}", "--timeout", "60000"])  # fmt: skip
            row = parse_consumer(out)
            if row is None:
                result.error = "no result line from ConsumerPerformance"
                return result
            records = int(row["data.consumed.in.nMsg"])
            result.finish(records, records * record_size, int(row["fetch.time.ms"]) / 1000.0)
            result.notes = f"group join {row.get('rebalance.time.ms', '?')} ms not timed"
            if records < count:
                result.error = f"read {records} of {count} records"
        except KafkaError as exc:
            result.error = str(exc)
        finally:
            if own_topic:
                self._quiet_delete(topic)
        return result

    def latency(self, *, name: str, record_size: int = 1024, rate_mb_s: float = 10.0, seconds: float = 30.0,
                warmup_seconds: float = 2.0, partitions: int = 3) -> bench.BenchResult:  # fmt: skip
        """ProducerPerformance at a steady rate; percentiles of the records after the warm-up."""
        rate = rate_mb_s * 1e6 / record_size
        total, warm = int(rate * (seconds + warmup_seconds)), int(rate * warmup_seconds)
        params: dict[str, Any] = {"record_size": record_size, "rate_mb_s": rate_mb_s, "seconds": seconds,
                                  "acks": "all", "linger_ms": 5, "partitions": partitions,
                                  "warmup_seconds": warmup_seconds}  # fmt: skip
        result = self._result(name, "latency", params)
        topic = self.create_topic(f"bench-{name}", partitions)
        try:
            out = self.run("org.apache.kafka.tools.ProducerPerformance",
                           ["--bootstrap-server", self.bootstrap, "--topic", topic, "--num-records", str(total),
                            "--throughput", f"{rate:.3f}", "--warmup-records", str(warm),
                            "--payload-file", str(self.payload(record_size)),
                            "--command-config", str(self.producer_config)])  # fmt: skip
            s = parse_producer(out, steady=True)
            if s is None:
                result.error = "no steady-state line from ProducerPerformance"
                return result
            # As Sluice's bench: MB/s over the planned measured seconds.
            result.finish(s.records, s.records * record_size, seconds)
            result.latency_ms = s.latency_ms
            achieved = s.records * record_size / 1e6 / seconds
            if achieved < 0.9 * rate_mb_s:
                result.notes = f"target rate not reached: {achieved:.2f} of {rate_mb_s} MB/s"
        except KafkaError as exc:
            result.error = str(exc)
        finally:
            self._quiet_delete(topic)
        return result


def tools_for(cluster: Any, work: Path) -> KafkaTools:
    """KafkaTools for a started :class:`bench.kafka.cluster.KafkaCluster`."""
    if cluster.lib is None:
        raise KafkaError("the Kafka cluster is not started")
    env = {"kafka": cluster.version, "nodes": cluster.nodes, "jvm_heap": cluster.heap,
           "inter_broker_tls": getattr(cluster, "replication", None) is not None}  # fmt: skip
    return KafkaTools(cluster.lib, cluster.bootstrap_servers, work, replication_factor=min(cluster.nodes, 3),
                      environment=env)  # fmt: skip


def _smoke() -> None:
    """python -m bench.kafka.perf: one small run of each tool against a fresh 1-node cluster."""
    import tempfile

    from bench.kafka.cluster import KafkaCluster

    t0 = time.perf_counter()
    with KafkaCluster(nodes=int(os.environ.get("KAFKA_NODES", "1"))) as k, tempfile.TemporaryDirectory() as tmp:
        tools = tools_for(k, Path(tmp))
        print(f"started in {time.perf_counter() - t0:.1f}s at {k.bootstrap_servers}")
        for r in (tools.produce(name="produce-1KiB-acks-all", record_size=1024, count=20_000),
                  tools.produce(name="transactions-1KiB-100ms", record_size=1024, count=20_000,
                                commit_interval_ms=100),
                  tools.consume(name="consume-read_committed-1KiB", record_size=1024, count=20_000),
                  tools.latency(name="latency-10MBps-1KiB", seconds=3.0)):  # fmt: skip
            print(r.summary())


if __name__ == "__main__":
    _smoke()
