"""Settings every test process needs before anything imports gRPC.

The tests start broker and copier processes (fork + exec) from a process whose gRPC client
threads are busy. gRPC's fork handlers then abort the child now and then (SIGABRT in an abseil
mutex before exec); the children exec at once and need none of them, so they are switched off.
"""

import os

os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
