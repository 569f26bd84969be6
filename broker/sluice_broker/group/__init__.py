"""The group coordinator (DESIGN section 5): consumer offsets and membership.

``offsets``     committed and pending offsets, and their ``__consumer_offsets`` records (pure)
``assignor``    balanced, sticky, deterministic server-side assignment (pure)
``membership``  members, epochs, sessions and hand-over, KIP-848 shaped (pure, clock injected)
``group_records`` membership as records of ``__consumer_offsets``, and their reload (pure)
``coordinator`` orchestration: leadership, loading, appends, the RPCs the servicer calls
``classic``     Kafka's classic protocol (JoinGroup/SyncGroup) for the Kafka listener: the state machine (pure)
``classic_coordinator`` its parked requests, writes and expiry
``classic_records`` classic groups as Kafka's GroupMetadataValue records of ``__consumer_offsets`` (pure)
``consumer_protocol`` what a classic group's members subscribe to and were assigned (Kafka's bytes, pure)
``admin``       group administration (list, describe, delete) for both protocols' adapters
"""

from sluice.broker.group.coordinator import GroupCoordinator

__all__ = ["GroupCoordinator"]
