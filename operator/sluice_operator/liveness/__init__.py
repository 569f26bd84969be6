"""Which brokers are alive, the input of every failover decision.

``brokers``  gRPC health checks with a failure timeout (the embedded cluster)
``pods``     broker Pods' readiness with a grace period (Kubernetes)
"""
