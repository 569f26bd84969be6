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

**Which version.** The connector of exactly pyspark's version when Maven Central serves it. A
pyspark release reaches PyPI before (or without) its connector reaching every Maven mirror: on
this project's machines pyspark 4.3.0 installs while Maven Central serves spark-sql-kafka up to
4.2.0. Then the ``.0`` releases of the lower minor versions of the same major are tried, newest
first (4.2.0 for 4.3.x); a version Maven did not serve is remembered for a day
(``unavailable-<version>``) so each test session does not ask again. The connector talks to Spark
through its DataSource V2 API, stable within a major version; the tests prove the combination
actually used. ``SLUICE_SPARK_KAFKA_VERSION`` forces one. :data:`chosen` says which was taken.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

POM = Path(__file__).resolve().parent / "pom.xml"
STAMP = ".complete"
UNAVAILABLE_FOR_S = 86_400.0
chosen = ""  # the connector version connector_jars() returned last


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


def _artifact(jar: str) -> str:
    """``kafka-clients`` of ``kafka-clients-3.9.2.jar``: the name without its version."""
    return re.sub(r"-\d+\.\d[\w.\-]*\.jar$", "", jar)


def connector_jars(timeout: float = 900.0) -> list[Path]:
    """The connector's jars and the runtime dependencies pyspark lacks, fetched when absent.

    Jars pyspark already ships (scala-library, hadoop-client, lz4, snappy, slf4j ...) are left out,
    as ``--packages`` leaves out Spark's own: two versions of one library on the classpath is a
    conflict waiting to happen.
    """
    import pyspark

    global chosen
    pyspark_version, scala = spark_versions()
    forced = os.environ.get("SLUICE_SPARK_KAFKA_VERSION")
    failures: list[str] = []
    for spark in [forced] if forced else candidates(pyspark_version):
        lib = home() / f"lib-{spark}-{scala}"
        stamp = lib / STAMP
        if stamp.is_file() and stamp.read_text().strip() == _stamp(spark, scala):
            break
        marker = home() / f"unavailable-{spark}-{scala}"
        if not forced and marker.is_file() and time.time() - marker.stat().st_mtime < UNAVAILABLE_FOR_S:
            failures.append(f"{spark}: not served (remembered in {marker})")
            continue
        try:
            _fetch(lib, spark, scala, timeout)
            break
        except FetchError as exc:
            failures.append(f"{spark}: {exc}")
            # not served (as opposed to a network failure): remember it
            if "Could not find artifact" in str(exc) or "was not found in" in str(exc):
                marker.write_text(str(exc)[-500:])
    else:
        raise FetchError("no spark-sql-kafka-0-10 connector could be fetched:\n" + "\n".join(failures))
    chosen = spark
    shipped = {_artifact(j.name) for j in (Path(pyspark.__file__).resolve().parent / "jars").glob("*.jar")}
    return sorted(j for j in lib.glob("*.jar") if _artifact(j.name) not in shipped)


def candidates(version: str) -> list[str]:
    """``version``, then the .0 releases of the lower minor versions of its major, newest first."""
    m = re.match(r"(\d+)\.(\d+)\.", version)
    if not m:
        return [version]
    major, minor = int(m.group(1)), int(m.group(2))
    return [version] + [f"{major}.{lower}.0" for lower in range(minor - 1, -1, -1)]


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
        output = (proc.stdout + proc.stderr)[-3000:]
        raise FetchError(f"mvn exited {proc.returncode} without {connector.name}:\n{output}")
    (tmp / STAMP).write_text(_stamp(spark, scala) + "\n")
    shutil.rmtree(lib, ignore_errors=True)
    tmp.rename(lib)
