"""Sluice: a transactional, Kafka-style log broker for Kubernetes.

Clients start at :mod:`sluice.client` (Producer, Consumer, Admin); errors are in
:mod:`sluice.errors`; the embedded cluster for tests is :mod:`sluice.testing`.
"""

__version__ = "0.1.0"
