"""The consumer, one module per part (the split aiokafka and Kafka's Java consumer make).

* :mod:`.consumer`: :class:`Consumer`, the public class; it ties the parts
  below together under one lock and decides when positions are looked up.
* :mod:`.subscription_state`: what the consumer reads: the subscription or
  manual assignment, and per assigned partition its position, pause flag and
  retry time; the assignment the group handed over, pending until ``poll()``.
* :mod:`.fetcher`: Fetch requests to partition leaders, the buffer of fetched
  records, and ListOffsets lookups (earliest, latest, by timestamp).
* :mod:`.coordinator`: the client side of the group coordinator: membership
  (the heartbeat thread, KIP-848 shape) and committed offsets (OffsetFetch,
  OffsetCommit).
"""

from sluice.client.consumer.consumer import Consumer

__all__ = ["Consumer"]
