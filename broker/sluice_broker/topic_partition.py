"""``TopicPartition``: the (topic name, partition number) pair the broker keys partitions by.

One definition for the whole broker (the replica manager's maps, the
coordinators' transaction and offset state, the assignor). A naming rule goes
with it, because ``tp`` used to mean different things in different modules: a
variable called ``tp`` (or ``tps``) holds this tuple and nothing else. A
protobuf message with ``topic`` and ``partition`` fields is named for its role
(``requested``, ``owned``, ``marked`` ...), a partition's log is ``part``, and a
coordinator's internal-topic partition is ``cpart``
(:class:`sluice.broker.coordination.CoordinatorPartition`).
"""

from __future__ import annotations

TopicPartition = tuple[str, int]
