"""The broker's gRPC services: thin, they check a request can be understood and hand it to the core.

``registration``  the plumbing every service shares: requests decoded by hand (undecodable bytes
                  answer INVALID_ARGUMENT), handlers shielded from cancellation, unexpected
                  failures answered INTERNAL and logged
``broker``        sluice.v1.Broker: what clients call (metadata, produce/fetch, topic admin,
                  the transaction and group coordinators)
``interbroker``   sluice.v1.InterBroker: what brokers call on each other (replica fetch,
                  leader epochs, transaction markers)

No servicer holds state or decides anything: the replica manager, the cluster view and the two
coordinators do. A refusal is a :mod:`sluice.errors` class answered as its Kafka code
(:mod:`sluice.broker.errors`).
"""

from sluice.broker.servicers.broker import BrokerService
from sluice.broker.servicers.interbroker import InterBrokerService

__all__ = ["BrokerService", "InterBrokerService"]
