"""Registration of the operator's certificate management (:mod:`sluice.operator.certificates`).

On when ``SLUICE_BROKER_CERTS_SECRET`` names the brokers' Secret (the chart sets it unless
``certificates.managedBy`` is ``helm``). Not a Kopf resource handler: the Secrets it manages do
not exist before it creates them, and the work is one loop for the whole cluster, so it is a
thread started with the operator (after the runtime, whose store and controller it uses) and
stopped at clean-up. With ``SLUICE_CLIENTS_CA_CERT_SECRET`` (and ``SLUICE_CLIENTS_CA_SECRET``) it
owns the clients CA too, in the same loop. It acts only in the replica that holds the controller's Lease, and every
write is a compare-and-set on the Secret, so two replicas never fight.
"""

from __future__ import annotations

from typing import Any

import kopf

from sluice.operator.certificates import CertificateManager, SecretNames, SecretStore
from sluice.operator.handlers.runtime import runtime_of
from sluice.operator.settings import OperatorSettings


def register(registry: kopf.OperatorRegistry, settings: OperatorSettings) -> None:
    """Start and stop the certificate thread with the operator (nothing when it is off)."""
    if not settings.broker_certs_secret:
        return
    names = SecretNames(
        settings.ca_secret,
        settings.broker_certs_secret,
        settings.ca_cert_secret or "",
        clients_ca=(settings.clients_ca_secret or "") if settings.clients_ca_cert_secret else "",
        clients_ca_cert=settings.clients_ca_cert_secret or "",
        operator_client=settings.operator_client_secret or "",
    )

    def start(memo: kopf.Memo, **_: Any) -> None:
        runtime = runtime_of(memo)
        controller = runtime.controller
        if controller is None:
            raise kopf.TemporaryError("the controller is not running yet", delay=1)

        def on_done(what: str) -> None:
            involved = {"kind": "Secret", "apiVersion": "v1", "name": names.ca, "namespace": settings.namespace}
            controller.events.record(involved, "Certificates", what)

        manager = CertificateManager(
            SecretStore(controller.core, settings.namespace, names),
            runtime.meta,
            settings.cert_policy,
            expected_brokers=controller.expected,
            may_act=controller.leading.is_set,
            on_done=on_done,
            interval_s=settings.cert_interval_s,
        )
        manager.start()
        memo.certificates = manager

    def stop(memo: kopf.Memo, **_: Any) -> None:
        manager = getattr(memo, "certificates", None)
        if isinstance(manager, CertificateManager):
            manager.stop()

    kopf.on.startup(registry=registry)(start)
    kopf.on.cleanup(registry=registry)(stop)
