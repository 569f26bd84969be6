"""A client's error names an offline partition and says why (issue 30, item 4).

Two real brokers; a topic of replication factor 1 with one partition on each. The broker holding
partition 0 is killed; the other stays up and answers Metadata with partition 0 leaderless
(LEADER_NOT_AVAILABLE, retriable). A send to partition 0 keeps waiting for a leader until
delivery_timeout_ms, and an offsets lookup until its timeout, as Kafka's clients do; their final
errors used to say only that time ran out ("1 record(s) for off-0 expired after 5000 ms") or what
the last broker failed with. Now they name the partition, its replicas and why it has no leader.
Partition 1 goes on working meanwhile. (`sluice produce` reports the producer's error: the same
text.)
"""

from __future__ import annotations

import pytest

from sluice import errors
from sluice.client import Admin, Consumer, Producer, TopicPartition
from sluice.testing import LocalCluster


def test_the_errors_of_a_send_and_an_offsets_lookup_name_the_offline_partition() -> None:
    with LocalCluster(brokers=2, failure_timeout_ms=2000) as cluster:
        bootstrap = cluster.bootstrap_servers
        admin = Admin(bootstrap_servers=bootstrap)
        admin.create_topic("off", partitions=2, replication_factor=1)
        down = cluster.leader("off", 0)
        up = cluster.leader("off", 1)
        assert down != up, "placement puts the two partitions on different brokers"
        # a producer that knew the leader before it died, as a running application does
        producer = Producer(bootstrap_servers=bootstrap, delivery_timeout_ms=5000, request_timeout_ms=3000)
        producer.send("off", value=b"before", partition=0).result(timeout=30)

        cluster.kill(down)
        state = cluster.wait_for_partition("off", 0, lambda s: s["leader"] == -1, what="partition 0 without a leader")
        assert state["replicas"] == [down]

        offline = f"off-0 is offline: it has no leader (replicas [{down}], in sync [{down}]"
        with pytest.raises(errors.KafkaTimeoutError) as sent:
            producer.send("off", value=b"while offline", partition=0).result(timeout=60)
        assert offline in str(sent.value), sent.value
        assert "LEADER_NOT_AVAILABLE" in str(sent.value)
        producer.send("off", value=b"other partition", partition=1).result(timeout=30)  # broker `up` writes on
        producer.close(timeout=10)

        consumer = Consumer(bootstrap_servers=cluster.address(up), group_id=None, request_timeout_ms=3000)
        consumer.assign([TopicPartition("off", 0)])
        with pytest.raises(errors.KafkaTimeoutError) as looked_up:
            consumer.seek_to_beginning()
        assert offline in str(looked_up.value), looked_up.value
        consumer.close()
        admin.close()
