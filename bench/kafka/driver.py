"""Compile and run ``java/TxnDriver.java``: Kafka's Java client driving the transactional scale
benchmarks (many concurrent transactional producers, many transactional ids, a coordinator
probe), which Kafka's own perf tools cannot (they run one producer per JVM).

The class is compiled once with ``javac`` against the fetched ``kafka-clients`` jar into the cache
directory beside the jars (keyed by the source's hash), never into the repository.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
from pathlib import Path

from bench.kafka.cluster import KafkaError, java
from bench.kafka.fetch import classpath, kafka_home

SOURCE = Path(__file__).resolve().parent / "java" / "TxnDriver.java"
_RESULT = re.compile(r"^RESULT (.*)$", re.M)


def compiled(lib: Path) -> Path:
    """The directory holding TxnDriver.class, compiling it first when the source changed."""
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:16]
    out = kafka_home() / f"classes-{digest}"
    if (out / "TxnDriver.class").exists():
        return out
    javac = shutil.which("javac")
    if javac is None:
        raise KafkaError("javac (a JDK) is needed to build bench/kafka/java/TxnDriver.java")
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    proc = subprocess.run([javac, "-d", str(tmp), "-cp", classpath(lib), str(SOURCE)], capture_output=True,
                          text=True, timeout=300, check=False)  # fmt: skip
    if proc.returncode != 0:
        raise KafkaError(f"javac failed:\n{proc.stderr[-2000:]}")
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


def command(lib: Path, args: list[str], heap: str = "512m") -> list[str]:
    from bench.kafka.cluster import JVM_FLAGS, LOG4J

    cp = f"{compiled(lib)}:{classpath(lib)}"
    return [java(), f"-Xmx{heap}", *JVM_FLAGS, f"-Dlog4j2.configurationFile={LOG4J}",
            "-Dsluice.bench.log.target=SYSTEM_ERR", "-Dsluice.bench.log.level=WARN",
            "-cp", cp, "TxnDriver", *args]  # fmt: skip


def parse_result(text: str) -> dict[str, float]:
    """The last ``RESULT k=v ...`` line as numbers."""
    found = _RESULT.findall(text)
    if not found:
        raise KafkaError(f"no RESULT line from TxnDriver:\n{text[-2000:]}")
    return {k: float(v) for k, v in (kv.split("=", 1) for kv in found[-1].split())}


def run(lib: Path, args: list[str], timeout: float = 3600.0) -> dict[str, float]:
    proc = subprocess.run(command(lib, args), capture_output=True, text=True, timeout=timeout, check=False)
    if proc.returncode != 0:
        raise KafkaError(f"TxnDriver {args[0]} exited {proc.returncode}:\n{(proc.stdout + proc.stderr)[-2000:]}")
    return parse_result(proc.stdout)


class Probe:
    """A probe JVM started ahead (its start-up is not timed): :meth:`go` times ``initTransactions``
    of an existing transactional id from the moment it is called until it succeeds."""

    def __init__(self, lib: Path, bootstrap: str, transactional_id: str) -> None:
        self.proc = subprocess.Popen(command(lib, ["probe", bootstrap, transactional_id]), stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)  # fmt: skip
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if line.strip() != "READY":
            self.proc.kill()
            raise KafkaError(f"the probe did not start: {line!r}")

    def go(self, timeout: float = 1200.0) -> float:
        out, _ = self.proc.communicate("go\n", timeout=timeout)
        if self.proc.returncode != 0:
            raise KafkaError(f"the probe exited {self.proc.returncode}: {out[-1000:]}")
        return parse_result(out)["seconds"]
