"""Replica placement: which brokers hold each partition of a new topic, and in what order.

Pure and deterministic (the same brokers and counts always give the same
answer), so the broker that creates a topic on CreateTopics, the local
controller and the Kubernetes operator all place replicas the same way, and
tests can state exact expectations. It lives in :mod:`sluice.metadata`
because the broker and the operator may not import each other.

The algorithm is Kafka's (``AdminUtils.assignReplicasToBrokers``) without its
random start, so a Kafka user finds the layout they expect:

* Brokers are sorted by id. With racks, they are first arranged rack by
  rack in turn (rack a's first broker, rack b's first, ..., rack a's second
  ...), so walking the list alternates racks.
* The first replica of partition ``p`` (the preferred leader) is
  ``brokers[p % n]``: leadership is spread evenly, each broker prefers at
  most ``ceil(partitions / n)`` partitions of a topic.
* Follower ``j`` of partition ``p`` is ``(first + 1 + (shift + j) % (n - 1)) % n``
  where ``shift`` grows by one every ``n`` partitions, so the followers of a
  broker's partitions are spread over the other brokers instead of always
  being its neighbours (which would move all of a dead broker's load onto
  one broker).
* Rack-aware: a follower is skipped while its rack already holds a replica
  of the partition and some rack holds none yet, so a partition's replicas
  sit on ``min(replication_factor, racks)`` distinct racks.

``start_partition`` continues the pattern for partitions added to an existing
topic (CreatePartitions), as Kafka does.

Racks: a broker with rack ``""`` (or None) has no rack. If no broker has one,
placement ignores racks. If only some have one, the rackless brokers count as
one more rack (named ``""``) rather than refusing, as Kafka does; the spread
is then still as wide as those racks allow.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["place_replicas"]


def _rack_alternated(brokers: Sequence[tuple[int, str]]) -> list[int]:
    """Broker ids arranged so that consecutive entries alternate racks (racks and ids sorted)."""
    by_rack: dict[str, list[int]] = {}
    for broker_id, rack in sorted(brokers, key=lambda b: b[0]):
        by_rack.setdefault(rack, []).append(broker_id)
    queues = [by_rack[r] for r in sorted(by_rack)]
    out: list[int] = []
    for i in range(max(len(q) for q in queues)):
        out.extend(q[i] for q in queues if i < len(q))
    return out


def _follower_index(first: int, shift: int, j: int, n: int) -> int:
    return (first + 1 + (shift + j) % (n - 1)) % n


def place_replicas(
    brokers: Sequence[tuple[int, str | None]],
    partitions: int,
    replication_factor: int,
    start_partition: int = 0,
) -> list[list[int]]:
    """Replica lists (preferred leader first) for partitions ``start_partition ..``.

    ``brokers`` are ``(broker_id, rack)`` pairs; rack ``""``/None means none.
    Raises ValueError when the replication factor is larger than the number
    of brokers, or when a count is out of range.
    """
    ids = [b[0] for b in brokers]
    if len(set(ids)) != len(ids):
        raise ValueError(f"broker ids must be distinct, got {sorted(ids)}")
    if replication_factor < 1:
        raise ValueError(f"replication factor must be at least 1, not {replication_factor}")
    if partitions < 0 or start_partition < 0:
        raise ValueError(f"partitions ({partitions}) and start_partition ({start_partition}) must be >= 0")
    n = len(brokers)
    if replication_factor > n:
        raise ValueError(
            f"replication factor {replication_factor} is larger than the {n} available broker(s)"
            + (f" {sorted(ids)}" if ids else "")
        )
    racked = [(b, r or "") for b, r in brokers]
    rack_of = dict(racked)
    rack_aware = any(r for _, r in racked)
    order = _rack_alternated(racked) if rack_aware else sorted(ids)
    rack_count = len(set(rack_of.values()))
    out: list[list[int]] = []
    for p in range(start_partition, start_partition + partitions):
        first = p % n
        shift = p // n
        replicas = [order[first]]
        if not rack_aware:
            replicas += [order[_follower_index(first, shift, j, n)] for j in range(replication_factor - 1)]
            out.append(replicas)
            continue
        racks = {rack_of[order[first]]}
        k = 0
        # Rack-aware: with (shift * racks) the walk starts on a rack boundary. Each follower
        # takes the first broker not yet used whose rack is new (or any rack, once every
        # rack holds a replica). The walk visits all n - 1 other brokers within n - 1 steps.
        for _ in range(replication_factor - 1):
            for _step in range(2 * n):
                candidate = order[_follower_index(first, shift * rack_count, k, n)]
                k += 1
                if candidate in replicas:
                    continue
                if rack_of[candidate] in racks and len(racks) < rack_count:
                    continue
                replicas.append(candidate)
                racks.add(rack_of[candidate])
                break
            else:  # unreachable: some unused broker is always acceptable
                raise AssertionError(f"placement found no broker for partition {p}")
        out.append(replicas)
    return out
