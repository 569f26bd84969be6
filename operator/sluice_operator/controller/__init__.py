"""The controller: leader election, placement, preferred leaders, ISR fencing of dead brokers.

``decisions``   pure functions over topic documents: what the controller decides (no I/O)
``loop``        ControllerLoop: one round of liveness and decisions over a MetadataStore
``local``       the embedded cluster's controller process: the loop with gRPC health checks
``kubernetes``  the controller in Kubernetes: the loop with broker Pods, a Lease, status projection, Events
"""
