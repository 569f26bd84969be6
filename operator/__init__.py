"""Controller logic and the Kopf operator (imported as ``sluice.operator``).

Replica placement, leader election and the Kubernetes handlers arrive with the
replication and Kubernetes work; until then the single broker places its own
partitions (sluice.broker.cluster). Never a top-level package named
``operator``: it would shadow the standard library.
"""
