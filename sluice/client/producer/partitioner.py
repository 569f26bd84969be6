"""The default partitioner: where a record goes when ``send()`` names no partition.

* A record with a key goes to ``crc32(key) % num_partitions`` (zlib's CRC-32,
  IEEE polynomial, as an unsigned 32-bit value). It is stable across processes,
  Python versions and machines (unlike ``hash()``), and cheap in C. Any client
  in another language reproduces it with a standard CRC-32. It is not Kafka's
  murmur2, so keys do not land on the partitions Apache Kafka would pick; a
  Sluice user only needs the same key to land on the same partition, always,
  as long as the partition count does not change.
* A record without a key goes to a "sticky" partition (Kafka's KIP-480): all
  keyless records of a topic fill one batch, then the producer picks another
  partition at random for the next batch. Batches get fuller than with
  round-robin, which is what makes keyless sends fast.
"""

from __future__ import annotations

import random
import threading
import zlib


def partition_for_key(key: bytes, num_partitions: int) -> int:
    """The partition of a keyed record: ``zlib.crc32(key) % num_partitions``."""
    if num_partitions <= 0:
        raise ValueError("num_partitions must be positive")
    return zlib.crc32(key) % num_partitions


class StickyPartitioner:
    """Chooses partitions for keyless records, one batch at a time per topic. Thread-safe."""

    def __init__(self, rng: random.Random | None = None) -> None:
        self._lock = threading.Lock()
        self._sticky: dict[str, int] = {}
        self._rng = rng or random.Random()

    def partition(self, topic: str, num_partitions: int, available: list[int] | None = None) -> int:
        """The current sticky partition of ``topic`` (choosing one if there is none)."""
        with self._lock:
            current = self._sticky.get(topic)
            if current is None or current >= num_partitions:
                current = self._choose(num_partitions, available, None)
                self._sticky[topic] = current
            return current

    def on_new_batch(self, topic: str, num_partitions: int, previous: int, available: list[int] | None = None) -> None:
        """The sticky partition ``previous`` started a new batch: move on to another partition."""
        with self._lock:
            if self._sticky.get(topic) == previous:
                self._sticky[topic] = self._choose(num_partitions, available, previous)

    def _choose(self, num_partitions: int, available: list[int] | None, avoid: int | None) -> int:
        choices = [p for p in (available or range(num_partitions)) if p < num_partitions]
        if not choices:
            choices = list(range(num_partitions))
        if len(choices) > 1 and avoid is not None:
            choices = [p for p in choices if p != avoid]
        return self._rng.choice(choices)


def default_partition(
    sticky: StickyPartitioner,
    topic: str,
    key: bytes | None,
    num_partitions: int,
    available: list[int] | None = None,
) -> int:
    """Kafka's default partitioner with crc32: hash the key, or stick for keyless records."""
    if key is not None:
        return partition_for_key(key, num_partitions)
    return sticky.partition(topic, num_partitions, available)
