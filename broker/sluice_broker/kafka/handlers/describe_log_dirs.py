"""DescribeLogDirs: this broker's one log directory and the partitions it holds.

Kafka's ``Admin.describeLogDirs`` asks every broker; ``kafka-reassign-partitions --execute``
asks before it moves anything (and ``kafka-log-dirs --describe`` prints it). A Sluice broker has
one log directory (its RocksDB data directory) holding every partition it is a replica of, so
the answer is that directory with its volume's total and usable bytes, never cordoned, and the
partitions among those asked for (all when the topics are null), each with its size: the bytes
of its stored batches, which the partition log keeps as batches come and go. The offset lag is
0, as Kafka answers for a current (not a future) replica. Authorization (Kafka's): Describe on
the cluster, else CLUSTER_AUTHORIZATION_FAILED for the whole request.
"""

from __future__ import annotations

from sluice.acls import AclOperation
from sluice.api.v1 import records_pb2 as pb
from sluice.broker.kafka import authorization
from sluice.broker.kafka.context import KafkaContext
from sluice.broker.kafka_wire.codec import Message, Versions
from sluice.broker.kafka_wire.messages.describe_log_dirs_request import DescribeLogDirsRequest
from sluice.broker.kafka_wire.messages.describe_log_dirs_response import (
    DescribeLogDirsPartition,
    DescribeLogDirsResponse,
    DescribeLogDirsResult,
    DescribeLogDirsTopic,
)
from sluice.broker.kafka_wire.messages.request_header import RequestHeader
from sluice.broker.log.dir_space import read_space


class DescribeLogDirsHandler:
    api_key = 35
    versions = Versions(1, 5)

    async def handle(self, ctx: KafkaContext, header: RequestHeader, request: Message) -> Message:
        assert isinstance(request, DescribeLogDirsRequest)
        resp = DescribeLogDirsResponse()
        if not authorization.cluster_allowed(ctx, AclOperation.DESCRIBE):
            resp.error_code = pb.CLUSTER_AUTHORIZATION_FAILED
            return resp
        result = DescribeLogDirsResult(log_dir=ctx.config.data_dir)
        if ctx.replicas.storage.failure is not None:
            result.error_code = pb.KAFKA_STORAGE_ERROR
            resp.results.append(result)
            return resp
        try:
            space = read_space(ctx.config.data_dir)
            result.total_bytes, result.usable_bytes = space.size_bytes, space.free_bytes
        except OSError:
            pass  # -1: unknown, as Kafka answers when it cannot tell
        held = sorted(ctx.replicas.partitions)
        if request.topics is not None:
            wanted = {(t.topic, p) for t in request.topics for p in t.partitions}
            held = [key for key in held if key in wanted]
        topics: dict[str, DescribeLogDirsTopic] = {}
        for name, index in held:
            topic = topics.get(name)
            if topic is None:
                topic = topics[name] = DescribeLogDirsTopic(name=name)
                result.topics.append(topic)
            log = ctx.replicas.partitions[(name, index)]
            topic.partitions.append(DescribeLogDirsPartition(partition_index=index, partition_size=log.size_bytes))
        resp.results.append(result)
        return resp
