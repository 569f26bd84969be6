"""Fetch Apache Kafka's jars from Maven Central with Maven, once, into a cache directory.

    python -m bench.kafka.fetch [--version 4.3.1] [--force]

``mvn dependency:copy-dependencies`` on ``bench/kafka/pom.xml`` copies the broker, the tools, the
client and their runtime dependencies into ``$SLUICE_KAFKA_HOME/lib-<version>`` (default
``~/.cache/sluice-kafka``), with a Maven repository of its own under the same directory so no other
project's ``~/.m2`` is read or written. The jars are copied into a temporary directory that is renamed
into place only when Maven succeeded and the broker and tools jars are there, and a stamp (the pom's
hash and the version) makes a second call a no-op; ``--force`` fetches again.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

DEFAULT_VERSION = "4.3.1"
POM = Path(__file__).resolve().parent / "pom.xml"
STAMP = ".complete"


class FetchError(RuntimeError):
    """Maven is missing or could not resolve Kafka's jars."""


def kafka_home() -> Path:
    """Where jars, the Maven repository and run data live (outside the repository)."""
    return Path(os.environ.get("SLUICE_KAFKA_HOME", Path.home() / ".cache" / "sluice-kafka"))


def lib_dir(version: str = DEFAULT_VERSION) -> Path:
    return kafka_home() / f"lib-{version}"


def _stamp(version: str) -> str:
    return f"{hashlib.sha256(POM.read_bytes()).hexdigest()[:16]}-{version}"


def is_complete(version: str = DEFAULT_VERSION) -> bool:
    stamp = lib_dir(version) / STAMP
    return stamp.is_file() and stamp.read_text().strip() == _stamp(version)


def ensure_jars(version: str = DEFAULT_VERSION, *, force: bool = False, timeout: float = 1200.0) -> Path:
    """The directory holding Kafka ``version``'s jars, fetching them first when needed."""
    lib = lib_dir(version)
    if not force and is_complete(version):
        return lib
    mvn = shutil.which("mvn")
    if mvn is None:
        raise FetchError("mvn (Apache Maven) is not on PATH: it fetches Kafka's jars from Maven Central")
    home = kafka_home()
    home.mkdir(parents=True, exist_ok=True)
    tmp = home / f"lib-{version}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    cmd = [
        mvn, "-B", "-q", "-f", str(POM),
        f"-Dmaven.repo.local={home / 'm2'}", f"-Dkafka.version={version}",
        "dependency:copy-dependencies", "-DincludeScope=runtime", f"-DoutputDirectory={tmp}",
    ]  # fmt: skip
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as exc:
        raise FetchError(f"mvn did not finish in {timeout:.0f}s") from exc
    if proc.returncode != 0:
        shutil.rmtree(tmp, ignore_errors=True)
        raise FetchError(f"mvn exited {proc.returncode}:\n{(proc.stdout + proc.stderr)[-3000:]}")
    for jar in (f"kafka_2.13-{version}.jar", f"kafka-tools-{version}.jar", f"kafka-clients-{version}.jar"):
        if not (tmp / jar).is_file():
            shutil.rmtree(tmp, ignore_errors=True)
            raise FetchError(f"Maven finished but {jar} is not among the copied jars")
    (tmp / STAMP).write_text(_stamp(version) + "\n")
    shutil.rmtree(lib, ignore_errors=True)
    tmp.rename(lib)
    return lib


def classpath(lib: Path) -> str:
    return os.pathsep.join(str(p) for p in sorted(lib.glob("*.jar")))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--version", default=DEFAULT_VERSION)
    ap.add_argument("--force", action="store_true", help="fetch again even when the cache is complete")
    args = ap.parse_args(argv)
    try:
        lib = ensure_jars(args.version, force=args.force)
    except FetchError as exc:
        print(f"fetch: {exc}", file=sys.stderr)
        return 1
    jars = list(lib.glob("*.jar"))
    size = sum(j.stat().st_size for j in jars) / 1e6
    print(f"fetch: Kafka {args.version}: {len(jars)} jars, {size:.0f} MB in {lib}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
