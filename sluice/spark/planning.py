"""Driver-side planning: which partitions, which offsets, and how the work is split into tasks.

Everything a read decides is decided here, on the driver, before a task
runs: the partitions of the subscription (``subscribe``, ``subscribePattern``
or ``assign``), the offsets ``earliest``/``latest`` stand for (``latest`` is
the last stable offset for read_committed, the high watermark for
read_uncommitted, from the partition leaders' ListOffsets), and the list of
:class:`OffsetRange` tasks. A task then reads exactly its range, whatever
happens to the topic meanwhile, so re-running a task or a micro-batch gives
the same records.

Splitting follows Spark's Kafka source: one task per partition range, and
with ``minPartitions`` larger than the number of ranges, big ranges are cut
into pieces in proportion to their size; ``maxRecordsPerPartition`` caps the
size of every piece.

Streaming offsets are JSON objects in Kafka's format, ``{"orders": {"0": 42,
"1": 17}}`` (the next offset to read per partition), which is what Spark
writes into the checkpoint's offset log.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping

from pyspark.sql.datasource import InputPartition

from sluice import errors
from sluice.client import Admin, Consumer, TopicDescription, TopicPartition
from sluice.spark.options import EARLIEST, LATEST, OffsetSpec, ReadOptions, SluiceOptionError

__all__ = ["Catalog", "OffsetRange", "PartitionOffsets", "from_json", "rate_limit", "split_ranges", "to_json"]

PartitionOffsets = dict[TopicPartition, int]


class OffsetRange(InputPartition):  # type: ignore[misc]
    """One Spark task: the records of ``topic``-``partition`` with ``start <= offset < end`` (picklable)."""

    def __init__(self, topic: str, partition: int, start: int, end: int) -> None:
        self.topic = topic
        self.partition = partition
        self.start = start
        self.end = end

    @property
    def size(self) -> int:
        return self.end - self.start

    def key(self) -> tuple[str, int, int, int]:
        return (self.topic, self.partition, self.start, self.end)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, OffsetRange) and self.key() == other.key()

    def __hash__(self) -> int:
        return hash(self.key())


def to_json(offsets: Mapping[TopicPartition, int]) -> dict[str, dict[str, int]]:
    """Kafka's offset JSON: ``{topic: {"partition": offset}}``, sorted."""
    out: dict[str, dict[str, int]] = {}
    for tp in sorted(offsets):
        out.setdefault(tp.topic, {})[str(tp.partition)] = int(offsets[tp])
    return out


def from_json(value: Mapping[str, object]) -> PartitionOffsets:
    """The inverse of :func:`to_json` (offsets read back from a checkpoint)."""
    out: PartitionOffsets = {}
    for topic, parts in value.items():
        if not isinstance(parts, Mapping):
            raise ValueError(f"malformed sluice offsets for topic {topic!r}: {parts!r}")
        for p, off in parts.items():
            out[TopicPartition(str(topic), int(p))] = int(off)  # type: ignore[call-overload]
    return out


def split_ranges(ranges: list[OffsetRange], min_partitions: int | None, max_records: int | None) -> list[OffsetRange]:
    """Spark's Kafka split rule: cut ranges so there are at least ``min_partitions`` and none above ``max_records``."""
    ranges = [r for r in ranges if r.size > 0]
    out: list[OffsetRange] = []
    total = sum(r.size for r in ranges)
    for r in ranges:
        pieces = 1
        if min_partitions is not None and min_partitions > len(ranges) and total > 0:
            pieces = max(1, math.ceil(r.size * min_partitions / total))
        if max_records is not None:
            pieces = max(pieces, math.ceil(r.size / max_records))
        pieces = min(pieces, r.size)
        for i in range(pieces):
            lo = r.start + r.size * i // pieces
            hi = r.start + r.size * (i + 1) // pieces
            if hi > lo:
                out.append(OffsetRange(r.topic, r.partition, lo, hi))
    return out


def rate_limit(
    start: Mapping[TopicPartition, int], latest: Mapping[TopicPartition, int], limit: int
) -> PartitionOffsets:
    """At most about ``limit`` records past ``start``, shared in proportion to what each partition has."""
    sizes = {tp: max(0, latest[tp] - start.get(tp, latest[tp])) for tp in latest}
    total = sum(sizes.values())
    if total <= limit:
        return dict(latest)
    out: PartitionOffsets = {}
    for tp, end in latest.items():
        begin = start.get(tp, end)
        share = limit * sizes[tp] / total
        step = math.ceil(share) if share < 1 else math.floor(share)
        out[tp] = min(begin + step, end)
    return out


