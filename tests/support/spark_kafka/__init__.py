"""Spark's own Kafka connector (``spark-sql-kafka-0-10``) for the tests, fetched from Maven Central.

The tests of ``tests/spark/test_kafka_connector.py`` point Spark's ``format("kafka")`` source and
sink at Sluice's Kafka listener. The connector is not part of pyspark's jars: Spark users add it
with ``--packages``, which resolves through Ivy at session start. The tests instead resolve it once
with Maven (``pom.xml`` here, as ``bench/kafka/fetch.py`` does for Kafka's jars), for exactly the
Spark version and Scala binary version of the installed pyspark, into a cache directory outside the
repository (``$SLUICE_SPARK_KAFKA_HOME``, default ``~/.cache/sluice-spark-kafka``, with a Maven
repository of its own there), and hand the jars to the SparkSession as ``spark.jars``. After the
first run no network is needed; without ``mvn`` or Maven Central the fetch fails loudly (the tests
need the connector: they do not skip).

A completed fetch leaves a stamp (the pom's hash and both versions); the jars are copied into a
temporary directory renamed into place only when Maven succeeded and the connector jar is there.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
from pathlib import Path

POM = Path(__file__).resolve().parent / "pom.xml"
STAMP = ".complete"


class FetchError(RuntimeError):
    """Maven is missing or could not resolve the connector."""


def spark_versions() -> tuple[str, str]:
    """(Spark version, Scala binary version) of the installed pyspark, from its version and its jars."""
    import pyspark

    jars = Path(pyspark.__file__).resolve().parent / "jars"
    for jar in jars.glob("scala-library-*.jar"):
        m = re.match(r"scala-library-(\d+)\.(\d+)\.", jar.name)
        if m:
            return pyspark.__version__, f"{m.group(1)}.{m.group(2)}"
    raise FetchError(f"no scala-library jar in {jars}: cannot tell pyspark's Scala version")


def home() -> Path:
    return Path(os.environ.get("SLUICE_SPARK_KAFKA_HOME", Path.home() / ".cache" / "sluice-spark-kafka"))


def _stamp(spark: str, scala: str) -> str:
    return f"{hashlib.sha256(POM.read_bytes()).hexdigest()[:16]}-{spark}-{scala}"


def connector_jars(timeout: float = 900.0) -> list[Path]:
    """The connector's jars and its runtime dependencies for the installed pyspark, fetched when absent."""
    spark, scala = spark_versions()
    lib = home() / f"lib-{spark}-{scala}"
    stamp = lib / STAMP
    if not (stamp.is_file() and stamp.read_text().strip() == _stamp(spark, scala)):
        _fetch(lib, spark, scala, timeout)
    return sorted(lib.glob("*.jar"))


def _fetch(lib: Path, spark: str, scala: str, timeout: float) -> None:
    mvn = shutil.which("mvn")
    if mvn is None:
        raise FetchError("mvn (Apache Maven) is not on PATH: it fetches spark-sql-kafka-0-10 from Maven Central")
    lib.parent.mkdir(parents=True, exist_ok=True)
    tmp = lib.with_name(f"{lib.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    cmd = [
        mvn, "-B", "-q", "-f", str(POM),
        f"-Dmaven.repo.local={home() / 'm2'}", f"-Dspark.version={spark}", f"-Dscala.binary.version={scala}",
        "dependency:copy-dependencies", "-DincludeScope=runtime", f"-DoutputDirectory={tmp}",
    ]  # fmt: skip
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as exc:
        raise FetchError(f"mvn did not finish in {timeout:.0f}s") from exc
    connector = tmp / f"spark-sql-kafka-0-10_{scala}-{spark}.jar"
    if proc.returncode != 0 or not connector.is_file():
        shutil.rmtree(tmp, ignore_errors=True)
        raise FetchError(f"mvn exited {proc.returncode} without {connector.name}:\n{(proc.stdout + proc.stderr)[-3000:]}")
    (tmp / STAMP).write_text(_stamp(spark, scala) + "\n")
    shutil.rmtree(lib, ignore_errors=True)
    tmp.rename(lib)
