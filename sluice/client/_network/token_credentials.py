"""A bearer token from a file, sent with every call: how a client authenticates to a token listener.

On Kubernetes a pod's ServiceAccount token is a file the kubelet keeps current (a projected
volume: the token is re-issued well before it expires and the file is swapped atomically). A
client given ``sasl_oauthbearer_token_file`` sends that token as ``authorization: Bearer
<token>`` gRPC metadata on every call, over TLS only, and the broker checks it with the API
server (sluice.broker.security.tokens). The file is read when the client is made (a missing or
empty file is a ValueError naming it) and again whenever it changes (its inode, size or
modification time), so a long-running producer follows the kubelet's rotations without a
restart. gRPC calls the plugin on its own threads, hence the lock.

The option's name follows Kafka's clients (``security.protocol=SASL_SSL``,
``sasl.mechanism=OAUTHBEARER``), whose OAUTHBEARER tokens are also bearer JWTs; Kafka reads them
from an endpoint or a callback, Sluice from the file Kubernetes maintains.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import grpc


class TokenFile:
    """The token in ``path``, re-read when the file changes."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._stamp: tuple[int, int, int] | None = None
        self._token = ""
        self.token()  # fail now, naming the file, rather than at the first call

    def _read(self) -> tuple[tuple[int, int, int], str]:
        try:
            st = os.stat(self.path)
            text = Path(self.path).read_text().strip()
        except OSError as exc:
            reason = exc.strerror or exc
            raise ValueError(f"sasl_oauthbearer_token_file {self.path!r} cannot be read: {reason}") from None
        if not text:
            raise ValueError(f"sasl_oauthbearer_token_file {self.path!r} is empty")
        return (st.st_ino, st.st_size, st.st_mtime_ns), text

    def token(self) -> str:
        """The current token (the file is read again only when it changed)."""
        with self._lock:
            try:
                st = os.stat(self.path)
                stamp = (st.st_ino, st.st_size, st.st_mtime_ns)
            except OSError:
                stamp = None
            if stamp is None or stamp != self._stamp:
                self._stamp, self._token = self._read()
            return self._token

    def call_credentials(self) -> grpc.CallCredentials:
        return grpc.metadata_call_credentials(_BearerPlugin(self), name="sluice-token-file")


class _BearerPlugin(grpc.AuthMetadataPlugin):
    def __init__(self, source: TokenFile) -> None:
        self.source = source

    def __call__(self, context: grpc.AuthMetadataContext, callback: grpc.AuthMetadataPluginCallback) -> None:
        try:
            token = self.source.token()
        except ValueError as exc:
            callback((), exc)  # the call fails with the file's problem as its message
            return
        callback((("authorization", f"Bearer {token}"),), None)
