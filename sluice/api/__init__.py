"""Generated protobuf and gRPC code for the wire API in proto/sluice/v1.

Never edit files under this package: change proto/ and run
``python scripts/gen_proto.py``. CI checks that regenerating changes nothing.
"""
