"""The replica consistency check: the replicas' stored logs compared batch by batch (issue 30).

A transaction can be lost without any client-visible error when two replicas hold *different*
batches under the same leader epoch: truncation on a leader change (OffsetsForLeaderEpoch) only
repairs a divergence between epochs, so a same-epoch difference stays forever and surfaces later
as a lost or half-visible transaction. A fault test that only reads through clients sees it only
if the wrong replica happens to lead at the end. This module compares the logs themselves:

1. **Same base offset, same leader epoch ⇒ same batch**, on any two replicas, anywhere in the
   log (in or out of the ISR, below or above the HW): a leader epoch has one leader, and only it
   assigns offsets in that epoch.
2. **Below the HW, every in-sync replica holds the same batches** as the leader (or, if the
   leader is not in the ISR, as the first ISR member): from the largest log start offset of the
   two up to the HW, the same base offsets with identical batches, and no ISR member ends before
   the HW. In a compacted topic (the internal ones included) each replica drops whole batches on
   its own schedule, so there a batch missing on one side is not a difference; a different one is.

Batches are compared on every header field and a hash of their record bytes (see
:mod:`sluice.broker.log.dump`, which reads a broker's RocksDB as a secondary instance, safe on a
running broker; it runs as a subprocess because ``sluice.testing`` may not import
``sluice.broker``). :func:`compare` is pure and is what the self-test plants differences into;
:meth:`sluice.testing.LocalCluster.check_replica_consistency` reads the live cluster, waits
(bounded) for the replicas to catch up with the HW, and raises :class:`ReplicaDivergence` naming
the first difference: topic, partition, offset, epoch, brokers, and which fields differ.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sluice.records import BATCH_SUMMARY_FIELDS

__all__ = ["BATCH_FIELDS", "ReplicaDivergence", "ReplicaLog", "compare", "read_replica_logs"]

BATCH_FIELDS = BATCH_SUMMARY_FIELDS  # the one list (sluice.records)
_BASE, _COUNT, _EPOCH = 0, 1, 2

Batch = tuple[Any, ...]
TopicPartitionKey = tuple[str, int]


class ReplicaDivergence(AssertionError):
    """Two replicas' logs differ where they must not; ``differences`` lists every one found, first first."""

    def __init__(self, differences: Sequence[str]) -> None:
        self.differences = list(differences)
        more = f" (and {len(differences) - 1} more)" if len(differences) > 1 else ""
        super().__init__(f"replicas differ: {differences[0]}{more}")


@dataclass
class ReplicaLog:
    """One broker's stored copy of one partition."""

    broker: int
    topic: str
    partition: int
    high_watermark: int  # the broker's last HW checkpoint
    log_start_offset: int
    batches: list[Batch] = field(default_factory=list)

    @property
    def log_end_offset(self) -> int:
        if not self.batches:
            return self.log_start_offset
        last = self.batches[-1]
        return int(last[_BASE]) + int(last[_COUNT])


def read_replica_logs(python: str, broker: int, rocksdb_dir: Path, timeout: float = 120.0) -> list[ReplicaLog]:
    """Every partition stored in one broker's RocksDB (``python -m sluice.broker.log.dump``)."""
    done = subprocess.run(
        [python, "-m", "sluice.broker.log.dump", str(rocksdb_dir)], capture_output=True, text=True, timeout=timeout
    )
    if done.returncode != 0:
        raise RuntimeError(f"dumping broker {broker}'s log at {rocksdb_dir} failed: {done.stderr.strip()[-2000:]}")
    out = []
    for p in json.loads(done.stdout)["partitions"]:
        out.append(
            ReplicaLog(
                broker=broker,
                topic=p["topic"],
                partition=p["partition"],
                high_watermark=p["high_watermark"],
                log_start_offset=p["log_start_offset"],
                batches=[tuple(b) for b in p["batches"]],
            )
        )
    return out


def _what_differs(a: Batch, b: Batch) -> str:
    return ", ".join(f"{name} {x!r} != {y!r}" for name, x, y in zip(BATCH_FIELDS, a, b, strict=True) if x != y)


def _same_epoch_differences(tp: TopicPartitionKey, replicas: Sequence[ReplicaLog]) -> list[tuple[int, str]]:
    """Rule 1: (offset, description) of every (base offset, epoch) stored differently by two replicas."""
    seen: dict[tuple[int, int], tuple[int, Batch]] = {}
    out = []
    for log in sorted(replicas, key=lambda r: r.broker):
        for batch in log.batches:
            key = (int(batch[_BASE]), int(batch[_EPOCH]))
            first = seen.get(key)
            if first is None:
                seen[key] = (log.broker, batch)
            elif first[1] != batch:
                out.append(
                    (
                        key[0],
                        f"{tp[0]}-{tp[1]} offset {key[0]} leader epoch {key[1]}: brokers {first[0]} and "
                        f"{log.broker} hold different batches in the same epoch ({_what_differs(first[1], batch)})",
                    )
                )
    return out


