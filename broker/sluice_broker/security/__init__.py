"""Who may call what: the broker's TLS material, peer identities and the inter-broker door.

``peers``    who is calling: the principal of a gRPC call from its TLS auth context, and the
             check every inter-broker RPC passes before anything is decoded or changed

The design (docs/security.md): inter-broker RPCs (WriteTxnMarkers, ReplicaFetch,
OffsetsForLeaderEpoch) are registered with real handlers only on the inter-broker listener,
which is TLS with client certificates verified against the cluster CA (Kafka's
inter.broker.listener). The client listener answers them PERMISSION_DENIED without looking at
the request. Decisions live here; the servicers only call them. The certificates themselves
(generation, files, loading) are :mod:`sluice.tls`, shared with LocalCluster and the operator.
"""
