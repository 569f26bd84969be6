"""Calls that go to partition leaders: one request per leader, retried per partition until a deadline.

ListOffsets, DescribeProducers and AbortTransaction are asked of each partition's leader. What
they share is the loop, written once here: group the wanted partitions by their cached leader
(waiting for topics the cache does not know yet), send one request per leader, keep each
partition's answer, and retry only the partitions that failed retriably, after a backoff:
forgetting the leader when the error says it moved (a broker that did not answer, or
NOT_LEADER_OR_FOLLOWER and its kin). A non-retriable error is raised at once; when the deadline
passes, the reason a partition is offline (it has no live replica) is preferred over the last
broker's failure, because that is what the user can act on.

The caller supplies two functions, so this module knows no request type: ``request_of`` builds
the request for a group of partitions, ``answers_of`` reads a response into
``(partition, error code, message, value)``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TypeVar

from sluice import errors
from sluice.api.v1 import records_pb2
from sluice.client._network.cluster import Cluster
from sluice.client._network.error_mapping import METADATA_REFRESH_CODES
from sluice.client._network.retry import Backoff, Deadline
from sluice.client._network.rpc import Rpc
from sluice.client.types import TopicPartition

RequestT = TypeVar("RequestT")
ResponseT = TypeVar("ResponseT")
T = TypeVar("T")

# (partition, error code, error message, value): the value is used only when the code is NONE.
Answer = tuple[TopicPartition, int, str, T]


def call_leaders(
    cluster: Cluster,
    partitions: Iterable[TopicPartition],
    rpc: Rpc[RequestT, ResponseT],
    request_of: Callable[[Sequence[TopicPartition]], RequestT],
    answers_of: Callable[[ResponseT], Iterable[Answer[T]]],
    request_timeout: float,
    deadline: Deadline,
    what: str,
) -> dict[TopicPartition, T]:
    """``rpc`` to the leader of each of ``partitions`` (one request per leader): each partition's value.

    ``what`` names the values in the timeout's message ("offsets", "producers"). A partition the
    response does not mention is asked again, as after a retriable error.
    """
    remaining = set(partitions)
    out: dict[TopicPartition, T] = {}
    backoff = Backoff()
    last: errors.SluiceError | None = None
    while remaining:
        by_leader, unknown = _group_by_leader(cluster, remaining)
        if unknown:
            try:
                for topic in unknown:
                    cluster.wait_for_topic(topic, Deadline(min(deadline.remaining(), 1.0)))
                # known topics whose partition (added since) or leader (moved) the cache lacks
                cluster.refresh_if_stale(unknown, min_age=0.1, timeout=deadline.timeout(request_timeout))
            except errors.SluiceError as exc:
                last = exc
                if not exc.retriable and not isinstance(exc, errors.UnknownTopicOrPartitionError):
                    raise
        for addr, group in by_leader.items():
            try:
                response = cluster.call(addr, rpc, request_of(group), deadline.timeout(request_timeout))
            except errors.SluiceError as exc:
                if not exc.retriable:
                    raise
                last = exc
                for tp in group:
                    cluster.forget_leader(tp.topic, tp.partition)
                continue
            for tp, code, message, value in answers_of(response):
                if tp not in remaining:
                    continue
                if code == records_pb2.NONE:
                    out[tp] = value
                    remaining.discard(tp)
                    continue
                err = errors.error_for(code, message)
                if not err.retriable:
                    raise err
                last = err
                if code in METADATA_REFRESH_CODES:
                    cluster.forget_leader(tp.topic, tp.partition)
        if remaining:
            if deadline.expired():
                raise _timed_out(cluster, remaining, what, last)
            backoff.sleep(deadline)
    return out


def _group_by_leader(
    cluster: Cluster, partitions: Iterable[TopicPartition]
) -> tuple[dict[str, list[TopicPartition]], set[str]]:
    """The partitions by their cached leader's address, and the topics of those with no leader known."""
    by_leader: dict[str, list[TopicPartition]] = {}
    unknown: set[str] = set()
    for tp in sorted(partitions):
        leader = cluster.leader(tp.topic, tp.partition)
        if leader is None:
            unknown.add(tp.topic)
        else:
            by_leader.setdefault(leader[0], []).append(tp)
    return by_leader, unknown


def _timed_out(
    cluster: Cluster, remaining: set[TopicPartition], what: str, last: errors.SluiceError | None
) -> errors.SluiceError:
    names = ", ".join(map(str, sorted(remaining)))
    offline = [r for r in (cluster.offline_reason(tp.topic, tp.partition) for tp in sorted(remaining)) if r]
    if offline:  # the reason, rather than the last broker's failure (no broker answered ...)
        return errors.KafkaTimeoutError(f"{what} of {names} not available in time: " + "; ".join(offline))
    if last is not None:
        return last
    return errors.KafkaTimeoutError(f"{what} of {names} not available in time")
