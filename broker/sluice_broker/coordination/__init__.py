"""What the two coordinators share (imported as ``sluice.broker.coordination``).

``runtime``  :class:`CoordinatorRuntime`: loading, serving and unloading the partitions of one
             internal topic this broker leads, for a :class:`CoordinatorShard` (the transaction
             coordinator over ``__transaction_state``, the group coordinator over
             ``__consumer_offsets``)
``answers``  what both coordinators answer alike, as plain values (:class:`PartitionAnswer`)
"""

from sluice.broker.coordination.runtime import (
    CoordinatorPartition,
    CoordinatorRuntime,
    CoordinatorShard,
    LoadStatus,
)

__all__ = ["CoordinatorPartition", "CoordinatorRuntime", "CoordinatorShard", "LoadStatus"]