class Catalog:
    """The driver's view of the cluster for one read: partitions and offsets, through the public client."""

    def __init__(self, options: ReadOptions) -> None:
        self.options = options
        tls = options.security.client_kwargs()
        self._admin = Admin(bootstrap_servers=options.bootstrap_servers, client_id="sluice-spark-driver", **tls)
        self._consumer = Consumer(
            bootstrap_servers=options.bootstrap_servers,
            **tls,
            group_id=None,
            isolation_level=options.isolation_level,
            client_id="sluice-spark-driver",
        )
        self._known: set[TopicPartition] = set()

    def close(self) -> None:
        self._consumer.close()
        self._admin.close()

    def partitions(self) -> list[TopicPartition]:
        """The partitions the subscription covers now (a pattern is matched against the current topics)."""
        o = self.options
        if o.assign is not None:
            described = self._describe(o.assign)
            out = []
            for topic, wanted in o.assign.items():
                have = {p.partition for p in described[topic].partitions}
                missing = [p for p in wanted if p not in have]
                if missing:
                    raise SluiceOptionError(
                        f"option 'assign': topic {topic!r} has partitions 0..{len(have) - 1}, not {missing}"
                    )
                out += [TopicPartition(topic, p) for p in wanted]
            return sorted(out)
        if o.subscribe is not None:
            topics: Iterable[str] = o.subscribe
        else:
            rx = re.compile(o.subscribe_pattern or "")
            topics = [t for t in self._admin.list_topics() if rx.fullmatch(t)]
        described = self._describe(topics)
        return sorted(TopicPartition(t, p.partition) for t, d in described.items() for p in d.partitions)

    def _describe(self, topics: Iterable[str]) -> dict[str, TopicDescription]:
        names = list(topics)
        if not names:
            return {}
        try:
            return dict(zip(names, self._admin.describe_topics(names), strict=True))
        except errors.UnknownTopicOrPartitionError as exc:
            raise SluiceOptionError(f"{self.options.describe_subscription()}: {exc}") from None

    def _know(self, tps: list[TopicPartition]) -> None:
        """Refresh the consumer's metadata when partitions appeared since it last looked (it would wait for them)."""
        if not set(tps) <= self._known:
            self._consumer.list_topics()  # a full metadata refresh
            self._known |= set(tps)

    def earliest(self, tps: Iterable[TopicPartition]) -> PartitionOffsets:
        tps = list(tps)
        self._know(tps)
        return self._consumer.beginning_offsets(tps) if tps else {}

    def latest(self, tps: Iterable[TopicPartition]) -> PartitionOffsets:
        """The last stable offset (read_committed) or high watermark (read_uncommitted) of each partition."""
        tps = list(tps)
        self._know(tps)
        return self._consumer.end_offsets(tps) if tps else {}

    def resolve(
        self,
        spec: OffsetSpec,
        tps: list[TopicPartition],
        name: str,
        earliest: Mapping[TopicPartition, int],
        latest: Mapping[TopicPartition, int],
    ) -> PartitionOffsets:
        """Offsets of ``spec`` for ``tps``: -2/-1 and earliest/latest made concrete; checked against the log."""
        if spec.kind == "specific":
            missing = sorted(tp for tp in tps if (tp.topic, tp.partition) not in spec.offsets)
            if missing:
                raise SluiceOptionError(
                    f"option {name!r} gives specific offsets, so it must name every partition of the "
                    f"subscription ({self.options.describe_subscription()}); missing: "
                    f"{', '.join(map(str, missing))} (use -2 for earliest, -1 for latest)"
                )
        out: PartitionOffsets = {}
        for tp in tps:
            want = spec.for_partition(tp.topic, tp.partition)
            if want == EARLIEST:
                out[tp] = earliest[tp]
            elif want == LATEST:
                out[tp] = latest[tp]
            else:
                if want > latest[tp]:
                    bound = "last stable offset" if self.options.read_committed else "high watermark"
                    raise SluiceOptionError(
                        f"option {name!r}: offset {want} of {tp} is past the end of the partition "
                        f"(its {bound} is {latest[tp]})"
                    )
                out[tp] = want
        return out

    def batch_ranges(self) -> list[OffsetRange]:
        """The tasks of a batch read: startingOffsets to endingOffsets of every partition, split."""
        o = self.options
        tps = self.partitions()
        earliest = self.earliest(tps)
        latest = self.latest(tps)
        start = self.resolve(o.starting, tps, "startingOffsets", earliest, latest)
        end = self.resolve(o.ending, tps, "endingOffsets", earliest, latest)
        ranges = []
        for tp in tps:
            if start[tp] > end[tp]:
                raise SluiceOptionError(f"{tp}: startingOffsets ({start[tp]}) is after endingOffsets ({end[tp]})")
            ranges.append(OffsetRange(tp.topic, tp.partition, start[tp], end[tp]))
        return split_ranges(ranges, o.min_partitions, o.max_records_per_partition)
