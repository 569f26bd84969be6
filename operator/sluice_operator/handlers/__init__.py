"""The Kopf handlers, one thin module per kind, registered with the operator's settings.

``topics``             Topic -> a real topic (CreateTopics/CreatePartitions through the brokers)
``coordinators``       Coordinator -> its internal topic
``transactional_ids``  TransactionalId -> a ``transactional_ids/<id>`` document; status, fence/abort
``users``              SluiceUser -> its principal's ACLs (owned ``acls/`` documents), a client certificate
``rebalance``          SluiceRebalance -> a proposal, approved, executed as partition reassignments
``lifecycle``          start-up (Kopf settings, the runtime into ``memo``), clean-up, the probe
``runtime``            what the handlers share: settings, store, admin client, controller
``status``             conditions, the pause annotation, reasons
``certificates``       the cluster CA and broker certificates in Secrets (a thread, when on)

Handlers are registered by :func:`register` rather than by decorators at
import: a timer's interval is fixed when it is registered, and it comes from
the :class:`~sluice.operator.settings.OperatorSettings` read at start-up, so
importing a handler module depends on nothing in the environment.
``sluice operator`` (:mod:`sluice.operator.main`) and ``kopf run -m
sluice.operator.kopf_app`` both register into Kopf's default registry, which
also holds Kopf's own login handlers.

Every handler is idempotent and re-reads what it needs, so the timers are
also the retry: a topic that could not be created because no broker was up
yet is created on the next tick. The annotation ``sluice.dev/paused: "true"``
stops all changes to a resource (Paused=True); statuses are still kept up to
date, and deleting a paused resource releases it without touching the brokers.
"""

from __future__ import annotations

import kopf

from sluice.operator.handlers import (
    certificates,
    coordinators,
    lifecycle,
    rebalance,
    topics,
    transactional_ids,
    users,
)
from sluice.operator.settings import OperatorSettings

__all__ = ["register"]


def register(registry: kopf.OperatorRegistry, settings: OperatorSettings) -> None:
    """Register every handler of the operator into ``registry``."""
    lifecycle.register(registry, settings)
    topics.register(registry, settings)
    coordinators.register(registry, settings)
    transactional_ids.register(registry, settings)
    certificates.register(registry, settings)
    users.register(registry, settings)
    rebalance.register(registry, settings)
