"""The controller: leader election, placement, preferred leaders, ISR fencing of dead brokers.

``decisions``   pure functions over topic documents: what the controller decides (no I/O)
``local``       the embedded cluster's controller process, driven by gRPC health checks
``kubernetes``  the controller in Kubernetes: broker Pods, a Lease, status projection, Events
"""