def _below_hw_differences(
    tp: TopicPartitionKey, reference: ReplicaLog, other: ReplicaLog, hw: int, compacted: bool
) -> list[tuple[int, str]]:
    """Rule 2 for one ISR member against the reference replica. A compacted partition's replicas
    drop whole batches each on its own schedule: there only batches both hold are compared."""
    name = f"{tp[0]}-{tp[1]}"
    start = max(reference.log_start_offset, other.log_start_offset)
    mine = {int(b[_BASE]): b for b in reference.batches if start <= int(b[_BASE]) < hw}
    theirs = {int(b[_BASE]): b for b in other.batches if start <= int(b[_BASE]) < hw}
    out = []
    for offset in sorted(set(mine) | set(theirs)):
        a, b = mine.get(offset), theirs.get(offset)
        if (a is None or b is None) and compacted:
            continue
        if a is None or b is None:
            has, lacks = (reference, other) if b is None else (other, reference)
            batch = a if b is None else b
            assert batch is not None
            out.append(
                (
                    offset,
                    f"{name} offset {offset} (below the HW {hw}): broker {has.broker} holds a batch of leader epoch "
                    f"{batch[_EPOCH]} and in-sync broker {lacks.broker} has no batch starting there",
                )
            )
        elif a != b:
            out.append(
                (
                    offset,
                    f"{name} offset {offset} (below the HW {hw}): brokers {reference.broker} and {other.broker} "
                    f"differ: {_what_differs(a, b)}",
                )
            )
    if other.log_end_offset < hw:
        out.append((other.log_end_offset, f"{name}: in-sync broker {other.broker} ends at {other.log_end_offset}, "
                                          f"below the HW {hw}"))  # fmt: skip
    return out


def compare(
    logs: Sequence[ReplicaLog],
    isr: Mapping[TopicPartitionKey, Sequence[int]],
    high_watermarks: Mapping[TopicPartitionKey, int] | None = None,
    leaders: Mapping[TopicPartitionKey, int] | None = None,
    compacted: frozenset[str] = frozenset(),
) -> list[str]:
    """Every difference between the replicas in ``logs`` (by offset, per partition); empty if consistent.

    ``isr`` (and ``leaders``) per (topic, partition) come from the metadata; ``high_watermarks``
    from ListOffsets; a partition without one uses the largest HW checkpoint of its replicas.
    ``compacted``: topics whose replicas may each have compacted batches away (see rule 2).
    """
    by_tp: dict[TopicPartitionKey, list[ReplicaLog]] = {}
    for log in logs:
        by_tp.setdefault((log.topic, log.partition), []).append(log)
    out: list[str] = []
    for tp in sorted(by_tp):
        replicas = by_tp[tp]
        found = _same_epoch_differences(tp, replicas)
        in_sync = [r for r in replicas if r.broker in set(isr.get(tp, ()))]
        if in_sync:
            hw = max([r.high_watermark for r in in_sync] + [(high_watermarks or {}).get(tp, 0)])
            leader = (leaders or {}).get(tp, -1)
            reference = next((r for r in in_sync if r.broker == leader), in_sync[0])
            for other in in_sync:
                if other is not reference:
                    found += _below_hw_differences(tp, reference, other, hw, tp[0] in compacted)
        # by offset; at one offset the same-epoch difference (the cause) before its below-HW symptom
        out += [text for _o, _r, text in sorted((o, " leader epoch " not in t, t) for o, t in found)]
    return out


def lagging(
    logs: Sequence[ReplicaLog],
    isr: Mapping[TopicPartitionKey, Sequence[int]],
    high_watermarks: Mapping[TopicPartitionKey, int],
) -> list[str]:
    """ISR members whose stored log ends before the HW: still catching up (the caller waits and reads again)."""
    out = []
    for log in logs:
        tp = (log.topic, log.partition)
        hw = high_watermarks.get(tp)
        if hw is not None and log.broker in set(isr.get(tp, ())) and log.log_end_offset < hw:
            out.append(f"{log.topic}-{log.partition} on broker {log.broker}: {log.log_end_offset} < HW {hw}")
    return out
