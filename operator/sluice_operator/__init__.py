"""Controller logic and the Kopf operator (imported as ``sluice.operator``).

* :mod:`~sluice.operator.controller.decisions`: the decisions (leader election from the
  ISR, fencing dead brokers out of ISRs, preferred-leader restoration, topic
  documents for creation and partition addition) as pure functions over
  topic documents. Both the embedded cluster and the Kubernetes operator
  call them; replica placement itself is :mod:`sluice.metadata.placement`,
  shared with the broker.
* :mod:`~sluice.operator.liveness.brokers`: broker liveness from gRPC health
  checks with a timeout.
* :mod:`~sluice.operator.controller.local`: the embedded cluster's controller
  process (``python -m sluice.operator.controller.local --metadata PATH``).

Never a top-level package named ``operator``: it would shadow the standard
library. The broker and the operator never import each other.
"""
