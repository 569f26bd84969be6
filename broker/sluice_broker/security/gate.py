"""The request gate: the per-request policy both protocols apply, built once per broker.

Sluice serves two protocols over one core, and a principal is one principal whichever it uses:
its ACLs, its producer-id rate and its byte-rate quotas are counted once per broker, as Kafka
counts them across its listeners. So the policy lives here, in one object the broker builds at
start-up (:func:`build_gate`) and hands to both adapters: the gRPC servicers
(:mod:`sluice.broker.servicers`) and the Kafka listener (:mod:`sluice.broker.kafka`). Each adapter
decodes its request, asks the gate, calls the core with what was allowed and encodes the
answer; neither holds a rule of its own.

What the gate decides:

* **authorization**: :attr:`RequestGate.access` (one ACL set followed from the metadata store),
  and :meth:`RequestGate.denied_topics`, Kafka's partial denial: the topics refused are
  answered TOPIC_AUTHORIZATION_FAILED with
  :func:`~sluice.broker.security.authorizer.topic_refusal`'s words, the rest is served.
  The coordinators' checks, which need the request's shape, are
  :mod:`sluice.broker.security.coordinator_checks`, over the same ``access``;
* **the producer-id rate** (``producer.id.rate.per.principal.per.minute``):
  :meth:`RequestGate.take_producer_id`;
* **byte-rate quotas** (``quota.producer.default``, ``quota.consumer.default`` and the client
  quota entities): :attr:`RequestGate.produce` and :attr:`RequestGate.fetch` count the bytes and
  give the throttle time; :meth:`RequestGate.hold_while_over` holds a request of a caller that
  did not wait out its last throttle time (how each protocol makes the client wait differs:
  gRPC holds the call, the Kafka listener mutes the connection, KIP-219);
* **FindCoordinator**: :meth:`RequestGate.find_coordinator`, the broker that coordinates a group
  or a transactional id (the adapter only turns the broker id into its own address).

Connection limits stay with each listener (:mod:`sluice.broker.security.connections`): they
count sockets, which only the transport sees.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Iterable
from dataclasses import dataclass

from sluice.acls import AclOperation
from sluice.api.v1 import broker_pb2 as bpb
from sluice.api.v1 import records_pb2 as pb
from sluice.broker.cluster import CONSUMER_OFFSETS_TOPIC, TRANSACTION_STATE_TOPIC, ClusterView, coordinator_partition
from sluice.broker.config import BrokerConfig
from sluice.broker.security import coordinator_checks as checks
from sluice.broker.security.authorizer import Access, Refusal, Who
from sluice.broker.security.limits import KEY as PRODUCER_ID_RATE_KEY
from sluice.broker.security.limits import ByteRateQuota, RateLimit
from sluice.broker.security.peers import ClusterIdentity
from sluice.broker.security.quota_watch import ClientQuotas
from sluice.broker.security.reload import files_for
from sluice.metadata.store import MetadataStore

log = logging.getLogger(__name__)

HELD_LOG_EVERY_S = 60.0  # a held-back request is logged at most this often per principal
HELD_LOG_MAX_PRINCIPALS = 10_000
COORDINATOR_TOPICS = {bpb.GROUP: CONSUMER_OFFSETS_TOPIC, bpb.TRANSACTION: TRANSACTION_STATE_TOPIC}


@dataclass(frozen=True, slots=True)
class Coordinator:
    """FindCoordinator's answer for one key: the coordinating broker, or why there is none."""

    broker_id: int = -1
    refusal: Refusal | None = None


def build_gate(config: BrokerConfig, store: MetadataStore) -> RequestGate:
    """The broker's gate: its ACLs and quota entities followed from ``store``; the brokers of the
    cluster (certificates of the cluster CA, when the broker has TLS material) are super users."""
    files = files_for(config) if config.tls_dir else None
    identity = ClusterIdentity(None if files is None else lambda: files.material.ca_pem)
    return RequestGate(config, Access(config, store, identity), ClientQuotas(store))


