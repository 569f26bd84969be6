"""Certificates reloaded without a restart: the broker follows its TLS files while it runs.

Certificates are renewed and the cluster CA rotated with an overlap (sluice.cert_rotation): the
operator rewrites the broker Secret (Kubernetes swaps a mounted Secret's files atomically,
through the ``..data`` symlink), a LocalCluster rewrites the data directory. A restart to pick
them up would cost every leadership and every client connection of the broker each time, and a
rotation in three phases would be three rolling restarts. So:

* :class:`TlsFiles` watches the files (``ca.crt``, the certificate and key, the clients CA)
  by their stat (inode, size, mtime: a symlink swap changes the inode) and reloads them when
  they change. A reload that finds them inconsistent (unreadable, a key that is not the
  certificate's: a directory caught half-written) keeps the loaded material and tries again
  on the next check.
* The listeners are built with gRPC's dynamic server credentials: gRPC asks a fetcher on
  every new handshake, which answers the new certificate and trust bundle once after each
  reload (None otherwise: keep the current one). Connections already open keep the
  credentials they were made with, as TLS does everywhere; every new one uses the new.
* Client channels to other brokers are replaced when the version changes
  (sluice.broker.channels), so this broker presents its new certificate and trusts the new bundle.
  The listeners and both channel sets (the replica manager's, the transaction coordinator's)
  share one :class:`TlsFiles` per directory and broker (:func:`files_for`), so they all see one
  version, and one task of the broker (``check`` every :data:`CHECK_INTERVAL_S`) reloads it.
* After every load, the broker writes what it loaded into its ``brokers/<id>`` document
  (fingerprints of the trusted CAs and of its certificate): the operator moves a CA rotation
  to its next phase only when every live broker reports the previous one.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, replace

import grpc

from sluice import tls
from sluice.broker.config import BrokerConfig
from sluice.metadata import documents, keys
from sluice.metadata.documents import BrokerDocument
from sluice.metadata.store import MetadataStore

log = logging.getLogger("sluice.broker.tls")

CHECK_INTERVAL_S = 1.0

Stamp = tuple[tuple[int, int, int] | None, ...]


@dataclass(frozen=True)
class Loaded:
    """One consistent load: the material, the clients CA (mtls), and a version that grows with each load."""

    version: int
    material: tls.TlsMaterial
    clients_ca_pem: bytes


def _stat(path: str) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path)  # follows the symlinks of a mounted Secret: a swap changes the inode
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


class TlsFiles:
    """The broker's TLS material, reloaded when its files change (see the module docstring)."""

    def __init__(self, config: BrokerConfig) -> None:
        self.tls_dir = config.tls_dir
        self.broker_id = config.broker_id
        self.clients_ca = config.clients_ca
        self._stamp = self._files_stamp()
        self.loaded = Loaded(1, *self._load())  # TlsError at start: a broker without its material stops
        self._listeners: list[Callable[[], None]] = []

    def _paths(self) -> list[str]:
        files = [str(p) for p in tls.material_files(self.tls_dir, self.broker_id)]
        return files + ([self.clients_ca] if self.clients_ca else [])

    def _files_stamp(self) -> Stamp:
        return tuple(_stat(p) for p in self._paths())

    def _load(self) -> tuple[tls.TlsMaterial, bytes]:
        material = tls.load_dir(self.tls_dir, self.broker_id)
        clients_ca = b""
        if self.clients_ca:
            try:
                with open(self.clients_ca, "rb") as f:
                    clients_ca = f.read()
            except OSError as exc:
                raise tls.TlsError(f"cannot read --clients-ca {self.clients_ca}: {exc.strerror or exc}") from None
        return material, clients_ca

    @property
    def material(self) -> tls.TlsMaterial:
        return self.loaded.material

    def on_change(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` after every reload that changed the material."""
        self._listeners.append(listener)

    def check(self) -> bool:
        """Reload if the files changed; True when new material was loaded."""
        stamp = self._files_stamp()
        if stamp == self._stamp:
            return False
        try:
            material, clients_ca = self._load()
        except tls.TlsError as exc:
            log.warning("TLS files changed but cannot be loaded yet (keeping the current ones): %s", exc)
            return False  # the stamp is kept: checked again next time
        self._stamp = stamp
        old = self.loaded
        if material == old.material and clients_ca == old.clients_ca_pem:
            return False
        self.loaded = Loaded(old.version + 1, material, clients_ca)  # one assignment: gRPC threads read it
        log.info(
            "TLS material reloaded (version %d): certificate %s, trusted CAs %s",
            self.loaded.version, tls.fingerprint(material.cert_pem)[:16],
            [fp[:16] for fp in tls.bundle_fingerprints(material.ca_pem)],
        )  # fmt: skip
        for listener in self._listeners:
            try:
                listener()
            except Exception:
                log.exception("a TLS reload listener failed")
        return True

    # -- server credentials ------------------------------------------------------------------------

    def _dynamic(
        self, build: Callable[[Loaded], grpc.ServerCertificateConfiguration], require_client_auth: bool
    ) -> grpc.ServerCredentials:
        served = [self.loaded.version]

        def fetch() -> grpc.ServerCertificateConfiguration | None:
            # Called by gRPC (its own threads) before each new handshake: None keeps the current one.
            loaded = self.loaded
            if loaded.version == served[0]:
                return None
            served[0] = loaded.version
            return build(loaded)

        # gRPC documents None as "no change"; the type stubs only allow a configuration
        return grpc.dynamic_ssl_server_credentials(build(self.loaded), fetch, require_client_auth)  # type: ignore[arg-type]

    def interbroker_credentials(self) -> grpc.ServerCredentials:
        """The inter-broker listener: this broker's certificate; peers need one from the cluster CA bundle."""

        def build(loaded: Loaded) -> grpc.ServerCertificateConfiguration:
            m = loaded.material
            return grpc.ssl_server_certificate_configuration([(m.key_pem, m.cert_pem)], m.ca_pem)

        return self._dynamic(build, require_client_auth=True)

    def client_listener_credentials(self, mode: str) -> grpc.ServerCredentials:
        """The client listener: ``tls`` and ``token`` (this broker's certificate; on ``token`` the
        caller is authenticated by its ServiceAccount token, :mod:`sluice.broker.security.tokens`)
        or ``mtls`` (and a client certificate from the clients CA or the cluster CA, as
        :func:`sluice.broker.security.peers.client_listener_credentials` explains)."""

        def build(loaded: Loaded) -> grpc.ServerCertificateConfiguration:
            m = loaded.material
            roots = loaded.clients_ca_pem + m.ca_pem if mode == "mtls" else None
            return grpc.ssl_server_certificate_configuration([(m.key_pem, m.cert_pem)], roots)

        return self._dynamic(build, require_client_auth=mode == "mtls")

    # -- what the broker reports ---------------------------------------------------------------------

    def report(self, store: MetadataStore) -> None:
        """Write the loaded CAs' and certificate's fingerprints into this broker's ``brokers/<id>`` document
        (and the clients CAs' with an mtls listener: a clients CA rotation waits for them)."""
        loaded = self.loaded
        m = loaded.material
        trusted = tuple(tls.bundle_fingerprints(m.ca_pem))
        certificate = tls.fingerprint(m.cert_pem)
        clients = tuple(tls.bundle_fingerprints(loaded.clients_ca_pem)) if loaded.clients_ca_pem.strip() else ()
        wanted = (trusted, certificate, clients)

        def update(doc: BrokerDocument | None) -> BrokerDocument | None:
            if doc is None or (doc.tls_trusted, doc.tls_certificate, doc.tls_clients_trusted) == wanted:
                return None
            return replace(doc, tls_trusted=trusted, tls_certificate=certificate, tls_clients_trusted=clients)

        documents.update_document(store, keys.broker(self.broker_id), BrokerDocument, update)


_SHARED: dict[tuple[str, int, str], TlsFiles] = {}


def files_for(config: BrokerConfig) -> TlsFiles:
    """The process's one :class:`TlsFiles` for this broker's directory (made on first use)."""
    key = (config.tls_dir, config.broker_id, config.clients_ca)
    files = _SHARED.get(key)
    if files is None:
        files = _SHARED[key] = TlsFiles(config)
    return files
