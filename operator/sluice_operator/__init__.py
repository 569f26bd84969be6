"""Controller logic and the Kopf operator (imported as ``sluice.operator``).

* :mod:`~sluice.operator.settings`: every operator setting in one typed place, read once at start-up.
* :mod:`~sluice.operator.controller`: the controller: pure decisions (leader election from the
  ISR, fencing dead brokers out of ISRs, preferred-leader restoration, topic documents for
  creation and partition addition), the controller loop that applies them over the
  MetadataStore, the embedded cluster's controller process
  (``python -m sluice.operator.controller.local --metadata PATH``) and the controller in
  Kubernetes. Replica placement itself is :mod:`sluice.metadata.placement`, shared with the broker.
* :mod:`~sluice.operator.liveness`: broker liveness from gRPC health checks (the embedded
  cluster) or from broker Pods (Kubernetes).
* :mod:`~sluice.operator.handlers`: the Kopf handlers, one thin module per kind;
  :mod:`~sluice.operator.kopf_app` is the module ``kopf run -m`` takes, :mod:`~sluice.operator.main`
  is ``sluice operator``.
* :mod:`~sluice.operator.resources`: statuses and conditions of the custom resources, as pure functions.

Never a top-level package named ``operator``: it would shadow the standard
library. The broker and the operator never import each other.
"""