class RequestGate:
    """The policy of one broker, shared by its gRPC servicers and its Kafka listener."""

    def __init__(self, config: BrokerConfig, access: Access, client_quotas: ClientQuotas) -> None:
        self.access = access
        self.client_quotas = client_quotas  # the quota entities (users, client ids), followed from the store
        self.producer_ids = RateLimit(config.int(PRODUCER_ID_RATE_KEY))
        self.produce = ByteRateQuota(
            "quota.producer.default",
            config.int("quota.producer.default"),
            rates=client_quotas.rates("producer_byte_rate"),
        )
        self.fetch = ByteRateQuota(
            "quota.consumer.default",
            config.int("quota.consumer.default"),
            rates=client_quotas.rates("consumer_byte_rate"),
        )
        self._held_logged: dict[str, float] = {}  # principal -> when a held-back request was last logged

    def refresh(self) -> None:
        """Re-read the ACLs and the client quota entities (the metadata watch calls this)."""
        self.access.refresh()
        self.client_quotas.refresh()

    # -- authorization ----------------------------------------------------------------------------

    def denied_topics(self, who: Who, op: AclOperation, names: Iterable[str]) -> set[str]:
        return self.access.denied_topics(who, op, names)

    # -- the producer-id rate ---------------------------------------------------------------------

    def take_producer_id(self, who: str, producer_id: int) -> Refusal | None:
        """Count an InitProducerId for principal ``who``; a refusal when it asks a new id beyond its rate.

        Only a new producer id (``producer_id`` < 0) counts: re-initialising one's own id
        (KIP-360) creates no producer state anywhere.
        """
        if producer_id >= 0 or self.producer_ids.take(who):
            return None
        return Refusal(
            pb.THROTTLING_QUOTA_EXCEEDED,
            self.producer_ids.refusal(who),
            math.ceil(60_000 / self.producer_ids.per_minute),  # one token's refill time
        )

    # -- byte-rate quotas -------------------------------------------------------------------------

    async def hold_while_over(self, quota: ByteRateQuota, who: str, client: str, what: str) -> None:
        """Hold a request of a caller still over ``quota`` until it is not (Kafka's muted channel,
        for clients that do not wait out the throttle time they were told, KIP-219)."""
        delay = quota.delay(who, client)
        if delay <= 0:
            return
        now = time.monotonic()
        if now - self._held_logged.get(who, -HELD_LOG_EVERY_S) >= HELD_LOG_EVERY_S:  # once a minute per principal
            if len(self._held_logged) >= HELD_LOG_MAX_PRINCIPALS:  # bounded, whatever the number of principals
                self._held_logged.clear()
            self._held_logged[who] = now
            log.info(
                "held a %s of %s back %.0f ms: its client did not wait out its throttle time (%s)",
                what, who, delay * 1000, quota.key,
            )  # fmt: skip
        await asyncio.sleep(delay)

    # -- FindCoordinator --------------------------------------------------------------------------

    def find_coordinator(self, cluster: ClusterView, who: Who, key: str, key_type: bpb.CoordinatorType) -> Coordinator:
        """The broker coordinating ``key`` (a group id or a transactional id), as Kafka finds it:
        the key's hash picks a partition of the internal topic, and that partition's leader
        coordinates. Describe on the key is needed (GROUP_/TRANSACTIONAL_ID_AUTHORIZATION_FAILED);
        no such topic or no leader is COORDINATOR_NOT_AVAILABLE (retriable: the client asks again).
        """
        if not key:
            return Coordinator(refusal=Refusal(pb.INVALID_REQUEST, "the key (group id or transactional id) is empty"))
        refused = checks.check_find_coordinator(self.access, who, key, key_type == bpb.TRANSACTION)
        if refused is not None:
            return Coordinator(refusal=refused)
        topic = COORDINATOR_TOPICS[key_type]
        info = cluster.topics.get(topic)
        if info is None:
            return Coordinator(refusal=Refusal(pb.COORDINATOR_NOT_AVAILABLE, cluster.internal_topic_missing(topic)))
        leader = info.partitions[coordinator_partition(key, len(info.partitions))].leader
        if leader < 0 or leader not in cluster.brokers:
            return Coordinator(
                refusal=Refusal(
                    pb.COORDINATOR_NOT_AVAILABLE, f"the coordinator partition of {key!r} has no live leader"
                )
            )
        return Coordinator(broker_id=leader)
