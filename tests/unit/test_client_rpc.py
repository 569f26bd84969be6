"""The typed RPC descriptors of the client follow the Broker service of the proto."""

from __future__ import annotations

import pytest

from sluice.api.v1 import broker_pb2
from sluice.client._network import Cluster, Rpc
from sluice.client._network import rpc as rpcs
from sluice.errors import IllegalStateError


def _descriptors() -> dict[str, Rpc[object, object]]:
    return {name: value for name, value in vars(rpcs).items() if isinstance(value, Rpc)}


def test_every_broker_method_has_one_descriptor_with_its_types() -> None:
    service = broker_pb2.DESCRIPTOR.services_by_name["Broker"]
    typed = {d.name: d for d in _descriptors().values() if d.request_serializer is not None}
    assert sorted(typed) == sorted(m.name for m in service.methods)
    for method in service.methods:
        rpc = typed[method.name]
        assert rpc.path == f"/sluice.v1.Broker/{method.name}"
        request_type = getattr(broker_pb2, method.input_type.name)
        response_type = getattr(broker_pb2, method.output_type.name)
        request = request_type()
        assert rpc.request_serializer is not None
        assert rpc.request_serializer(request) == request.SerializeToString()
        assert isinstance(rpc.response_deserializer(b""), response_type)


def test_produce_serialized_sends_bytes_as_they_are() -> None:
    rpc = rpcs.PRODUCE_SERIALIZED
    assert rpc.path == rpcs.PRODUCE.path
    assert rpc.request_serializer is None
    assert isinstance(rpc.response_deserializer(b""), broker_pb2.ProduceResponse)


def test_callables_are_made_once_per_address_and_rpc_and_refused_after_close() -> None:
    cluster = Cluster("127.0.0.1:1")
    first = cluster._callable("127.0.0.1:1", rpcs.METADATA)
    assert cluster._callable("127.0.0.1:1", rpcs.METADATA) is first
    assert cluster._callable("127.0.0.1:1", rpcs.DESCRIBE_TOPICS) is not first
    cluster.close()
    with pytest.raises(IllegalStateError):
        cluster._callable("127.0.0.1:1", rpcs.METADATA)
